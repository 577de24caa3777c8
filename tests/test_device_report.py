"""``molmoact2 device-report``: complete over the fake, "not run" with why without it."""

from __future__ import annotations

import json

import pytest
from htp_helpers import ensure_contexts, fake_env

from molmoact2_ros.cli.app import main

HARDWARE = {"doctor platform", "doctor libcdsprpc.so", "doctor FastRPC devices"}


def test_report_over_the_fake_is_complete(tiny_root, tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    out = tmp_path / "report.md"
    code = main(["device-report", str(tiny_root / "lp_vtp_sd"), "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    text = out.read_text()
    from molmoact2_ros.cli.device_report import failed

    assert set(failed(report)) <= HARDWARE  # only what needs the board itself
    assert code == (1 if failed(report) else 0)
    assert "qai_appbuilder: test fake" in report["platform"]["qai_appbuilder"]
    assert {"os", "glibc", "kernel", "qnn_runtime", "wheel_glibc"} <= set(report["platform"])
    assert [s["suffix"] for s in report["sections"]] == ["(fp16)", "_w4a16"]
    for section in report["sections"]:
        assert section["load"]["npu_sessions"] == 7
        assert all(w["load_s"] > 0 and w["peak_rss_mib"] > 0
                   for w in section["load"]["workers"].values())
        for key in ("component_parity", "e2e_parity"):
            assert section[key]["status"] == "PASS" and section[key]["rows"]
        ms = section["latency"]["ms"]
        assert {"vision", "llm_split0", "action_context", "action_step", "chunk"} <= set(ms)
        assert all(v["n"] >= 20 and v["p95"] >= v["p50"] > 0 for v in ms.values())
    quantized = report["sections"][1]["load"]["workers"]
    assert quantized["action"]["fixed_point"]["action_context"] == []  # stays fp16
    assert quantized["action"]["fixed_point"]["action_step"]
    assert "## lp_vtp_sd _w4a16" in text and "| component | mean | p50 | p95 |" in text
    assert "Replay against a golden chunk bag: not run" in text


def test_report_without_qai_appbuilder_says_what_was_not_run(tiny_root, tmp_path,
                                                             monkeypatch, capsys):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    out = tmp_path / "report.md"
    assert main(["device-report", str(tiny_root / "grid_sampler"), "--out", str(out)]) == 1
    steps = [line.rsplit(" (", 1)[0] for line in capsys.readouterr().err.splitlines()
             if line.startswith("device-report [")]  # one status line per step on a pipe
    assert steps == ["device-report [1/3] machine checks",
                     "device-report [2/3] grid_sampler (fp16): load, parity, latency",
                     "device-report [3/3] grid_sampler _w4a16: load, parity, latency"]
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["platform"]["qai_appbuilder"].startswith("not importable")
    for section in report["sections"]:
        for key in ("load", "component_parity", "e2e_parity", "latency"):
            assert section[key]["status"] == "not run"
            assert "qai_appbuilder is not importable here" in section[key]["why"]
    assert "- load: **not run** qai_appbuilder is not importable here" in out.read_text()


def test_bad_root_is_bad_input(tmp_path, capsys):
    assert main(["device-report", str(tmp_path / "nothing"), "--out",
                 str(tmp_path / "r.md")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["device-report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.md")]) == 2
    assert "holds no bundle" in capsys.readouterr().err
    # the report never goes inside an input (here: the bundle root)
    assert main(["device-report", str(tmp_path), "--out", str(tmp_path / "r.md")]) == 2
    assert "lies inside the input bundle root" in capsys.readouterr().err
    assert not (tmp_path / "r.md").exists()


def test_report_replays_a_robot_bag_against_a_workstation_golden(tiny_root, tmp_path,
                                                                  monkeypatch, capsys):
    """The cross-machine check in the report: an ONNX golden chunk bag, the bag replayed on
    the HTP worker code (the fake underneath); a golden made with the cameras swapped fails."""
    pytest.importorskip("rosbags")
    from replay_helpers import obs_bag, run_cli, trace

    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 3)
    swapped = obs_bag(tmp_path / "obs_swapped", tr, 3, swap=True)
    goldens = {}
    for name, source in (("same", bag), ("other", swapped)):
        goldens[name] = tmp_path / f"golden_{name}"
        rc, out, err = run_cli(["replay", source, "--bundle-root", tiny_root, "--variant",
                                "lp_vtp_sd", "--instruction", str(tr["instruction"]), "--seed", "7",
                                "--backend", "onnx", "--record", goldens[name],
                                "--no-progress"], capsys)
        assert rc == 0, out + err
    out = tmp_path / "report.md"
    main(["device-report", str(tiny_root / "lp_vtp_sd"), "--out", str(out), "--bag", str(bag),
          "--golden", str(goldens["same"])])
    report = json.loads(out.with_suffix(".json").read_text())
    replay = report["replay"]
    assert replay["status"] == "PASS", replay
    assert replay["summary"]["compared"] == 3 and replay["summary"]["passed"] == 3
    assert "## Replay against a golden chunk bag" in out.read_text()
    main(["device-report", str(tiny_root / "lp_vtp_sd"), "--out", str(out), "--bag", str(bag),
          "--golden", str(goldens["other"])])
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["replay"]["status"] == "FAIL"
    from molmoact2_ros.cli.device_report import failed

    assert "replay against the golden chunk bag" in failed(report)
