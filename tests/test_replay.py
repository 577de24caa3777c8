"""Rosbag replay against golden outputs: a real rosbag2 file through the node's logic."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.golden import compare, load_npz
from molmoact2_ros.params import Settings

pytest.importorskip("rosbags")
from molmoact2_ros.replay import (  # noqa: E402
    ChunkBagWriter,
    replay,
    typestore,
    write_observation_bag,
)


def _settings(tiny_root, trace, variant="grid_sampler"):
    return Settings().with_changes({
        "variant": variant, f"bundle.{variant}": str(tiny_root / variant), "backend": "onnx",
        "instruction": str(trace["instruction"]), "seed": int(trace["seed"]),
        "flow_steps": int(trace["flow_steps"]), "max_observation_age_s": 1.0,
    })


@pytest.mark.parametrize("mcap", [False, True])
def test_replayed_bag_reproduces_the_golden_chunk(tiny_root, tmp_path, mcap):
    trace = load_npz(tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz")
    settings = _settings(tiny_root, trace)
    frames = [(10**9 + i * 5 * 10**8, trace["image_primary"], trace["image_wrist"],
               trace["state"]) for i in range(3)]
    bag = tmp_path / "obs"
    write_observation_bag(bag, frames, settings, mcap=mcap)
    out_bag = tmp_path / "chunks"
    writer = ChunkBagWriter(out_bag)
    try:
        result = replay(bag, settings, on_published=writer.write)
    finally:
        writer.close()
    assert result.synced == 3 and len(result.published) == 3  # one chunk per observation
    first = result.published[0]
    assert first.chunk.observation_stamp_ns == 10**9
    row = compare("replay", "chunk", first.actions, trace["chunk"])
    assert row.passed, row
    # later chunks draw fresh noise from the same seeded generator: different actions
    assert not np.allclose(result.published[1].actions, first.actions)

    from rosbags.highlevel import AnyReader

    with AnyReader([out_bag], default_typestore=typestore()) as reader:
        msgs = [reader.deserialize(raw, c.msgtype) for c, _, raw in reader.messages()]
    assert [m.sequence for m in msgs] == [1, 2, 3]
    np.testing.assert_array_equal(np.asarray(msgs[0].actions).reshape(10, 7), first.actions)
    assert msgs[0].variant == "grid_sampler" and list(msgs[0].action_names)[-1] == "gripper"


def test_replay_skips_unsynchronised_and_invalid_frames(tiny_root, tmp_path):
    trace = load_npz(tiny_root / "lp_vtp_sd" / "golden" / "e2e_trace.npz")
    settings = _settings(tiny_root, trace, "lp_vtp_sd")
    bad_state = trace["state"].copy()
    bad_state[2] = np.nan
    frames = [
        (10**9, trace["image_primary"], trace["image_wrist"], trace["state"]),
        (2 * 10**9, trace["image_primary"], trace["image_wrist"], bad_state),
    ]
    bag = tmp_path / "obs"
    write_observation_bag(bag, frames, settings)
    result = replay(bag, settings)
    assert len(result.published) == 1 and result.drops.get("ObservationError") == 1
    too_far = settings.with_changes({"sync.slop_s": 0.001})  # wrist is 3 ms after primary
    assert replay(bag, too_far).synced == 0


def test_replay_names_missing_topics(tiny_root, tmp_path):
    trace = load_npz(tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz")
    settings = _settings(tiny_root, trace)
    bag = tmp_path / "obs"
    write_observation_bag(bag, [(10**9, trace["image_primary"], trace["image_wrist"],
                                 trace["state"])], settings)
    from molmoact2_ros.errors import MolmoActError

    with pytest.raises(MolmoActError, match="has no topic .*/cam/left"):
        replay(bag, settings.with_changes({"topics.image_primary": "cam/left"}))
