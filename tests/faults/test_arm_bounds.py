"""Commands far from what was meant: a change of what a row means mid-chunk, states and targets
that are not finite or not sane, a gripper known by its name, targets outside the arm's reach.
Each publishes nothing (saying why once per episode of the fault), starts clean or is clamped
and counted; never a target kilometres away."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from controller_fakes import Clock, QuietPolicy, bundle_settings

from molmoact2_ros.control.controller import Controller, trajectory_message_fields
from molmoact2_ros.control.params import Settings
from molmoact2_ros.policy import ActionChunk

pytestmark = pytest.mark.usefixtures("no_leaks")

MS = 1_000_000
#: LIBERO's start pose in its table scenes (x, y, z, axis-angle, two fingers), measured
POSE = np.array([-0.211, -0.011, 1.174, 3.141, -0.003, -0.088, 0.039, -0.039], np.float32)


class Scripted(QuietPolicy):
    """A policy that never reads the state (as a replacement policy or the simulator's may):
    every chunk is ``rows``, ready ``latency_ns`` after it was asked for."""

    def __init__(self, clock: Clock, latency_ns: int = 20 * MS) -> None:
        self.clock, self.latency_ns = clock, latency_ns
        self.rows = np.zeros((10, 7), np.float32)

    def predict(self, obs, guidance=None):
        self.clock.now += self.latency_ns
        rows = np.asarray(self.rows, np.float32).copy()
        return ActionChunk(rows, rows, "grid_sampler", 10, obs.stamp_ns, "task",
                           {"total": self.latency_ns / MS})


def _rig(tmp_path, **changes):
    settings = bundle_settings(tmp_path, changes)
    clock = Clock(10_000 * MS)
    policy = Scripted(clock)
    published: list = []
    ctl = Controller(settings, publish=published.append, policy_factory=lambda s: policy,
                     clock_ns=clock, monotonic_ns=clock)
    ctl.configure()
    ctl.activate(worker=False)
    return ctl, clock, policy, published


def _step(ctl, clock, state=POSE, advance_ns=0):
    """Advance the clock, then one observation stamped now and its chunk."""
    clock.now += advance_ns
    ctl.on_observation((np.zeros((8, 8, 3), np.uint8),) * 2, np.asarray(state, np.float32),
                       clock.now)
    return ctl.process_pending()


def _change(ctl, changes):
    ok, reason, _ = ctl.request(changes)
    assert ok, reason


def test_absolute_to_delta_mid_chunk_does_not_blend_targets_into_steps(tmp_path):
    # absolute targets near the arm's pose, crossfaded; then the rows become steps of 0.01
    ctl, clock, policy, _ = _rig(tmp_path, **{"execution.action_type": "absolute",
                                              "execution.blend": "crossfade"})
    policy.rows = np.tile(POSE[:7], (10, 1))
    policy.rows[:, 6] = -1.0
    assert _step(ctl, clock) is not None
    _change(ctl, {"execution.action_type": "delta"})
    policy.rows = np.full((10, 7), 0.01, np.float32)
    policy.rows[:, 6] = -1.0
    out = _step(ctl, clock, advance_ns=100 * MS)  # two rows of the first chunk still ahead
    first = out.actions[out.first_future_index]
    assert np.allclose(first[:6], 0.01), first
    assert ctl.last_switch["overlap_rows"] == 0


def test_delta_to_absolute_mid_chunk_does_not_pull_targets_toward_steps(tmp_path):
    ctl, clock, policy, _ = _rig(tmp_path, **{"execution.action_type": "delta",
                                              "execution.blend": "ensemble"})
    policy.rows = np.full((10, 7), 0.01, np.float32)
    assert _step(ctl, clock) is not None
    _change(ctl, {"execution.action_type": "absolute"})
    policy.rows = np.tile(POSE[:7], (10, 1))
    out = _step(ctl, clock, advance_ns=100 * MS)
    np.testing.assert_allclose(out.actions, policy.rows, atol=1e-6)
    targets = np.array([p for p, _ in trajectory_message_fields(out)["points"]])
    np.testing.assert_allclose(targets, policy.rows, atol=1e-6)


def test_a_new_gripper_dimension_ends_blending_too(tmp_path):
    ctl, clock, policy, _ = _rig(tmp_path, **{"execution.action_type": "delta",
                                              "execution.blend": "crossfade"})
    policy.rows = np.full((10, 7), 0.5, np.float32)
    assert _step(ctl, clock) is not None
    _change(ctl, {"execution.gripper_dim": 0})
    policy.rows = np.full((10, 7), 0.01, np.float32)
    out = _step(ctl, clock, advance_ns=100 * MS)
    assert ctl.last_switch["overlap_rows"] == 0
    assert np.allclose(out.actions[out.first_future_index], 0.01)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e30, -50.0])
def test_a_state_that_is_not_finite_or_not_sane_publishes_nothing(tmp_path, bad, caplog):
    ctl, clock, policy, published = _rig(tmp_path, **{"execution.action_type": "delta"})
    policy.rows = np.full((10, 7), 0.1, np.float32)
    state = POSE.copy()
    state[0] = bad
    with caplog.at_level(logging.WARNING, logger="molmoact2_ros"):
        for _ in range(3):
            assert _step(ctl, clock, state, advance_ns=MS) is None
    assert published == [] and ctl.drops["unsafe_state"] == 3
    said = [r.getMessage() for r in caplog.records if "state" in r.getMessage()]
    assert len(said) == 1, said  # once per episode of the fault
    assert ("not finite" if not np.isfinite(bad) else "safety.sanity_state_abs") in said[0]
    assert "nothing published" in said[0]
    assert ctl.diagnostics()["level"] == "error"
    assert _step(ctl, clock, advance_ns=MS) is not None  # a sane state: the episode ends
    assert ctl.diagnostics()["level"] == "ok"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="molmoact2_ros"):
        assert _step(ctl, clock, state, advance_ns=MS) is None
    assert sum("state" in r.getMessage() for r in caplog.records) == 1  # a new episode


def test_targets_beyond_the_sanity_bound_publish_nothing(tmp_path):
    # absolute rows of 1e6 (a garbage output no limit was set for) never reach ~/trajectory
    ctl, clock, policy, published = _rig(tmp_path, **{"execution.action_type": "absolute"})
    policy.rows = np.full((10, 7), 1e6, np.float32)
    assert _step(ctl, clock) is None and published == []
    assert ctl.drops["unsafe_target"] == 1
    assert "safety.sanity_target_abs" in ctl.diagnostics()["message"]


def test_the_gripper_is_named_by_a_parameter_not_by_its_name(tmp_path):
    names = ["x", "y", "z", "roll", "pitch", "yaw", "finger"]
    ctl, clock, policy, _ = _rig(tmp_path, **{"execution.action_type": "delta",
                                              "action_names": names})
    policy.rows = np.full((10, 7), 0.5, np.float32)
    out = _step(ctl, clock)
    targets = np.array([p for p, _ in trajectory_message_fields(out)["points"]])
    assert np.allclose(targets[:, 6], 0.5)  # dim 6 (execution.gripper_dim) is a command
    _change(ctl, {"execution.gripper_dim": -1, "action_names": list("abcdefg")})
    out = _step(ctl, clock, advance_ns=MS)
    targets = np.array([p for p, _ in trajectory_message_fields(out)["points"]])
    scale_m = Settings()["execution.delta_scale"][0]
    np.testing.assert_allclose(np.diff(targets[:, 6]), 0.5 * scale_m, rtol=1e-5)  # integrated


BOX = {"safety.workspace_min": [-0.4, -0.3, 1.0], "safety.workspace_max": [0.0, 0.3, 1.25]}


def test_targets_outside_the_workspace_are_clamped_and_counted(tmp_path):
    ctl, clock, policy, _ = _rig(tmp_path, **{"execution.action_type": "delta", **BOX})
    policy.rows = np.zeros((10, 7), np.float32)
    policy.rows[:, 2] = 1.0  # straight up: 1.174 + 0.0125 per row passes z = 1.25 at row 7
    out = _step(ctl, clock)
    targets = np.array([p for p, _ in trajectory_message_fields(out)["points"]])
    assert targets[:, 2].max() == pytest.approx(1.25) and targets[5, 2] < 1.25
    assert ctl.counts["workspace_clamped"] == 4 and out.safety.clamped_to_workspace == 4
    # the steps in ~/action_chunk say the same: integrated they end on the box
    assert POSE[2] + out.actions[:, 2].sum() * 0.0125 == pytest.approx(1.25, abs=1e-6)


def test_targets_outside_the_workspace_hold_the_chunk_when_asked(tmp_path, caplog):
    ctl, clock, policy, published = _rig(tmp_path, **{
        "execution.action_type": "delta", "safety.workspace_mode": "hold", **BOX})
    policy.rows = np.zeros((10, 7), np.float32)
    policy.rows[:, 2] = 1.0
    with caplog.at_level(logging.WARNING, logger="molmoact2_ros"):
        assert _step(ctl, clock) is None and _step(ctl, clock, advance_ns=MS) is None
    assert published == [] and ctl.drops["outside_workspace"] == 2
    said = [r.getMessage() for r in caplog.records if "workspace" in r.getMessage()]
    assert len(said) == 1 and "safety.workspace_max" in said[0]


def test_a_pose_outside_the_workspace_publishes_nothing(tmp_path):
    # clamping would jump the arm back into the box in one step: nothing is published
    ctl, clock, policy, published = _rig(tmp_path, **{"execution.action_type": "delta", **BOX})
    state = POSE.copy()
    state[0] = 0.3
    assert _step(ctl, clock, state) is None and published == []
    assert ctl.drops["outside_workspace"] == 1
    assert "observed pose" in ctl.diagnostics()["message"]


# -- property: whatever the validator accepts, what is published is finite and in bounds -------
def _draw(rng) -> dict:
    """One batch of parameter values, valid or not (the validator decides)."""
    def maybe(value):
        return value if rng.random() < 0.6 else None

    def vec(n, lo, hi):
        return [float(v) for v in 10.0 ** rng.uniform(lo, hi, n) * rng.choice([-1, 1], n)]

    centre = POSE[:3].astype(float) + rng.normal(0, 0.2, 3)
    half = 10.0 ** rng.uniform(-2, 0, 3)
    draws = {
        "execution.delta_scale": maybe([float(10.0 ** rng.uniform(-4, 3)) for _ in range(2)]),
        "execution.action_type": maybe(str(rng.choice(["bundle", "delta", "absolute"]))),
        "execution.gripper_dim": maybe(int(rng.integers(-2, 9))),
        "execution.blend": maybe(str(rng.choice(["none", "crossfade", "ensemble", "inpaint"]))),
        "execution.start": maybe(str(rng.choice(["observation", "receipt", "auto"]))),
        "action_min": maybe([0.0] if rng.random() < 0.3 else vec(7, -3, 1)),
        "action_max": maybe([0.0] if rng.random() < 0.3 else vec(7, -3, 1)),
        "max_step_delta": maybe([0.0] if rng.random() < 0.3 else vec(7, -4, 1)),
        "safety.workspace_min": maybe([0.0] if rng.random() < 0.3
                                      else (centre - half).tolist()),
        "safety.workspace_max": maybe([0.0] if rng.random() < 0.3
                                      else (centre + half).tolist()),
        "safety.workspace_mode": maybe(str(rng.choice(["clamp", "hold"]))),
        "safety.sanity_state_abs": maybe(float(10.0 ** rng.uniform(-3, 7))),
        "safety.sanity_target_abs": maybe(float(10.0 ** rng.uniform(-3, 7))),
    }
    return {k: v for k, v in draws.items() if v is not None}


def _state(rng) -> np.ndarray:
    state = POSE.astype(np.float64) + rng.normal(0, 0.05, 8)
    if rng.random() < 0.2:
        state[rng.integers(8)] = rng.choice([np.nan, np.inf, 10.0 ** rng.uniform(0, 40)])
    return state.astype(np.float32)


def _rows(rng) -> np.ndarray:
    rows = rng.normal(0, 1, (10, 7)) * 10.0 ** (rng.uniform(-3, 0) if rng.random() < 0.8
                                                else rng.uniform(0, 6))
    if rng.random() < 0.1:
        rows[rng.integers(10), rng.integers(7)] = np.nan
    return rows.astype(np.float32)


def _check_bounds(out) -> None:
    """Everything ~/action_chunk and ~/trajectory would carry is finite and inside the bounds
    of the settings the chunk was made with."""
    s, actions = out.settings, np.asarray(out.actions, np.float32)
    assert np.isfinite(actions).all()
    lo, hi, step = s.limits()
    if lo:
        assert (actions >= np.float32(lo)).all()
    if hi:
        assert (actions <= np.float32(hi)).all()
    first = out.first_future_index
    if step and first < len(actions):
        step = np.asarray(step, np.float64)
        slack = step * 1e-6 + 1e-7
        if out.action_type == "delta":
            gripper = s["execution.gripper_dim"]
            dims = [d for d in range(7) if d != gripper]
            assert (np.abs(actions[first:, dims]) <= step[dims] + slack[dims]).all()
        else:
            assert (np.abs(np.diff(actions[first:], axis=0)) <= step + slack).all()
    targets = np.array([p for p, _ in trajectory_message_fields(out)["points"]])
    assert np.isfinite(targets).all()
    assert np.abs(targets).max() <= s["safety.sanity_target_abs"]
    box = s.workspace()
    if box is not None:
        assert (targets[:, :3] >= np.asarray(box[0]) - 1e-9).all()
        assert (targets[:, :3] <= np.asarray(box[1]) + 1e-9).all()


@pytest.mark.parametrize("seed", range(24))
def test_any_accepted_parameters_publish_only_finite_bounded_targets(tmp_path, seed):
    rng = np.random.default_rng(seed)
    ctl, clock, policy, published = _rig(tmp_path)
    accepted = 0
    for _ in range(20):
        for name, value in _draw(rng).items():  # one at a time, as `ros2 param set` does
            ok, _, _ = ctl.request({name: value})
            accepted += ok
        policy.rows = _rows(rng)
        _step(ctl, clock, _state(rng), advance_ns=int(rng.integers(0, 600)) * MS)
    for out in published:
        _check_bounds(out)
    print(f"seed {seed}: {accepted} values accepted, {len(published)} chunks published")
    assert accepted and published  # the draws reach the controller and chunks come out
