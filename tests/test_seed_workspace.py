"""The reference seed workspace (ctx/ golden/ golden/norm_stats.json qnn_libs/ dsp_libs/ + host/)
works as a bundle as it is laid out; its goldens are read as they are."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from htp_helpers import ensure_contexts, fake_env

from molmoact2_ros.cli.app import main

pytest.importorskip("onnxruntime")

RUNTIME = "2.51.40.260930230134"  # the fake wheel's QNN runtime version string


@pytest.fixture
def seed(tiny_root, tmp_path, monkeypatch):
    """lp_vtp_sd rearranged like the seed workspace: no bundle.json, no onnx/."""
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    root = tmp_path / "ws"
    src = tiny_root / "lp_vtp_sd"
    for name in ("ctx", "golden", "host"):
        shutil.copytree(src / name, root / name)
    shutil.copy(src / "norm_stats.json", root / "golden" / "norm_stats.json")
    for folder, lib in (("qnn_libs", "libQnnHtp.so"), ("dsp_libs", "libQnnHtpV73Skel.so")):
        (root / folder).mkdir()
        (root / folder / lib).write_text(f"stand-in, QAIRT v{RUNTIME}\n")
    return root


def test_seed_workspace_passes_parity_as_laid_out(seed, capsys):
    code = main(["parity", str(seed), "--variant", "lp_vtp_sd", "--backend", "htp",
                 "--suffix", "llm=_w4a16", "--suffix", "action=_w4a16"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "30/30 rows pass" in out


def test_golden_keys_that_do_not_fit_are_listed_with_shapes(seed, capsys):
    path = seed / "golden" / "vision_io.npz"
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["pixels"] = arrays.pop("pixel_values")  # a seed export naming the input differently
    np.savez(path, **arrays)
    code = main(["parity", str(seed), "--variant", "lp_vtp_sd", "--backend", "htp"])
    err = capsys.readouterr().err
    assert code == 2
    assert "lacks ['pixel_values'] needed for vision parity" in err
    shape = "x".join(str(d) for d in arrays["pixels"].shape)
    assert f"pixels{list(arrays['pixels'].shape)}" in err, shape


SEED_QAIRT = "2.47.0.250101"  # what the published seed workspaces carry in qnn_libs/dsp_libs
REFERENCE_COSINE = 0.99982  # the final-action cosine the reference runtime recorded on board


def seed_001(tiny_root, dest, *, final_action=None):
    """A folder shaped like the seed 001 (grid_sampler) workspace as shipped: ctx/ with the
    seven fp16 contexts, golden/ with the per-component npz, norm_stats.json, trace.json and
    step0_boundary.npz, QAIRT 2.47 qnn_libs/ and dsp_libs/; no host/, no bundle.json. The
    goldens, the boundary and the final action all come from the independent reference."""
    from molmoact2_ros.bundle.variants import COMPONENTS, get_variant

    src, ws = tiny_root / "grid_sampler", dest / "seed001"
    spec = get_variant("grid_sampler")
    (ws / "ctx").mkdir(parents=True)
    (ws / "golden").mkdir()
    for component in COMPONENTS:
        shutil.copy(src / "ctx" / spec.context_file(component), ws / "ctx")
        shutil.copy(src / "golden" / f"{component}_io.npz", ws / "golden")
    shutil.copy(src / "norm_stats.json", ws / "golden" / "norm_stats.json")
    with np.load(src / "golden" / "e2e_trace.npz", allow_pickle=False) as trace, \
            np.load(src / "golden" / "action_context_io.npz", allow_pickle=False) as ctx:
        np.savez(ws / "golden" / "step0_boundary.npz", keys=ctx["keys"], values=ctx["values"],
                 noise=trace["noise"], encoder_attention_mask=trace["encoder_attention_mask"],
                 action_dim_is_pad=trace["action_dim_is_pad"])
        final = trace["actions_normalized"] if final_action is None else final_action
        (ws / "golden" / "trace.json").write_text(json.dumps({
            "variant": "grid_sampler", "flow_steps": int(trace["flow_steps"]),
            "final_action": np.asarray(final).tolist(),
            "final_action_cosine": REFERENCE_COSINE}))
    for folder, libs in (("qnn_libs", ("libQnnHtp.so", "libQnnSystem.so",
                                       "libQnnHtpV73Stub.so")),
                         ("dsp_libs", ("libQnnHtpV73Skel.so",))):
        (ws / folder).mkdir()
        for lib in libs:
            (ws / folder / lib).write_bytes(b"\0ELF stand-in v" + SEED_QAIRT.encode() + b"\0")
    return ws


def test_seed_workspace_as_shipped_gives_a_complete_report(tiny_root, tmp_path, monkeypatch,
                                                           capsys):
    from molmoact2_ros.firstrun.report import failed

    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    ws = seed_001(tiny_root, tmp_path)
    out = tmp_path / "seed.md"
    assert main(["device-report", str(ws), "--out", str(out)]) == 2
    assert "has no bundle.json naming its variant; add --variant" in capsys.readouterr().err
    code = main(["device-report", str(ws), "--variant", "grid_sampler", "--ignore-bundle-libs",
                 "--out", str(out)])
    report = json.loads((tmp_path / "seed.md.json").read_text())
    assert set(failed(report)) <= {"doctor platform", "doctor libcdsprpc.so",
                                   "doctor FastRPC devices"}, failed(report)
    assert code in (0, 1)
    facts = report["variants"]["grid_sampler"]
    assert facts["norm_stats"]["status"] == "PASS", facts["norm_stats"]
    assert facts["norm_stats"]["path"] == str(ws.resolve() / "golden" / "norm_stats.json")
    assert facts["norm_stats"]["golden"]["status"] == "SKIP", facts["norm_stats"]  # no e2e trace
    assert facts["libraries"]["dsp_libs"]["versions"] == [SEED_QAIRT]
    assert facts["libraries"]["dsp_libs"]["used"] is False
    (section,) = report["sections"]
    assert section["load"]["status"] == "PASS" and section["load"]["npu_sessions"] == 7
    parity = section["component_parity"]
    assert parity["status"] == "PASS" and len(parity["rows"]) == 16  # from ctx/ + golden/ alone
    seed = section["seed_e2e"]
    assert seed["status"] == "PASS" and seed["flow_steps"] == 10
    assert seed["reference_cosine"] == REFERENCE_COSINE and seed["cosine"] >= REFERENCE_COSINE
    assert section["e2e_parity"]["status"] == "not run"
    assert "no complete host/" in section["e2e_parity"]["why"]
    assert section["latency"]["status"] == "PASS"
    text = out.read_text()
    assert "final-action cosine" in text and "(reference runtime: 0.999820" in text
    assert "ignored (--ignore-bundle-libs)" in text


def test_seed_libs_are_refused_in_one_line_naming_the_fix(tiny_root, tmp_path, monkeypatch):
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    ws = seed_001(tiny_root, tmp_path)
    out = tmp_path / "seed.md"
    assert main(["device-report", str(ws), "--variant", "grid_sampler", "--out",
                 str(out)]) == 1
    (section,) = json.loads((tmp_path / "seed.md.json").read_text())["sections"]
    error = section["load"]["error"]
    assert "\n" not in error
    assert f"is QAIRT v{SEED_QAIRT}" in error and "--ignore-bundle-libs" in error
    assert section["component_parity"]["status"] == "not run"


def test_seed_check_fails_on_another_final_action(tiny_root, tmp_path, monkeypatch):
    """The seed's end-to-end check can fail: a trace.json whose final action is the alternate
    trace's (another observation) does not reproduce the reference cosine."""
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    with np.load(tiny_root / "grid_sampler" / "golden" / "e2e_trace_alt.npz",
                 allow_pickle=False) as alt:
        ws = seed_001(tiny_root, tmp_path, final_action=alt["actions_normalized"])
    out = tmp_path / "seed.md"
    assert main(["device-report", str(ws), "--variant", "grid_sampler", "--ignore-bundle-libs",
                 "--out", str(out)]) == 1
    (section,) = json.loads((tmp_path / "seed.md.json").read_text())["sections"]
    assert section["seed_e2e"]["status"] == "FAIL"
    assert section["seed_e2e"]["cosine"] < REFERENCE_COSINE - 1e-3
    assert section["component_parity"]["status"] == "PASS"


def test_suffix_env_of_the_reference_runtime_is_honoured_with_a_notice(tiny_root, monkeypatch,
                                                                        capsys):
    """LLM_CTX_SUFFIX=_w4a16 selects the quantised LLM as --suffix llm=_w4a16 would: on the
    ONNX backend that is refused, which shows it was taken; a --suffix of its group wins."""
    monkeypatch.setenv("LLM_CTX_SUFFIX", "_w4a16")
    assert main(["parity", str(tiny_root / "lp_vtp_sd"), "--backend", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "notice: LLM_CTX_SUFFIX='_w4a16' from the environment" in err
    assert "taken as --suffix llm=_w4a16" in err
    assert "quantised sets ship as HTP contexts only" in err
    assert main(["parity", str(tiny_root / "lp_vtp_sd"), "--backend", "onnx", "--suffix",
                 "llm="]) == 0
    assert "is ignored: --suffix llm= was given" in capsys.readouterr().err


def test_doctor_on_the_seed_workspace_loads_it_and_names_export_host(tiny_root, tmp_path,
                                                                      monkeypatch, capsys):
    """Without host/ the contexts still load (on the seed's conventions) and pass parity;
    the one bundle failure is host/, whose fix names export-host and conventions --write
    (before: "contexts load" failed with a fix about QAIRT versions)."""
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    ws = seed_001(tiny_root, tmp_path)
    main(["doctor", str(ws), "--variant", "grid_sampler", "--ignore-bundle-libs",
          "--repeats", "1"])
    out = capsys.readouterr().out
    lines = {ln[6:30].strip(): ln for ln in out.splitlines() if ln[:4] in ("PASS", "FAIL", "SKIP")}
    assert "contexts load" not in lines and lines["load vision"].startswith("PASS"), out
    assert lines["golden parity"].startswith("PASS"), out
    assert lines["host assets"].startswith("FAIL"), out
    fix = out[out.index("FAIL  host assets"):].splitlines()[1]
    assert "molmoact2 export-host CHECKPOINT" in fix and "conventions" in fix and "--write" in fix
    assert "xpuenabler/molmoact2-libero_grid_sampler_fine_tuned" in fix, fix
