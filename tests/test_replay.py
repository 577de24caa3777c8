"""Golden replay: record a chunk bag, check a run against it chunk by chunk, across variants,
image transports, storages and bag versions; runs that differ fail and say where."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("rosbags")
pytest.importorskip("PIL")
from replay_helpers import FIRST_NS, PERIOD_NS, humble_recorded, obs_bag, run_cli, trace  # noqa: E402

from molmoact2_ros.control.params import Settings  # noqa: E402
from molmoact2_ros.errors import BagError  # noqa: E402
from molmoact2_ros.replay.chunkbag import (  # noqa: E402
    CHUNK_TOPIC,
    SETTINGS_TOPIC,
    TRAJECTORY_TOPIC,
    read_chunk_bag,
)
from molmoact2_ros.replay.replay import replay, typestore  # noqa: E402


def _record(tmp_path, tiny_root, bag, tr, capsys, *extra, name="golden"):
    golden = tmp_path / name
    rc, out, err = run_cli(["replay", bag, "--bundle-root", tiny_root, "--instruction",
                            str(tr["instruction"]), "--seed", "7", "--record", golden,
                            "--no-progress", *extra], capsys)
    assert rc == 0, out + err
    return golden, out


def _check(tiny_root, bag, golden, capsys, *extra):
    return run_cli(["replay", bag, "--bundle-root", tiny_root, "--golden", golden,
                    "--no-progress", *extra], capsys)


def test_round_trip_matches_every_chunk(tiny_root, tmp_path, capsys, variant_name):
    tr = trace(tiny_root, variant_name)
    bag = obs_bag(tmp_path / "obs", tr, 3)
    golden, out = _record(tmp_path, tiny_root, bag, tr, capsys, "--variant", variant_name)
    assert f"chunk bag: {golden} (3 chunks)" in out.splitlines()[-1]
    rc, out, err = _check(tiny_root, bag, golden, capsys)
    assert rc == 0, out + err
    assert "compared 3 of 3 golden chunks: 3 passed, 0 failed, 0 missing, 0 extra" in out
    assert "settings differ" not in out  # variant, instruction, seed come from the golden

    g = read_chunk_bag(golden)
    assert sorted(g.chunks) == [FIRST_NS + i * PERIOD_NS for i in range(3)]
    assert g.settings["variant"] == variant_name and g.settings["seed"] == 7
    assert g.settings["backend"] == "onnx" and g.settings["instruction"] == str(tr["instruction"])
    assert g.settings["flow_steps"] == int(tr["flow_steps"]) and g.settings["package_version"]
    from rosbags.highlevel import AnyReader

    with AnyReader([golden], default_typestore=typestore()) as reader:
        topics = {c.topic: c.msgcount for c in reader.connections}
        assert topics == {CHUNK_TOPIC: 3, TRAJECTORY_TOPIC: 3, SETTINGS_TOPIC: 1}
        trajs = [reader.deserialize(raw, c.msgtype) for c, _, raw in reader.messages()
                 if c.topic == TRAJECTORY_TOPIC]
    first = g.chunks[FIRST_NS].astype(np.float64)
    # the tiny bundles are LIBERO-like (delta rows): the trajectory carries the end-effector
    # targets integrated from the observed state, execution.delta_scale metres per unit; the
    # gripper as commanded
    positions = np.array([p.positions for p in trajs[0].points])
    state = np.asarray(tr["state"], np.float32).astype(np.float64)
    unit_m = Settings()["execution.delta_scale"][0]
    np.testing.assert_allclose(positions[:, :3],
                               state[:3] + unit_m * np.cumsum(first[:, :3], axis=0), atol=1e-6)
    np.testing.assert_allclose(positions[:, 6], first[:, 6], atol=1e-6)
    assert trajs[0].points[-1].time_from_start.nanosec == 500_000_000  # 10 x 50 ms


@pytest.mark.parametrize("compressed,mcap,version,storage", [
    ("jpeg", True, 9, "sqlite3"),
    ("png", False, 8, "mcap"),
    ("", True, 9, "sqlite3"),
    ("jpeg", False, 8, "mcap"),
])
def test_round_trip_transports_storages_and_versions(tiny_root, tmp_path, capsys, compressed,
                                                     mcap, version, storage):
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 3, compressed=compressed, mcap=mcap, version=version)
    extra = ["--variant", "lp_vtp_sd", "--storage", storage, "--bag-version", str(version)]
    if compressed:
        extra += ["--set", "compressed_images=true"]
    golden, _ = _record(tmp_path, tiny_root, bag, tr, capsys, *extra)
    meta = (golden / "metadata.yaml").read_text()
    assert f"version: {version}" in meta and f"storage_identifier: {storage}" in meta
    rc, out, err = _check(tiny_root, bag, golden, capsys,
                          *(["--set", "compressed_images=true"] if compressed else []))
    assert rc == 0 and "3 passed, 0 failed" in out, out + err


@pytest.mark.parametrize("variant", ["grid_sampler", "fused"])  # lp_vtp_sd: the test above
def test_round_trip_compressed_on_the_other_variants(tiny_root, tmp_path, capsys, variant):
    tr = trace(tiny_root, variant)
    bag = obs_bag(tmp_path / "obs", tr, 2, compressed="jpeg", mcap=True, version=9)
    golden, _ = _record(tmp_path, tiny_root, bag, tr, capsys, "--variant", variant,
                        "--set", "compressed_images=true", "--storage", "sqlite3")
    rc, out, err = _check(tiny_root, bag, golden, capsys, "--set", "compressed_images=true")
    assert rc == 0 and "compared 2 of 2 golden chunks: 2 passed" in out, out + err


def test_compressed_frames_decode_to_the_raw_pixels(tiny_root, tmp_path, capsys):
    """PNG is lossless: a png bag gives the same chunks as the raw bag."""
    tr = trace(tiny_root, "lp_vtp_sd")
    raw = obs_bag(tmp_path / "raw", tr, 2)
    png = obs_bag(tmp_path / "png", tr, 2, compressed="png")
    golden, _ = _record(tmp_path, tiny_root, raw, tr, capsys, "--variant", "lp_vtp_sd")
    rc, out, err = _check(tiny_root, png, golden, capsys, "--set", "compressed_images=true")
    assert rc == 0 and "max-abs 0 " in out, out + err


def test_bag_recorded_by_humble_replays(tiny_root, tmp_path, capsys):
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = humble_recorded(obs_bag(tmp_path / "obs", tr, 2))
    golden, _ = _record(tmp_path, tiny_root, bag, tr, capsys, "--variant", "lp_vtp_sd")
    rc, out, _ = _check(tiny_root, bag, golden, capsys)
    assert rc == 0 and "compared 2 of 2" in out


@pytest.fixture
def lp_golden(tiny_root, tmp_path, capsys):
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 3)
    golden, _ = _record(tmp_path, tiny_root, bag, tr, capsys, "--variant", "lp_vtp_sd")
    return tr, bag, golden


def test_golden_of_another_variant_fails_and_says_where(tiny_root, lp_golden, capsys):
    tr, bag, golden = lp_golden
    rc, out, _ = _check(tiny_root, bag, golden, capsys, "--variant", "grid_sampler")
    assert rc == 1
    lines = out.splitlines()
    # flow steps, seed and instruction still come from the golden: only the variant differs
    assert lines[0] == "settings differ from the golden's: variant 'grid_sampler' (golden " \
                       "'lp_vtp_sd')"
    assert "compared 3 of 3 golden chunks: 0 passed, 3 failed" in out
    assert "worst chunk: stamp " in out and " at action " in out and lines[-1].startswith("FAIL")


def test_swapped_cameras_fail_and_say_where(tiny_root, tmp_path, lp_golden, capsys):
    tr, _, golden = lp_golden
    swapped = obs_bag(tmp_path / "swapped", tr, 3, swap=True)
    rc, out, _ = _check(tiny_root, swapped, golden, capsys)
    assert rc == 1 and "settings differ" not in out
    assert "0 passed, 3 failed" in out
    worst = next(ln for ln in out.splitlines() if ln.startswith("worst chunk"))
    assert "at action" in worst and any(n in worst for n in ("x", "y", "z", "roll", "gripper"))


def test_other_instruction_fails_and_is_named(tiny_root, lp_golden, capsys):
    tr, bag, golden = lp_golden
    rc, out, _ = _check(tiny_root, bag, golden, capsys, "--instruction",
                        "put the bowl on the plate")
    assert rc == 1
    assert out.splitlines()[0] == ("settings differ from the golden's: instruction 'put the "
                                   f"bowl on the plate' (golden {str(tr['instruction'])!r})")
    assert "FAIL" in out.splitlines()[-1]


def test_skipped_observations_keep_the_noise_of_the_others(tiny_root, tmp_path, lp_golden,
                                                           capsys):
    """A run that misses the first observation still matches on the rest (noise depends on
    (seed, stamp) only); it passes only with a lower --min-produced."""
    tr, _, golden = lp_golden
    later = obs_bag(tmp_path / "later", tr, 3, skip=1)
    rc, out, _ = _check(tiny_root, later, golden, capsys)
    assert rc == 1 and "compared 2 of 3 golden chunks: 2 passed, 0 failed, 1 missing" in out
    assert "first missing chunk: stamp 1.000000000 s" in out
    rc, out, _ = _check(tiny_root, later, golden, capsys, "--min-produced", "0.6")
    assert rc == 0, out


def test_extra_chunks_fail(tiny_root, tmp_path, lp_golden, capsys):
    tr, _, golden = lp_golden
    longer = obs_bag(tmp_path / "longer", tr, 4)
    rc, out, _ = _check(tiny_root, longer, golden, capsys)
    assert rc == 1 and "0 missing, 1 extra" in out and "first extra chunk" in out


def test_chunks_match_the_reference_for_their_stamp(tiny_root, tmp_path):
    """Independent check of the noise rule: the reference model with seed [7, stamp_ns]."""
    from molmoact2_ros.bundle.variants import VARIANTS
    from molmoact2_ros.synth.reference import run_trace
    from molmoact2_ros.synth.writer import reference_for

    tr = trace(tiny_root, "grid_sampler")
    bag = obs_bag(tmp_path / "obs", tr, 2)
    settings = Settings().with_changes({
        "variant": "grid_sampler", "bundle.grid_sampler": str(tiny_root / "grid_sampler"),
        "backend": "onnx", "instruction": str(tr["instruction"]), "seed": 7,
        "max_observation_age_s": 1.0})
    result = replay(bag, settings)
    model, host = reference_for(VARIANTS["grid_sampler"], 0)
    for i, out in enumerate(result.published):
        stamp = FIRST_NS + i * PERIOD_NS
        assert out.chunk.observation_stamp_ns == stamp
        ref = run_trace(model, host, primary=tr["image_primary"], wrist=tr["image_wrist"],
                        state=np.asarray(tr["state"], np.float32) + np.float32(0.01 * i),
                        instruction=str(tr["instruction"]), seed=[7, stamp],
                        flow_steps=10)[0]
        np.testing.assert_allclose(out.actions, ref["chunk"], atol=2e-4)
    assert not np.allclose(result.published[0].actions, result.published[1].actions)


def test_trace_golden_compares_every_chunk_with_the_trace_noise(tiny_root, tmp_path, capsys):
    tr = trace(tiny_root, "grid_sampler")
    bag = tmp_path / "obs"
    rc, _, _ = run_cli(["trace-to-bag", tiny_root / "grid_sampler/golden/e2e_trace.npz", bag],
                       capsys)
    assert rc == 0
    rc, out, err = _check(tiny_root, bag, tiny_root / "grid_sampler/golden/e2e_trace.npz",
                          capsys, "--instruction", str(tr["instruction"]))
    assert rc == 0 and "compared 3 of 3 golden chunks: 3 passed" in out, out + err


def test_report_and_last_lines(tiny_root, tmp_path, lp_golden, capsys):
    pytest.importorskip("matplotlib")
    _, bag, golden = lp_golden
    report = tmp_path / "report"
    rc, out, _ = _check(tiny_root, bag, golden, capsys, "--report", report, "--record",
                        tmp_path / "again")
    assert rc == 0
    last = out.splitlines()[-2:]
    assert last[0].startswith(f"report: {report}/summary.json") and "actions.png" in last[0]
    assert last[1] == f"chunk bag: {tmp_path / 'again'} (3 chunks)"
    data = json.loads((report / "summary.json").read_text())
    assert data["match"]["ok"] and data["match"]["compared"] == 3 and data["chunks"] == 3
    assert set(data["latency_ms"]) >= {"vision", "action_step", "total"}
    for name in ("actions.png", "error_per_chunk.png", "latency.png"):
        assert (report / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # again refuses to overwrite; --force does
    rc, _, err = _check(tiny_root, bag, golden, capsys, "--report", report)
    assert rc == 2 and "holds a report already" in err
    rc, _, _ = _check(tiny_root, bag, golden, capsys, "--report", report, "--force")
    assert rc == 0


def test_replay_skips_unsynchronised_and_invalid_frames(tiny_root, tmp_path):
    from molmoact2_ros.replay.replay import write_observation_bag

    tr = trace(tiny_root, "lp_vtp_sd")
    settings = Settings().with_changes({
        "variant": "lp_vtp_sd", "bundle.lp_vtp_sd": str(tiny_root / "lp_vtp_sd"),
        "backend": "onnx", "instruction": str(tr["instruction"]), "seed": 7,
        "max_observation_age_s": 1.0})
    bad_state = tr["state"].copy()
    bad_state[2] = np.nan
    frames = [(10**9, tr["image_primary"], tr["image_wrist"], tr["state"]),
              (2 * 10**9, tr["image_primary"], tr["image_wrist"], bad_state)]
    bag = tmp_path / "obs"
    write_observation_bag(bag, frames, settings)
    result = replay(bag, settings)
    assert len(result.published) == 1 and result.drops.get("ObservationError") == 1
    assert "NaN" in result.reasons["ObservationError"] or "nan" in \
        result.reasons["ObservationError"].lower()
    too_far = settings.with_changes({"sync.slop_s": 0.001})  # wrist is 3 ms after primary
    assert replay(bag, too_far).synced == 0


def test_namespaced_bag_needs_the_namespace(tiny_root, tmp_path, capsys):
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 1, namespace="/robot1/")
    settings = Settings().with_changes({
        "variant": "lp_vtp_sd", "bundle.lp_vtp_sd": str(tiny_root / "lp_vtp_sd"),
        "backend": "onnx", "instruction": str(tr["instruction"])})
    with pytest.raises(BagError, match="has no topic /camera/agentview/image.*"
                                       "/robot1/camera/agentview/image"):
        replay(bag, settings)
    assert len(replay(bag, settings, namespace="robot1").published) == 1
