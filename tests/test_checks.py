"""The checks cannot pass a wrong output: parity and replay fail a scale error, a constant
shift and a wrong camera mount naming the failed criterion; reports show the residuals and the
golden's provenance; a golden from another noise stream says so before any chunk is compared;
mount rotations act on the next chunk."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from molmoact2_ros.bundle.comparison import (
    FP16,
    FP32,
    Limits,
    ToleranceTable,
    load_tolerances,
    measure,
    precision_of,
)
from molmoact2_ros.bundle.golden import load_npz
from molmoact2_ros.errors import BundleError, GoldenError, ObservationError
from molmoact2_ros.host.images import MOUNT_ROTATIONS, mount_rotate, preprocess


# -- the comparison rule -----------------------------------------------------------------------
def test_scale_and_shift_fail_although_cosine_passes():
    rng = np.random.default_rng(0)
    golden = rng.normal(0, 1, (10, 7)).astype(np.float32)
    scaled = measure(golden * np.float32(1.05), golden, FP32)
    assert scaled.cosine > 0.999999 and not scaled.passed
    assert scaled.failed == (scaled.failed[0],) and scaled.failed[0].startswith("within ")
    shifted = measure(golden + np.float32(0.01), golden, FP32)
    assert not shifted.passed and any(f.startswith("within ") for f in shifted.failed)
    off = measure(golden[::-1], golden, Limits(0.9999, 10.0, 0.0, 0.0))
    assert off.failed and off.failed[0].startswith("cosine ")  # within passes, cosine fails
    assert measure(golden, golden, FP32).passed
    assert measure(np.array([1, 2, 4]), np.array([1, 2, 3]), FP32).failed[0].startswith(
        "values differ")


def test_precision_of_backend_and_suffix():
    assert precision_of("onnx", "_w4a16") == "fp32"
    assert precision_of("htp") == "fp16" and precision_of("htp", "_w4a16") == "w4a16"
    table = ToleranceTable()
    assert table.limits("vision", "fp32") == FP32 and table.limits("vision", "fp16") == FP16
    assert table.override(min_cosine=0.5).limits("vision", "fp32").min_cosine == 0.5


# -- parity on the tiny bundles ----------------------------------------------------------------
def _bundle_copy(tiny_root, tmp_path, variant="lp_vtp_sd"):
    dst = tmp_path / variant
    shutil.copytree(tiny_root / variant, dst, ignore=shutil.ignore_patterns("ctx"))
    return dst


def _edit_trace(bundle, **arrays):
    path = bundle / "golden" / "e2e_trace.npz"
    data = dict(load_npz(path))
    data.update({k: f(data[k]) for k, f in arrays.items()})
    np.savez(path, **data)


@pytest.mark.parametrize("edit", [lambda c: c * np.float32(1.05),
                                  lambda c: c + np.float32(0.01)], ids=["scaled", "shifted"])
def test_parity_fails_a_scaled_or_shifted_golden_naming_the_criterion(tiny_root, tmp_path,
                                                                      capsys, edit):
    from molmoact2_ros.cli.app import main

    bundle = _bundle_copy(tiny_root, tmp_path)
    _edit_trace(bundle, chunk=edit)
    assert main(["parity", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "29/30 rows pass" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("FAIL e2e:e2e_trace chunk"))
    assert "within " in line and "atol + 0.01*|golden|" in line


def test_bundle_tolerances_are_typed_and_used(tiny_root, tmp_path, capsys):
    from molmoact2_ros.cli.app import main

    bundle = _bundle_copy(tiny_root, tmp_path)
    _edit_trace(bundle, chunk=lambda c: c * np.float32(1.05))
    path = bundle / "golden" / "tolerances.json"
    rows = [{"component": "e2e", "precision": "fp32", "tensor": "chunk", "atol": 0.1,
             "rtol": 0.1, "why": "a known scale error, documented"}]
    path.write_text(json.dumps({"format": "molmoact2_tolerances.v1", "limits": rows}))
    table = load_tolerances(bundle / "golden")
    assert table.limits("e2e", "fp32", "chunk").atol == 0.1
    assert table.limits("e2e", "fp32", "hidden_states") == FP32
    assert main(["parity", str(bundle)]) == 0
    assert f"limits from {path}" in capsys.readouterr().out
    for bad, fragment in (
        ({**rows[0], "atol": "0.1"}, "limits[0]: atol is '0.1' (string); it must be a number"),
        ({**rows[0], "component": "eyes"}, "limits[0]: component is 'eyes'; allowed:"),
        ({k: v for k, v in rows[0].items() if k != "why"}, "limits[0]: why is missing"),
        ({**rows[0], "min_within": 1.5}, "min_within is 1.5; it must be in (0, 1]"),
        ({**rows[0], "mincosine": 0.9}, "unknown keys ['mincosine']"),
    ):
        path.write_text(json.dumps({"format": "molmoact2_tolerances.v1", "limits": [bad]}))
        with pytest.raises(BundleError) as info:
            load_tolerances(bundle / "golden")
        assert fragment in str(info.value) and str(path) in str(info.value)


# -- mount rotations ---------------------------------------------------------------------------
def test_mount_rotations_match_numpy():
    img = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    want = {"none": img, "180": np.rot90(img, 2), "vflip": np.flipud(img),
            "hflip": np.fliplr(img)}
    assert set(want) == set(MOUNT_ROTATIONS)
    for how, expected in want.items():
        np.testing.assert_array_equal(mount_rotate(img, how), expected)
    with pytest.raises(ObservationError, match="none, 180, vflip, hflip"):
        mount_rotate(img, "90")


def _controller(tiny_root, **changes):
    from molmoact2_ros.control.controller import Controller, load_policy
    from molmoact2_ros.control.params import Settings

    tr = load_npz(tiny_root / "lp_vtp_sd" / "golden" / "e2e_trace.npz")
    settings = Settings().with_changes({
        "variant": "lp_vtp_sd", "bundle.lp_vtp_sd": str(tiny_root / "lp_vtp_sd"),
        "backend": "onnx", "instruction": str(tr["instruction"]), "seed": 7,
        "max_observation_age_s": 1e3, **changes})
    published = []
    ctl = Controller(settings, publish=published.append, policy_factory=load_policy,
                     clock_ns=lambda: 10**9)
    ctl.configure()
    ctl.activate(worker=False)
    return ctl, tr, published


def test_flip_images_changes_the_pixels_reaching_vision_on_the_next_chunk(tiny_root):
    ctl, tr, published = _controller(tiny_root)
    try:
        images = [tr["image_primary"], tr["image_wrist"]]
        pixels = []
        for change in (None, {"flip_images.primary": "vflip"}, {"flip_images.wrist": "180"}):
            if change:
                ok, reason, how = ctl.request(change)
                assert ok and how == "live", reason
            ctl.on_observation(images, tr["state"], 10**9)
            assert ctl.process_pending() is not None
            pixels.append(np.array(ctl.policy.pipeline.input_buffer("pixel_values")))
        flip = ctl.policy.conventions.flip_images_180
        for k, mounts in enumerate([("none", "none"), ("vflip", "none"), ("vflip", "180")]):
            want = preprocess([mount_rotate(img, m) for img, m in zip(images, mounts)],
                              flip=flip)
            np.testing.assert_array_equal(pixels[k], want)
        assert not np.array_equal(pixels[0][0, 0], pixels[1][0, 0])  # primary changed
        np.testing.assert_array_equal(pixels[0][0, 1], pixels[1][0, 1])  # wrist did not
        assert not np.array_equal(pixels[1][0, 1], pixels[2][0, 1])
        assert not np.allclose(published[0].actions, published[1].actions)  # the output too
        ok, reason, _ = ctl.request({"flip_images.primary": "sideways"})
        assert not ok and "choose one of none, 180, vflip, hflip" in reason
    finally:
        ctl.shutdown()


# -- replay ------------------------------------------------------------------------------------
pytest.importorskip("rosbags")
from replay_helpers import FIRST_NS, obs_bag, run_cli, trace  # noqa: E402


def _record(tmp_path, tiny_root, bag, tr, capsys, *extra, name="golden", variant="lp_vtp_sd"):
    golden = tmp_path / name
    rc, out, err = run_cli(["replay", bag, "--bundle-root", tiny_root, "--variant", variant,
                            "--instruction", str(tr["instruction"]), "--seed", "7",
                            "--record", golden, "--no-progress", *extra], capsys)
    assert rc == 0, out + err
    return golden


def _check(tiny_root, bag, golden, capsys, *extra):
    return run_cli(["replay", bag, "--bundle-root", tiny_root, "--golden", golden,
                    "--no-progress", *extra], capsys)


def test_golden_recorded_with_a_mount_fails_without_it(tiny_root, tmp_path, capsys):
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 3)
    golden = _record(tmp_path, tiny_root, bag, tr, capsys, "--set", "flip_images.primary=vflip")
    rc, out, err = _check(tiny_root, bag, golden, capsys, "--set",
                          "flip_images.primary=vflip")
    assert rc == 0 and "3 passed, 0 failed" in out, out + err
    rc, out, err = _check(tiny_root, bag, golden, capsys)
    assert rc == 1, out + err
    assert "flip_images.primary 'none' (golden 'vflip')" in out
    assert "0 passed, 3 failed" in out and "chunks failing each criterion: " in out


def test_report_of_a_failing_run_shows_residuals_and_provenance(tiny_root, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 4)
    golden = _record(tmp_path, tiny_root, bag, tr, capsys)
    report = tmp_path / "report"
    rc, out, err = _check(tiny_root, bag, golden, capsys, "--flow-steps", "3",
                          "--report", report)
    assert rc == 1 and "0 passed, 4 failed" in out, out + err
    data = json.loads((report / "summary.json").read_text())
    prov = data["golden"]
    assert prov["backend"] == "onnx" and prov["package_version"] and prov["source_bag"] == "obs"
    assert prov["settings"]["flow_steps"] == 2 and prov["numpy_version"] == np.__version__
    assert data["noise_stream"] == "same as the golden's"
    chunks = data["match"]["chunks"]
    assert len(chunks) == 4 and all(0.0 <= c["within_tol"] < 1.0 for c in chunks)
    assert all(c["failed"] for c in chunks) and data["match"]["units"] == "normalised"
    cont = data["continuity"]
    assert [c["stamp_ns"] for c in cont] == sorted(int(s) for s in
                                                   [FIRST_NS + i * 5 * 10**8 for i in (1, 2, 3)])
    assert all(c["run_jump"] >= 0 and c["golden_jump"] >= 0 for c in cont)
    for name in ("actions.png", "residuals.png", "error_per_chunk.png", "continuity.png",
                 "latency.png"):
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_rows_are_drawn_when_they_are_due():
    from molmoact2_ros.replay.report import chunk_times, continuity

    np.testing.assert_allclose(chunk_times(2 * 10**9, 10**9, 3, 0.05), [1.05, 1.1, 1.15])
    a = np.zeros((10, 7), np.float32)
    a[:, 0] = np.arange(10)  # row i holds i
    b = np.full((10, 7), 0.0, np.float32)
    b[0, 0] = 3.5  # the new chunk's first row, due when the old chunk's row 3 is
    jumps = continuity({0: a, 150_000_000: b}, 0.05)
    assert jumps == {150_000_000: pytest.approx(0.5)}


def test_a_golden_from_another_noise_stream_says_so_first(tiny_root, tmp_path, capsys,
                                                           monkeypatch):
    """A numpy whose default generator is PCG64DXSM (numpy has said it may switch) draws
    other noise for the same seed: the check names that before comparing chunks."""
    from molmoact2_ros.replay.chunkbag import (
        noise_fingerprint,
        noise_stream_problem,
        read_chunk_bag,
    )

    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 2)
    ours = read_chunk_bag(_record(tmp_path, tiny_root, bag, tr, capsys, name="ours"))
    assert ours.settings["noise_fingerprint"] == noise_fingerprint(7)
    assert ours.settings["numpy_version"] == np.__version__
    assert noise_stream_problem(ours.settings) == ""
    default_rng = np.random.default_rng
    with monkeypatch.context() as m:
        m.setattr(np.random, "default_rng",
                  lambda seed=None: np.random.Generator(np.random.PCG64DXSM(seed)))
        other = _record(tmp_path, tiny_root, bag, tr, capsys, name="other")
    assert np.random.default_rng is default_rng
    rc, out, err = _check(tiny_root, bag, other, capsys)
    assert rc == 1, out + err
    lines = out.splitlines()
    noise = [i for i, ln in enumerate(lines) if ln.startswith("noise stream differs")]
    compared = [i for i, ln in enumerate(lines) if ln.startswith("compared ")]
    assert len(noise) == 1 and compared and noise[0] < compared[0]
    assert "seed 7" in lines[noise[0]] and np.__version__ in lines[noise[0]]


def test_golden_with_duplicate_stamps_is_refused(tiny_root, tmp_path):
    from molmoact2_ros.control.params import Settings
    from molmoact2_ros.replay.chunkbag import ChunkBagWriter, read_chunk_bag
    from molmoact2_ros.replay.replay import replay

    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 1)
    settings = Settings().with_changes({
        "variant": "lp_vtp_sd", "bundle.lp_vtp_sd": str(tiny_root / "lp_vtp_sd"),
        "backend": "onnx", "instruction": str(tr["instruction"]), "seed": 7})
    (published,) = replay(bag, settings).published
    writer = ChunkBagWriter(tmp_path / "dup", {"format": "molmoact2_chunks.v1"})
    writer.write(published, 1)
    writer.write(published, 2)
    writer.close()
    with pytest.raises(GoldenError, match="two chunks stamped 1000000000 ns"):
        read_chunk_bag(tmp_path / "dup")


def test_replay_honours_max_image_side_px(tiny_root, tmp_path):
    from molmoact2_ros.control.params import Settings
    from molmoact2_ros.replay.replay import replay

    tr = trace(tiny_root, "lp_vtp_sd")
    settings = Settings().with_changes({
        "variant": "lp_vtp_sd", "bundle.lp_vtp_sd": str(tiny_root / "lp_vtp_sd"),
        "backend": "onnx", "instruction": str(tr["instruction"]), "seed": 7,
        "max_image_side_px": 128})
    for compressed in ("", "png"):
        bag = obs_bag(tmp_path / f"obs{compressed}", tr, 1, compressed=compressed)
        s = settings.with_changes({"compressed_images": bool(compressed)})
        result = replay(bag, s)
        assert not result.published and result.drops.get("ObservationError") == 1
        assert "max_image_side_px=128" in result.reasons["ObservationError"]


def test_compare_two_chunk_bags(tiny_root, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 3)
    a = _record(tmp_path, tiny_root, bag, tr, capsys, name="a")
    b = _record(tmp_path, tiny_root, bag, tr, capsys, name="b")
    c = _record(tmp_path, tiny_root, bag, tr, capsys, "--flow-steps", "3", name="c")
    rc, out, err = run_cli(["compare", a, b, "--report", tmp_path / "same"], capsys)
    assert rc == 0 and "3 passed, 0 failed" in out, out + err
    rc, out, err = run_cli(["compare", c, b, "--report", tmp_path / "differ"], capsys)
    assert rc == 1 and "flow_steps 3 (golden 2)" in out and "within 3 of 3" in out, out + err
    data = json.loads((tmp_path / "differ" / "summary.json").read_text())
    dist = data["error_distribution"]
    assert set(dist) == {"x", "y", "z", "roll", "pitch", "yaw", "gripper"}
    assert all(d["max_abs"] > 0 and d["n"] == 30 for d in dist.values())
    assert data["a"]["settings"]["flow_steps"] == 3 and data["b"]["settings"]["flow_steps"] == 2
    for name in ("residuals.png", "error_distribution.png"):
        assert (tmp_path / "differ" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_documented_tolerances_example_loads(tmp_path):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "bundle_format.md").read_text()
    example = doc.split("## `golden/tolerances.json`")[1].split("```json")[1].split("```")[0]
    (tmp_path / "tolerances.json").write_text(example)
    table = load_tolerances(tmp_path)
    assert table.limits("vision", "fp32").min_cosine == 0.998
    assert table.limits("llm_split0", "w4a16", "hidden_states").min_within == 0.9


def test_residuals_switch_to_symlog_when_the_band_would_vanish():
    """A failing run's error dwarfs the band: beyond ten times the band the axis turns symlog
    (linear within the band), so both show; an error near the band stays linear."""
    from molmoact2_ros.replay.report import residual_scale

    assert residual_scale(1e-3, 0.3) == "symlog"
    assert residual_scale(1e-3, 5e-3) == "linear"
    assert residual_scale(0.0, 0.3) == "linear"  # no band: nothing to keep visible


def test_latency_table_gives_median_p95_and_max_in_pipeline_order():
    from molmoact2_ros.replay.report import latency_table

    samples = [{"total": 30.0, "vision": 1.0}, {"total": 10.0, "vision": 3.0},
               {"total": 20.0, "vision": 2.0, "llm_split0": 4.0}]
    rows = latency_table(samples)
    assert [r[0] for r in rows] == ["vision", "llm_split0", "total"]
    assert rows[0][1] == 2.0 and rows[0][3] == 3.0
    assert rows[1][1:] == (4.0, 4.0, 4.0)  # one chunk timed it: only that chunk counts
    assert rows[2][1] == 20.0 and rows[2][2] == pytest.approx(29.0)


def test_compare_labels_name_each_bag_with_its_variant_suffix_and_backend():
    from pathlib import Path

    from molmoact2_ros.cli.compare import bag_label

    a = bag_label(Path("runs/board_w4a16"), {"variant": "fused", "backend": "htp",
                                             "context_suffix.llm": "_w4a16", "machine": "b"})
    b = bag_label(Path("runs/ws"), {"variant": "grid_sampler", "backend": "onnx",
                                    "context_suffix.llm": "", "machine": "w"})
    assert a == "board_w4a16 (fused, llm=_w4a16, htp, b)"
    assert b == "ws (grid_sampler, onnx, w)"
