"""Matching chunks with golden chunks by stamp (ROS-free core of replay and the checker node)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from molmoact2_ros.bundle.comparison import Limits
from molmoact2_ros.replay.chunk_match import (
    FP16,
    FP32,
    ActionScale,
    LiveCheck,
    format_summary,
    match_chunks,
)

NAMES = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
ROOT = Path(__file__).resolve().parents[1]


def _golden(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return {10**9 + i * 5 * 10**8: rng.uniform(-1, 1, (10, 7)).astype(np.float32)
            for i in range(n)}


def test_identical_run_passes():
    g = _golden()
    s = match_chunks(dict(g), g, FP32)
    assert s.ok and s.compared == s.passed == 4 and not s.missing and not s.extra
    assert format_summary(s, NAMES).splitlines()[-1].startswith("PASS")


def test_one_bad_value_names_chunk_action_and_dimension():
    g = _golden()
    run = {k: v.copy() for k, v in g.items()}
    stamp = sorted(g)[2]
    run[stamp][3, 6] += 0.5
    s = match_chunks(run, g, FP32)
    assert not s.ok and s.passed == 3
    w = s.worst
    assert (w.stamp_ns, w.worst_row, w.worst_dim) == (stamp, 3, 6)
    assert np.isclose(w.max_abs, 0.5, atol=1e-6)
    text = format_summary(s, NAMES)
    assert "worst chunk: stamp 2.000000000 s" in text and "at action 3 gripper" in text


def test_fp16_noise_passes_fp16_but_not_fp32():
    """Noise of the size measured between fake-HTP fp16 and ONNX (median 2e-4, max 3e-3
    normalised) passes the fp16 default and fails the float32 one."""
    g = _golden()
    rng = np.random.default_rng(1)
    run = {k: v + rng.normal(0, 4e-4, v.shape).astype(np.float32) for k, v in g.items()}
    assert match_chunks(run, g, FP16).ok
    assert not match_chunks(run, g, FP32).ok


def test_scale_and_shift_errors_fail_on_the_within_criterion():
    """A run 1.05 times the golden has cosine 1 and must still fail: the within fraction
    names it; so does a run shifted by 0.01 (cosine 0.9998)."""
    g = _golden()
    scaled = {k: v * np.float32(1.05) for k, v in g.items()}
    shifted = {k: v + np.float32(0.01) for k, v in g.items()}
    for run in (scaled, shifted):
        for tol in (FP32, FP16):
            s = match_chunks(run, g, tol)
            assert not s.ok and s.passed == 0, tol
            assert all("within " in c.failed for c in s.chunks)
            text = format_summary(s, NAMES)
            assert "within 4 of 4" in text and "failed criterion of the worst chunk:" in text
    s = match_chunks(scaled, g, FP32)
    assert all(c.cosine > 0.999999 and c.failed.startswith("within ") for c in s.chunks)


def test_per_dimension_limits_in_normalised_units():
    """An error of 0.02 action units on a dimension whose range is 0.2 wide is 0.2
    normalised: it fails there, while the same error on a 20-wide dimension passes."""
    g = _golden(1)
    (stamp, want), = g.items()
    scale = ActionScale(offset=(0.0,) * 7, scale=(0.1,) + (10.0,) * 6)
    tol = Limits(min_cosine=0.9, atol=(0.01,) * 7, rtol=0.0, min_within=1.0)
    on_wide = want.copy()
    on_wide[:, 1] += 0.02
    assert match_chunks({stamp: on_wide}, g, tol, scale=scale).ok
    on_narrow = want.copy()
    on_narrow[:, 0] += 0.02
    s = match_chunks({stamp: on_narrow}, g, tol, scale=scale)
    assert not s.ok and s.worst.worst_dim == 0 and np.isclose(s.worst.max_abs, 0.2, atol=1e-5)
    assert "max-abs 0.2 normalised at action" in format_summary(s, NAMES)
    wrong_width = Limits(min_cosine=0.9, atol=(0.01,) * 6, rtol=0.0, min_within=1.0)
    bad = match_chunks({stamp: want}, g, wrong_width)
    assert not bad.ok and "per-dimension atol" in bad.chunks[0].failed


def test_missing_extra_and_min_produced():
    g = _golden()
    stamps = sorted(g)
    run = {s: g[s] for s in stamps[1:]}
    assert not match_chunks(run, g, FP32).ok
    assert match_chunks(run, g, FP32, min_produced=0.75).ok
    run[123] = g[stamps[0]]
    s = match_chunks(run, g, FP32, min_produced=0.5)
    assert not s.ok and s.extra == [123]
    assert not match_chunks({}, g, FP32, min_produced=0.0).ok  # nothing compared never passes


def test_nan_or_wrong_shape_fails():
    g = _golden(1)
    (stamp, want), = g.items()
    bad = want.copy()
    bad[0, 0] = np.nan
    assert not match_chunks({stamp: bad}, g, FP32).ok
    assert not match_chunks({stamp: want[:5]}, g, FP32).ok


def test_live_check_ends_when_every_stamp_arrived_or_idle():
    g = _golden(3)
    live = LiveCheck(g, FP32, min_produced=0.5, idle_timeout_s=5.0, timeout_s=60.0,
                     start_s=0.0)
    assert live.finished(59.0) == "" and "no chunk within 60" in live.finished(60.0)
    stamps = sorted(g)
    live.add(stamps[0], g[stamps[0]], 1.0, variant="lp_vtp_sd")
    live.add(stamps[1], g[stamps[1]], 2.0, variant="other")
    assert live.fields == {"variant": "lp_vtp_sd"}  # the first chunk's fields
    assert live.finished(6.9) == "" and live.finished(7.0) == "no chunk for 5 s"
    assert live.summary().ok  # 2 of 3 >= 0.5
    live.add(stamps[2], g[stamps[2]], 7.5)
    assert live.finished(7.5) == "every golden chunk was produced"


def test_replay_launch_file_declares_its_arguments():
    tree = ast.parse((ROOT / "launch" / "replay.launch.py").read_text())
    declared = {node.args[0].value for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") ==
                "DeclareLaunchArgument" and isinstance(node.args[0], ast.Constant)}
    assert {"bag", "golden", "bundle_root", "backend", "rate", "min_produced"} <= declared
    assert "scripts/replay_checker" in (ROOT / "CMakeLists.txt").read_text()
    assert (ROOT / "scripts" / "replay_checker").stat().st_mode & 0o111
