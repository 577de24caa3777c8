"""``molmoact2 device-report``: complete over the fake, "not run" with why without it, a
report on disk whatever fails, never an overwrite without --force, and the suffix A/B table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from htp_helpers import ensure_contexts, fake_env

from molmoact2_ros.cli.app import main
from molmoact2_ros.firstrun.report import STEPS, failed

HARDWARE = {"doctor platform", "doctor libcdsprpc.so", "doctor FastRPC devices"}
QUANT = "_w4a16"


def _report(out: Path) -> dict:
    return json.loads(out.with_name(out.name + ".json").read_text())


def _run(args: list, out: Path) -> tuple[int, dict]:
    code = main(["device-report", *map(str, args), "--out", str(out)])
    return code, _report(out)


def test_report_over_the_fake_is_complete_with_the_suffix_ab_table(tiny_root, tmp_path,
                                                                   monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    out = tmp_path / "report.md"
    code, report = _run([tiny_root / "lp_vtp_sd"], out)
    text = out.read_text()
    assert set(failed(report)) <= HARDWARE  # only what needs the board itself
    assert code == (1 if failed(report) else 0)
    assert "qai_appbuilder: test fake" in report["platform"]["qai_appbuilder"]
    assert {"os", "glibc", "kernel", "qnn_runtime", "wheel_glibc"} <= set(report["platform"])
    assert report["progress"] == "complete"
    choices = ["fp16", f"vision={QUANT}", f"llm={QUANT}", f"action={QUANT}", f"all={QUANT}"]
    assert [s["choice"] for s in report["sections"]] == choices
    for section in report["sections"]:
        load = section["load"]
        assert load["npu_sessions"] == 7 and load["perf_profile"] == "BURST"
        assert load["load_order"] == "parallel"
        assert all(w["load_s"] > 0 and w["peak_rss_mib"] > 0 for w in load["workers"].values())
        for key in ("component_parity", "e2e_parity"):
            assert section[key]["status"] == "PASS" and section[key]["rows"]
        assert section["seed_e2e"]["status"] == "not run"  # the tiny bundles have no seed files
        ms = section["latency"]["ms"]
        assert {"vision", "llm_split0", "action_context", "action_step", "chunk"} <= set(ms)
        assert all(v["n"] >= 20 and v["p95"] >= v["p50"] > 0 for v in ms.values())
        calls = section["latency"]["calls"]
        assert set(calls) == {"vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3",
                              "action_context", "action_step"}
        for row in calls.values():  # the library's execute time, apart from the copies
            assert 0 < row["npu_execute_ms"] <= row["library_ms"] <= row["worker_ms"]
    by_choice = {s["choice"]: s for s in report["sections"]}
    vision_q = by_choice[f"vision={QUANT}"]
    assert vision_q["suffixes"] == {"vision": QUANT, "llm": "", "action": ""}
    assert vision_q["component_parity"]["limits"]["vision"] < 0.9999  # a quantised limit
    assert vision_q["component_parity"]["limits"]["llm_split0"] == 0.9999
    quantized = by_choice[f"all={QUANT}"]["load"]["workers"]
    assert quantized["action"]["fixed_point"]["action_context"] == []  # stays fp16
    assert quantized["action"]["fixed_point"]["action_step"]
    q_calls = by_choice[f"all={QUANT}"]["latency"]["calls"]
    assert q_calls["action_step"]["float_elements"] > 0
    assert q_calls["action_step"]["float_conversion_ms"] > 0
    assert q_calls["action_context"]["float_elements"] == 0
    assert by_choice["fp16"]["latency"]["calls"]["vision"]["float_elements"] == 0
    table = report["ab"]["lp_vtp_sd"]
    assert [r["choice"] for r in table] == choices
    assert sum(r["fastest_passing"] for r in table) == 1
    fastest = next(r for r in table if r["fastest_passing"])
    assert fastest["parity"] == "PASS"
    assert fastest["chunk_p50_ms"] == min(r["chunk_p50_ms"] for r in table
                                          if r["parity"] == "PASS")
    assert "## lp_vtp_sd: suffix A/B" in text and "**fastest passing**" in text
    assert "| session | calls | in worker | in library | NPU execute |" in text
    assert "Replay against a golden chunk bag: not run" in text
    err = capsys.readouterr().err
    assert err.count("device-report [") == 2 * len(choices)  # a line as each starts and ends


def test_report_without_qai_appbuilder_says_what_was_not_run(tiny_root, tmp_path,
                                                             monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    out = tmp_path / "report.md"
    code, report = _run([tiny_root / "grid_sampler"], out)
    assert code == 1
    assert report["platform"]["qai_appbuilder"].startswith("not importable")
    for section in report["sections"]:
        for key in STEPS:
            assert section[key]["status"] == "not run"
            assert "qai_appbuilder is not importable here" in section[key]["why"]
    assert "- load: **not run** qai_appbuilder is not importable here" in out.read_text()


def test_out_is_never_overwritten_without_force(tiny_root, tmp_path, monkeypatch, capsys):
    """The JSON twin is OUT.json (no suffix swap), nothing is replaced without --force, and a
    bad --out is refused before anything runs."""
    monkeypatch.delenv("PYTHONPATH", raising=False)  # sections "not run": fast
    bundle = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", bundle, ignore=shutil.ignore_patterns("onnx"))
    manifest = (bundle / "bundle.json").read_bytes()
    inside = bundle / "bundle.md"  # once replaced that bundle's bundle.json
    assert main(["device-report", str(bundle), "--out", str(inside), "--force"]) == 2
    assert "lies inside the input bundle root" in capsys.readouterr().err
    assert not inside.exists() and not (bundle / "bundle.md.json").exists()
    assert (bundle / "bundle.json").read_bytes() == manifest
    out = tmp_path / "report.md"
    assert main(["device-report", str(bundle), "--out", str(out)]) == 1
    assert (tmp_path / "report.md.json").is_file()
    before = out.read_text()
    assert main(["device-report", str(bundle), "--out", str(out)]) == 2
    assert "already exist; give another --out or --force" in capsys.readouterr().err
    assert out.read_text() == before
    twin_only = tmp_path / "r.md"
    (tmp_path / "r.md.json").write_text("{}")
    assert main(["device-report", str(bundle), "--out", str(twin_only)]) == 2
    assert not twin_only.exists() and (tmp_path / "r.md.json").read_text() == "{}"
    assert main(["device-report", str(bundle), "--out", str(tmp_path / "rep.json")]) == 2
    assert "names the Markdown file" in capsys.readouterr().err
    assert main(["device-report", str(bundle), "--out", str(tmp_path / "no" / "r.md")]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err
    assert main(["device-report", str(bundle), "--out", str(out), "--force"]) == 1
    assert _report(out)["progress"] == "complete"


def test_a_bad_golden_is_refused_before_the_first_section(tiny_root, tmp_path, capsys):
    out = tmp_path / "r.md"
    bag = tmp_path / "bag"
    bag.mkdir()
    assert main(["device-report", str(tiny_root / "lp_vtp_sd"), "--out", str(out), "--bag",
                 str(bag), "--golden", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    assert not out.exists()


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


def test_an_interrupted_run_leaves_its_finished_sections_on_disk(tiny_root, tmp_path,
                                                                 monkeypatch):
    """Written before the first section and after each: a crash mid-run loses only the
    section that was running."""
    pytest.importorskip("onnxruntime")
    from molmoact2_ros.firstrun.report import ReportFiles, build_report

    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    out = tmp_path / "r.md"

    def progress(line: str) -> None:
        if line.startswith("[2/"):
            raise KeyboardInterrupt  # the operator's Ctrl-C, or the process dying

    with pytest.raises(KeyboardInterrupt):
        build_report(tiny_root / "lp_vtp_sd", choices="sets", files=ReportFiles(out, False),
                     progress=progress)
    report = _report(out)
    assert report["progress"] == "running" and len(report["sections"]) == 1
    assert report["sections"][0]["status"] == "PASS"
    assert all(report["sections"][0][k]["status"] in ("PASS", "not run") for k in STEPS)
    assert "(in progress: sections still running or interrupted)" in out.read_text()


def _copy(tiny_root: Path, tmp_path: Path, variant: str = "lp_vtp_sd") -> Path:
    dest = tmp_path / variant
    shutil.copytree(tiny_root / variant, dest, ignore=shutil.ignore_patterns("onnx"))
    return dest


@pytest.mark.parametrize("fault", ["segfault", "inference_error", "renamed_key",
                                   "wrong_seq_len"])
def test_a_failing_step_leaves_every_other_section_complete(tiny_root, tmp_path, monkeypatch,
                                                            fault):
    pytest.importorskip("onnxruntime")
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    bundle = tiny_root / "lp_vtp_sd"
    stem = "{}" + QUANT + "_socid77_archv73"
    if fault == "segfault":  # a real SIGSEGV of the worker, quantised vision only
        monkeypatch.setenv("FAKE_QAI_CRASH", stem.format("vision"))
    elif fault == "inference_error":  # Inference returns [] for quantised action_step
        monkeypatch.setenv("FAKE_QAI_FAIL_INFERENCE", stem.format("action_step"))
    elif fault == "renamed_key":
        bundle = _copy(tiny_root, tmp_path)
        path = bundle / "golden" / "vision_io.npz"
        with np.load(path, allow_pickle=False) as data:
            arrays = {("pixels" if k == "pixel_values" else k): data[k] for k in data.files}
        np.savez(path, **arrays)
    else:  # a golden of another sequence length (grid_sampler's S=128 for S=130)
        bundle = _copy(tiny_root, tmp_path)
        shutil.copy(tiny_root / "grid_sampler" / "golden" / "llm_split1_io.npz",
                    bundle / "golden" / "llm_split1_io.npz")
    out = tmp_path / "r.md"
    code, report = _run([bundle, "--choices", "sets"], out)
    assert code == 1 and report["progress"] == "complete"
    sections = {s["choice"]: s for s in report["sections"]}
    assert list(sections) == ["fp16", f"all={QUANT}"]
    assert all("error" not in s for s in sections.values())
    text = out.read_text()
    if fault in ("segfault", "inference_error"):
        component = "vision" if fault == "segfault" else "action_step"
        fp16, quant = sections["fp16"], sections[f"all={QUANT}"]
        assert all(fp16[k]["status"] in ("PASS", "not run") for k in STEPS)  # complete
        assert fp16["latency"]["status"] == "PASS"
        rows = quant["component_parity"]["rows"]
        bad = [r for r in rows if not r["passed"]]
        assert {r["stage"] for r in bad} == {component}
        assert len(rows) - len(bad) >= 10  # every other component still compared
        why = "SIGSEGV" if fault == "segfault" else "Inference returned no outputs"
        assert why in bad[0]["note"]
        assert quant["load"]["status"] == "PASS"
        assert f"lp_vtp_sd all={QUANT} component_parity" in failed(report)
        assert why in text
    else:
        component = "vision" if fault == "renamed_key" else "llm_split1"
        for section in sections.values():
            parity = section["component_parity"]
            bad = [r for r in parity["rows"] if not r["passed"]]
            assert {r["stage"] for r in bad} == {component}
            assert len(parity["rows"]) - len(bad) >= 10
            for key in ("load", "e2e_parity", "latency"):
                assert section[key]["status"] == "PASS", (key, section[key])
        note = sections["fp16"]["component_parity"]["errors"][component]
        if fault == "renamed_key":
            assert "lacks ['pixel_values'] needed for vision parity" in note
            assert "pixels[1, 2, 729, 588]" in note
        else:
            assert "hidden_states" in note and "128" in note


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
    _run([tiny_root / "lp_vtp_sd", "--choices", "sets", "--bag", bag, "--golden",
          goldens["same"]], out)
    replay = _report(out)["replay"]
    assert replay["status"] == "PASS", replay
    assert replay["summary"]["compared"] == 3 and replay["summary"]["passed"] == 3
    assert "## Replay against a golden chunk bag" in out.read_text()
    _run([tiny_root / "lp_vtp_sd", "--choices", "sets", "--bag", bag, "--golden",
          goldens["other"], "--force"], out)
    report = _report(out)
    assert report["replay"]["status"] == "FAIL"
    assert "replay against the golden chunk bag" in failed(report)
