"""A real robot's state in LIBERO's convention: the frame the pose is read in, the quaternion's
hemisphere and the finger signs. LIBERO's own observation, re-expressed as a tf2 source would
give it (w >= 0, in the robot's base frame, both fingers positive), must come back to the same
8 state tokens the simulator gives."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.control.params import Settings, validate_changes
from molmoact2_ros.host.state import (
    StateConvention,
    axis_angle_to_quat,
    quat_mul,
    quat_rotate,
    state_bins,
    state_from_pose,
)

#: LIBERO's robot0_base in its world (every suite's scene, measured in the simulator)
BASE = np.array([-0.66, 0.0, 0.912])
FRANKA = StateConvention(transform=(*BASE, 0.0, 0.0, 0.0, 1.0), hemisphere="nearest_stats",
                         finger_signs=(1.0, -1.0))


@pytest.fixture(scope="module")
def stats(tiny_root):
    return Bundle.open(tiny_root, "grid_sampler").norm_stats().state


def _as_tf2(pos_world, quat_world, fingers, base_pos, base_quat=(0.0, 0.0, 0.0, 1.0)):
    """What a tf2 lookup base_link -> ee and a Franka's JointState report for LIBERO's pose."""
    inv = np.array([-base_quat[0], -base_quat[1], -base_quat[2], base_quat[3]])
    pos = quat_rotate(inv, np.asarray(pos_world) - np.asarray(base_pos))
    quat = quat_mul(inv, quat_world)
    quat = quat if quat[3] >= 0 else -quat  # tf2 sources keep w >= 0
    return state_from_pose(pos, quat, np.abs(fingers))


def test_the_issue_values_roll_past_pi(stats):
    """LIBERO's roll 3.30 is -2.98 from a w >= 0 source: its token goes from ~245 to 0."""
    aa = 3.30 * np.array([1.0, 0.0, -0.028]) / np.linalg.norm([1.0, 0.0, -0.028])
    quat = axis_angle_to_quat(aa)
    assert quat[3] < 0  # MuJoCo's sign, continuous with the joints
    libero = state_from_pose([-0.21, -0.01, 1.17], quat, [0.0387, -0.0387])
    robot = _as_tf2([-0.21, -0.01, 1.17], quat, [0.0387, -0.0387], BASE)
    assert libero[3] == pytest.approx(3.30, abs=0.01) and robot[3] == pytest.approx(-2.98, abs=0.01)
    want, raw = state_bins(libero, stats), state_bins(robot, stats)
    assert want[3] >= 240 and raw[3] == 0
    assert raw[2] != want[2] and raw[7] != want[7]  # z in base_link, the second finger's sign
    assert state_bins(FRANKA.apply(robot, stats), stats).tolist() == want.tolist()


def test_each_parameter_alone(stats):
    aa = 3.30 * np.array([1.0, 0.0, -0.028]) / np.linalg.norm([1.0, 0.0, -0.028])
    libero = state_from_pose([-0.21, -0.01, 1.17], axis_angle_to_quat(aa), [0.0387, -0.0387])
    flipped = state_from_pose([-0.21, -0.01, 1.17], -axis_angle_to_quat(aa), [0.0387, -0.0387])
    hemi = StateConvention(hemisphere="nearest_stats").apply(flipped, stats)
    assert np.allclose(hemi, libero, atol=1e-5)
    assert np.allclose(StateConvention(hemisphere="keep").apply(flipped, stats), flipped)
    moved = StateConvention(transform=(*BASE, 0, 0, 0, 1)).apply(
        np.concatenate([libero[:3] - BASE, libero[3:]]).astype(np.float32))
    assert np.allclose(moved, libero, atol=1e-5)
    fingers = StateConvention(finger_signs=(1.0, -1.0)).apply(
        np.concatenate([libero[:6], [0.0387, 0.0387]]).astype(np.float32))
    assert fingers[7] == pytest.approx(-0.0387)


def test_libero_observations_come_back_to_the_simulator_tokens(libero_arm, stats):
    """Rolls from LIBERO's home pose, one way then the other: its quaternion's w crosses 0."""
    step = libero_arm.reset("libero_spatial", 0, 0)

    def base(env):
        sim = (env.env if hasattr(env, "env") else env).sim
        return (np.array(sim.data.get_body_xpos("robot0_base")),
                np.array(sim.data.get_body_xquat("robot0_base")))  # w, x, y, z

    base_pos, wxyz = libero_arm.call(base)
    base_quat = np.array([*wxyz[1:], wxyz[0]])
    convention = StateConvention(transform=(*base_pos, *base_quat),
                                 hemisphere="nearest_stats", finger_signs=(1.0, -1.0))
    signs = set()
    for i in range(20):
        quat = np.asarray(step.extra["eef_quat"])
        signs.add(bool(quat[3] >= 0))
        robot = _as_tf2(step.eef_pos, quat, step.gripper_qpos, base_pos, base_quat)
        assert state_bins(convention.apply(robot, stats), stats).tolist() == \
            state_bins(step.state, stats).tolist(), i
        step = libero_arm.step([0.0, 0.0, 0.0, 0.6 if i < 6 else -0.6, 0.0, 0.0, -1.0])
    assert signs == {True, False}, "the walk never crossed w = 0"


@pytest.mark.parametrize("name,value,words", [
    ("state.frame_transform", [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0], "norm 2.0000"),
    ("state.frame_transform", [0.0] * 6, "7 finite numbers"),
    ("state.finger_signs", [1.0, 0.5], "each 1.0 or -1.0"),
    ("state.quaternion_hemisphere", "auto", "keep, nearest_stats"),
])
def test_bad_state_parameters_are_refused(name, value, words):
    ok, reason = validate_changes({name: value}, Settings())
    assert not ok and words in reason, reason


def test_replay_report_shows_the_state_tokens_against_the_training_range(tiny_root, tmp_path,
                                                                          capsys):
    """A bag of LIBERO's state read in the robot's base frame: x sits 0.66 m off LIBERO's
    world, outside the training range, until state.frame_transform moves it back."""
    import json

    from replay_helpers import obs_bag, run_cli, trace

    tr = dict(trace(tiny_root))
    tr["state"] = np.asarray(tr["state"], np.float32) - np.array([*BASE, 0, 0, 0, 0, 0],
                                                                    np.float32)
    bag = obs_bag(tmp_path / "obs", tr, 3)
    base = ["replay", bag, "--bundle-root", tiny_root, "--variant", "grid_sampler",
            "--instruction", str(tr["instruction"])]
    rc, out, err = run_cli([*base, "--report", tmp_path / "raw"], capsys)
    assert rc == 0, out + err
    raw = json.loads((tmp_path / "raw" / "summary.json").read_text())["state_tokens"]
    assert raw["observations"] == 3 and "x" in raw["outside"], raw
    x = next(d for d in raw["dimensions"] if d["name"] == "x")
    assert x["tokens"] == [255, 255] and x["raw"][0] > x["training"][1], x
    rc, out, err = run_cli([*base, "--report", tmp_path / "fixed", "--set",
                            f"state.frame_transform={BASE[0]},0,{BASE[2]},0,0,0,1"],
                           capsys)
    assert rc == 0, out + err
    fixed = json.loads((tmp_path / "fixed" / "summary.json").read_text())["state_tokens"]
    assert "x" not in fixed["outside"], fixed
    x = next(d for d in fixed["dimensions"] if d["name"] == "x")
    assert 0 < x["tokens"][0] <= x["tokens"][1] < 255, x
