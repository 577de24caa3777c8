"""``molmoact2 device-report``: complete over the fake, "not run" with why without it."""

from __future__ import annotations

import json

import pytest
from htp_helpers import ensure_contexts, fake_env

from molmoact2_ros.cli import main

HARDWARE = {"doctor platform", "doctor libcdsprpc.so", "doctor FastRPC devices"}


def test_report_over_the_fake_is_complete(tiny_root, tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    out = tmp_path / "report.md"
    code = main(["device-report", str(tiny_root / "lp_vtp_sd"), "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    text = out.read_text()
    from molmoact2_ros.device_report import failed

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
                                                             monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    out = tmp_path / "report.md"
    assert main(["device-report", str(tiny_root / "grid_sampler"), "--out", str(out)]) == 1
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
    assert "bundle root" in capsys.readouterr().err
    assert main(["device-report", str(tmp_path), "--out", str(tmp_path / "r.md")]) == 2
    assert "holds no bundle" in capsys.readouterr().err
