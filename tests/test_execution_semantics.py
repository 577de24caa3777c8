"""Execution as the robot takes it: the step clamp at the takeover row, blending across a live
``control_period_s`` change, latency on a monotonic clock, ``start=auto``, delta rows (stop
after the last row, targets integrated for the JointTrajectory), inpaint mask and guidance."""

from __future__ import annotations

import math

import numpy as np
import pytest
from controller_fakes import Clock, QuietPolicy, bundle_settings

from molmoact2_ros.control.controller import (
    Controller,
    chunk_message_fields,
    trajectory_message_fields,
)
from molmoact2_ros.control.execution import (
    Executing,
    LatencyTracker,
    chunk_timing,
    delta_dims,
    inpaint_weights,
    resolve_action_type,
)
from molmoact2_ros.control.params import Settings, validate_changes
from molmoact2_ros.host.flow import per_step_weights, pigdm_weight
from molmoact2_ros.policy import ActionChunk

MS = 1_000_000


class PlanPolicy(QuietPolicy):
    """Samples one plan ``value(t)`` at its chunk's row times (observation stamp + (i+1)·P);
    a chunk takes ``latency_ns`` on both clocks, plus ``jump_ns`` on the node clock only."""

    def __init__(self, clock: Clock, mono: Clock, latency_ns: int, value, period) -> None:
        self.clock, self.mono, self.latency_ns = clock, mono, latency_ns
        self.value, self.period = value, period
        self.jump_ns = 0
        self.guidance = []
        self.action_type = None

    def predict(self, obs, guidance=None):
        self.guidance.append(guidance)
        p = self.period()
        times = obs.stamp_ns + (np.arange(10) + 1) * p
        actions = np.stack([np.full(7, self.value(t), np.float32) for t in times])
        self.clock.now += self.latency_ns + self.jump_ns
        self.mono.now += self.latency_ns
        return ActionChunk(actions, actions, "grid_sampler", 10, obs.stamp_ns, "task",
                           {"total": self.latency_ns / MS})


def _rig(tmp_path, changes, latency_ns=120 * MS, value=lambda t: 0.0):
    settings = bundle_settings(tmp_path, changes)
    clock, mono = Clock(10_000 * MS), Clock(5 * MS)
    holder = {}
    policy = PlanPolicy(clock, mono, latency_ns, value,
                        lambda: int(round(holder["ctl"].settings["control_period_s"] * 1e9)))
    published = []
    ctl = Controller(settings, publish=published.append, policy_factory=lambda s: policy,
                     clock_ns=clock, monotonic_ns=mono)
    holder["ctl"] = ctl
    ctl.configure()
    ctl.activate(worker=False)
    return ctl, clock, policy, published


def _observe(ctl, clock, state=None):
    state = np.zeros(8, np.float32) if state is None else np.asarray(state, np.float32)
    ctl.on_observation((np.zeros((8, 8, 3), np.uint8),) * 2, state, clock.now)
    return ctl.process_pending()


# -- defect: the step clamp measured against the previous chunk's last row -----------------------
def test_step_clamp_measures_the_first_future_row_against_the_executing_row():
    ramp = 0.05 / (50 * MS)  # 0.05 per 50 ms row: under the 0.06 limit everywhere
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        ctl, clock, _, published = _rig(Path(tmp), {"max_step_delta": [0.06] * 7},
                                        value=lambda t: ramp * (t - 10_000 * MS))
        first = _observe(ctl, clock)
        clock.now += 100 * MS
        second = _observe(ctl, clock)
    assert first.safety.clamped_step_delta == 0
    # a continuous ramp stays continuous: nothing clamped, no jump at the takeover
    assert second.safety.clamped_step_delta == 0
    # the chunk is the plan, and its first future row is one 0.05 step past what the robot
    # executes on the tick before (the old clamp measured it against the old last row, 0.5)
    row = second.first_future_index
    due = second.start_ns + (np.arange(10) + 1) * 50 * MS
    np.testing.assert_allclose(second.actions[:, 0], ramp * (due - 10_000 * MS), atol=1e-6)
    executing = np.interp(due[row] - 50 * MS, first.start_ns + (np.arange(10) + 1) * 50 * MS,
                          first.actions[:, 0])
    assert float(second.actions[row, 0]) - executing == pytest.approx(0.05, abs=1e-6)


def test_step_clamp_leaves_rows_already_due_alone(tmp_path):
    ctl, clock, policy, _ = _rig(tmp_path, {"max_step_delta": [0.06] * 7})
    first = _observe(ctl, clock)
    policy.value = lambda t: 1.0  # a new plan far from the executing one
    clock.now += 100 * MS
    second = _observe(ctl, clock)
    k = second.first_future_index
    assert k == 2 and first.actions.max() == 0.0
    np.testing.assert_array_equal(second.actions[:k], 1.0)  # already due: as predicted
    np.testing.assert_allclose(second.actions[k:, 0], 0.06 * np.arange(1, 11 - k), rtol=1e-5)


# -- defect: blending across a live control_period_s change paired rows by index --------------
@pytest.mark.parametrize("blend", ["crossfade", "ensemble"])
def test_blending_across_a_period_change_pairs_rows_by_time(tmp_path, blend):
    slope = 2.0 / 1e9  # the plan: 2 units per second
    ctl, clock, _, _ = _rig(tmp_path, {"execution.blend": blend}, latency_ns=60 * MS,
                            value=lambda t: slope * (t - 10_000 * MS))
    _observe(ctl, clock)
    ctl.apply({"control_period_s": 0.025})
    clock.now += 40 * MS
    second = _observe(ctl, clock)
    times = second.start_ns + (np.arange(10) + 1) * 25 * MS
    want = slope * (times - 10_000 * MS)
    assert ctl.last_switch["overlap_rows"] > 0
    np.testing.assert_allclose(second.actions[:, 0], want, atol=1e-5)


def test_inpaint_prefix_across_a_period_change_is_the_executing_plan_at_the_new_times(tmp_path):
    slope = 2.0 / 1e9
    ctl, clock, policy, _ = _rig(tmp_path, {"execution.blend": "inpaint"}, latency_ns=60 * MS,
                                 value=lambda t: slope * (t - 10_000 * MS))
    _observe(ctl, clock)
    ctl.apply({"control_period_s": 0.025})
    clock.now += 40 * MS
    second = _observe(ctl, clock)
    g = policy.guidance[-1]
    times = second.start_ns + (np.arange(g.overlap_rows) + 1) * 25 * MS
    np.testing.assert_allclose(g.prefix[: g.overlap_rows, 0], slope * (times - 10_000 * MS),
                               atol=1e-5)


def test_delta_rows_resampled_on_a_new_grid_keep_the_integrated_path():
    rows = np.array([[1.0], [2.0], [3.0], [4.0]], np.float32)
    old = Executing(rows, 0, 50 * MS, delta=np.array([True]))
    new = old.on_grid(25 * MS)
    assert len(new.actions) == 8 and new.actions.sum() == pytest.approx(10.0)
    np.testing.assert_allclose(new.actions[:, 0], [0.5, 0.5, 1, 1, 1.5, 1.5, 2, 2])


# -- defect: latency as the mean of wall-clock samples on the node clock ------------------------
@pytest.mark.parametrize("jump_s", [-100.0, 3600.0])
def test_a_clock_jump_during_inference_does_not_corrupt_the_latency(tmp_path, jump_s):
    ctl, clock, policy, _ = _rig(tmp_path, {"trigger": "chunk_consumed"}, latency_ns=100 * MS)
    _observe(ctl, clock)
    clock.now += 50 * MS
    policy.jump_ns = int(jump_s * 1e9)
    _observe(ctl, clock)
    policy.jump_ns = 0
    assert 0.0 <= ctl.latency_estimate_s <= 0.5
    assert ctl.latency_estimate_s == pytest.approx(0.1)
    assert ctl.counts["latency_samples_dropped"] == 1
    # chunk_consumed keeps working on the new time line
    _observe(ctl, clock)
    ctl._wake.clear()
    clock.now += 250 * MS
    ctl.tick()
    assert ctl._wake.is_set()


def test_latency_estimate_is_a_high_percentile_clamped_to_the_chunk():
    tracker = LatencyTracker(window=20)
    for _ in range(19):
        tracker.add(0.1)
    tracker.add(0.3)
    assert tracker.estimate(0.5) == pytest.approx(np.quantile([0.1] * 19 + [0.3], 0.95))
    assert tracker.estimate(0.5) > 0.1  # the mean (0.11) would hide the slow one
    assert not tracker.add(-100.0) and not tracker.add(float("nan"))
    tracker.add(2.0)
    assert tracker.estimate(0.3) == 0.3 and tracker.maximum() == 2.0
    for _ in range(20):
        tracker.add(0.2)
    assert tracker.estimate(0.5) == pytest.approx(0.2)  # the window forgets


# -- start modes -------------------------------------------------------------------------------
@pytest.mark.parametrize("latency_ms,auto,first_obs", [
    (100, "observation", 2), (300, "receipt", 6), (600, "receipt", 10), (900, "receipt", 10)])
def test_start_modes_at_the_latencies_of_the_docs(latency_ms, auto, first_obs):
    period, delay = 50 * MS, latency_ms * MS
    obs = chunk_timing("observation", 0, delay, period, 10)
    assert obs.first_future_index == first_obs  # 10: every row due, the chunk is dropped
    receipt = chunk_timing("receipt", 0, delay, period, 10)
    assert (receipt.start_ns, receipt.first_future_index) == (delay, 0)
    chosen = chunk_timing("auto", 0, delay, period, 10, next_latency_ns=delay,
                          overlap_ns=100 * MS)
    assert chosen.mode == auto


def test_auto_is_the_default_with_a_non_zero_overlap():
    s = Settings()
    assert s["execution.start"] == "auto" and s["execution.overlap_s"] > 0


def test_a_blend_that_never_overlaps_warns_in_diagnostics(tmp_path):
    ctl, clock, _, _ = _rig(tmp_path, {"execution.blend": "crossfade"}, latency_ns=20 * MS)
    for _ in range(6):
        _observe(ctl, clock)
        clock.now += 1000 * MS  # each chunk (500 ms) ends long before the next
    d = ctl.diagnostics()
    assert d["level"] == "warn" and "met no executing rows" in d["message"]


# -- delta rows ----------------------------------------------------------------------------------
def test_delta_chunks_stop_after_the_last_row_and_hold_the_gripper():
    rows = np.array([[0.2] * 6 + [1.0]] * 3, np.float32)
    ex = Executing(rows, 0, 50 * MS, delta=delta_dims("delta", 6))
    after = ex.at_rows(0, 5)
    np.testing.assert_array_equal(after[:3], rows)
    np.testing.assert_array_equal(after[3:, :6], 0.0)
    np.testing.assert_array_equal(after[3:, 6], 1.0)
    absolute = Executing(rows, 0, 50 * MS).at_rows(0, 5)
    np.testing.assert_array_equal(absolute[4], rows[-1])  # a target is held


def test_action_type_from_the_bundle_or_the_setting():
    class Declares:
        action_type = "delta"

    assert resolve_action_type("bundle", Declares()) == "delta"
    assert resolve_action_type("bundle", object()) == "absolute"
    assert resolve_action_type("absolute", Declares()) == "absolute"
    assert not validate_changes({"execution.action_type": "velocity"}, Settings())[0]
    assert not validate_changes({"execution.delta_scale": [0.05]}, Settings())[0]


def _rx(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _rz(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def _matrix(v):
    """Axis-angle to matrix, written out for the test (exp of the skew matrix by series)."""
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]], np.float64)
    out, term = np.eye(3), np.eye(3)
    for n in range(1, 30):
        term = term @ k / n
        out = out + term
    return out


def test_delta_chunk_messages_carry_the_steps_and_integrated_targets(tmp_path):
    ctl, clock, policy, published = _rig(
        tmp_path, {"execution.action_type": "delta", "max_step_delta": [0.5] * 7,
                   "execution.delta_scale": [0.05, 0.5]},
        value=lambda t: 0.0)
    policy.value = lambda t: 0.8  # every step 0.8 units: above the 0.5 step limit
    state = [0.1, 0.2, 0.3, 0.0, 0.0, 0.3, 0.04, -0.04]
    out = _observe(ctl, clock, state)
    first = out.first_future_index
    f = chunk_message_fields(out)
    assert f["action_type"] == "delta" and f["start_mode"] == "observation"
    # the step clamp bounds each delta row itself (rows already due left alone)
    np.testing.assert_allclose(out.actions[first:, :6], 0.5)
    np.testing.assert_allclose(out.actions[:first, :6], 0.8)
    # the gripper is an absolute command: chained, here constant and unclamped
    np.testing.assert_allclose(out.actions[:, 6], 0.8)
    t = trajectory_message_fields(out)
    positions = np.array([p for p, _ in t["points"]])
    steps = out.actions.astype(np.float64)
    np.testing.assert_allclose(positions[:, :3],
                               np.array(state[:3]) + 0.05 * np.cumsum(steps[:, :3], axis=0),
                               atol=1e-9)
    rotation = _rz(0.3)
    for i in range(10):
        rotation = _matrix(0.5 * steps[i, 3:6]) @ rotation
        np.testing.assert_allclose(_matrix(positions[i, 3:6]), rotation, atol=1e-7)
    np.testing.assert_array_equal(positions[:, 6], steps[:, 6])


def test_rotations_about_one_axis_add_and_about_two_axes_compose_in_the_base_frame():
    from molmoact2_ros.control.delta import integrate_targets

    rows = np.zeros((2, 7))
    rows[0, 5] = 0.2  # 0.1 rad about z
    rows[1, 3] = 0.4  # then 0.2 rad about x, in the base frame
    pose = np.array([0, 0, 0, 0, 0, 0.3])
    out = integrate_targets(rows, pose, np.array([True] * 6 + [False]), 0.05, 0.5)
    np.testing.assert_allclose(out[0, 3:6], [0, 0, 0.4], atol=1e-12)
    np.testing.assert_allclose(_matrix(out[1, 3:6]), _rx(0.2) @ _rz(0.4), atol=1e-9)


# -- inpainting ----------------------------------------------------------------------------------
def test_per_step_pulls_compound_to_the_mask():
    mask = np.array([1.0, 0.9, 0.43, 0.1, 0.0], np.float32)
    for n in (1, 2, 10):
        p = per_step_weights(mask, n).astype(np.float64)
        np.testing.assert_allclose(1.0 - (1.0 - p) ** n, mask, atol=1e-6)
        assert p[0] == 1.0 and p[-1] == 0.0


def test_pigdm_weight_is_the_published_formula():
    assert pigdm_weight(0.5, 5.0) == pytest.approx(2.0)  # (τ²+(1−τ)²)/(τ(1−τ)) at ½
    assert pigdm_weight(0.3, 5.0) == pytest.approx((0.09 + 0.49) / (0.3 * 0.7))
    assert pigdm_weight(0.05, 5.0) == 5.0 and pigdm_weight(0.0, 5.0) == 5.0
    assert pigdm_weight(0.5, 1.0) == 1.0


@pytest.mark.parametrize("schedule,want", [
    ("hard", [1, 1, 0, 0, 0, 0]),
    ("linear", [1, 1, 0.75, 0.5, 0.25, 0]),
    ("exp", [1, 1, *(c * math.expm1(c) / math.expm1(1) for c in (0.75, 0.5, 0.25)), 0]),
])
def test_inpaint_schedules(schedule, want):
    np.testing.assert_allclose(inpaint_weights(2, 5, 6, schedule), want, rtol=1e-6)


def test_frozen_rows_and_weights_are_recorded(tmp_path):
    ctl, clock, policy, _ = _rig(tmp_path, {"execution.blend": "inpaint",
                                            "execution.inpaint_schedule": "linear",
                                            "execution.inpaint_method": "pull"},
                                 latency_ns=100 * MS)
    _observe(ctl, clock)
    clock.now += 100 * MS
    out = _observe(ctl, clock)
    g = policy.guidance[-1]
    assert g.method == "pull" and g.frozen_rows == 3
    f = chunk_message_fields(out)
    assert f["inpaint_frozen_rows"] == 3 and f["inpaint_method"] == "pull"
    np.testing.assert_array_equal(f["inpaint_weights"], g.weights)
    values = ctl.diagnostics()["values"]
    assert values["last_switch.inpaint_frozen_rows"] == 3
    assert values["last_switch.inpaint_weights"].startswith("1,1,1,")
