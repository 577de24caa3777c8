"""Controller-level execution timing with a fake clock: start stamps, the first future action,
the trajectory fields for both start modes, blending between published chunks, inpaint guidance."""

from __future__ import annotations

import numpy as np
import pytest
from controller_fakes import Clock, QuietPolicy, bundle_settings

from molmoact2_ros.control.controller import (
    Controller,
    chunk_message_fields,
    trajectory_message_fields,
)
from molmoact2_ros.control.params import Settings, validate_changes
from molmoact2_ros.policy import ActionChunk

MS = 1_000_000


class TimedPolicy(QuietPolicy):
    """Takes ``latency_ns`` of the fake clock per chunk; every chunk holds ``value``."""

    def __init__(self, clock: Clock, latency_ns: int) -> None:
        self.clock, self.latency_ns = clock, latency_ns
        self.value = 0.0
        self.guidance = []

    def predict(self, obs, guidance=None):
        self.clock.now += self.latency_ns
        self.guidance.append(guidance)
        actions = np.full((10, 7), self.value, np.float32)
        return ActionChunk(actions, actions, "grid_sampler", 10, obs.stamp_ns, "task",
                           {"total": self.latency_ns / MS})


def _controller(tmp_path, changes, latency_ns=120 * MS):
    settings = bundle_settings(tmp_path, changes)
    clock = Clock(10_000 * MS)
    policy = TimedPolicy(clock, latency_ns)
    published = []
    ctl = Controller(settings, publish=published.append, policy_factory=lambda s: policy,
                     clock_ns=clock, monotonic_ns=clock)
    ctl.configure()
    ctl.activate(worker=False)
    return ctl, clock, policy, published


def _observe(ctl, clock, age_ns):
    """An observation stamped ``age_ns`` before now, then one chunk."""
    ctl.on_observation((np.zeros((8, 8, 3), np.uint8),) * 2, np.zeros(8, np.float32),
                       clock.now - age_ns)
    return ctl.process_pending()


def test_observation_start_stamps_the_trajectory_and_marks_past_actions(tmp_path):
    ctl, clock, _, _ = _controller(tmp_path, {"execution.start": "observation"})
    obs_ns = clock.now - 30 * MS
    out = _observe(ctl, clock, 30 * MS)  # received 30 ms after the stamp, 120 ms inference
    assert out.ready_ns - obs_ns == 150 * MS
    fields = chunk_message_fields(out)
    assert fields["start_stamp_ns"] == obs_ns and fields["stamp_ns"] == obs_ns
    assert fields["first_future_index"] == 3  # rows due at +50, +100, +150 ms have passed
    traj = trajectory_message_fields(out)
    assert traj["stamp_ns"] == obs_ns
    assert [t for _, t in traj["points"]] == [(i + 1) * 50 * MS for i in range(10)]
    assert traj["joint_names"] == ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]


def test_receipt_start_has_a_zero_trajectory_stamp_and_no_past_actions(tmp_path):
    ctl, clock, _, _ = _controller(tmp_path, {"execution.start": "receipt"})
    out = _observe(ctl, clock, 30 * MS)
    fields = chunk_message_fields(out)
    assert fields["start_stamp_ns"] == out.ready_ns and fields["first_future_index"] == 0
    assert trajectory_message_fields(out)["stamp_ns"] == 0


def test_first_future_index_follows_the_clock_and_period(tmp_path):
    ctl, clock, policy, published = _controller(tmp_path, {"control_period_s": 0.02},
                                                latency_ns=199 * MS)
    assert _observe(ctl, clock, 0).first_future_index == 9  # row 9 due at 200 ms
    ctl.apply({"control_period_s": 0.1})
    assert _observe(ctl, clock, 0).first_future_index == 1
    # a chunk whose every action is already due is not published (a trajectory controller
    # would reject it as ending in the past)
    ctl.apply({"control_period_s": 0.01})
    assert _observe(ctl, clock, 0) is None and len(published) == 2
    assert ctl.drops["chunk_in_past"] == 1
    assert "execution.start=receipt" in ctl.diagnostics()["message"]
    ctl.apply({"execution.start": "receipt"})
    assert _observe(ctl, clock, 0).first_future_index == 0
    assert ctl.diagnostics()["level"] == "ok"


def test_chunk_consumed_counts_from_the_observation_stamp(tmp_path):
    ctl, clock, _, _ = _controller(tmp_path, {"trigger": "chunk_consumed"}, latency_ns=100 * MS)
    _observe(ctl, clock, 0)  # runs from now - 100 ms, ends 400 ms after now
    ctl._wake.clear()
    clock.now += 150 * MS  # 250 ms left > latency estimate 100 ms + overlap 100 ms
    ctl.tick()
    assert not ctl._wake.is_set()
    clock.now += 60 * MS  # 190 ms left
    ctl.tick()
    assert ctl._wake.is_set()


def test_crossfade_in_the_controller_and_the_last_switch_diagnostics(tmp_path):
    ctl, clock, policy, published = _controller(
        tmp_path, {"execution.blend": "crossfade"}, latency_ns=100 * MS)
    first = _observe(ctl, clock, 0)
    assert ctl.diagnostics()["values"]["last_switch.overlap_rows"] == 0
    policy.value = 1.0
    clock.now += 100 * MS
    second = _observe(ctl, clock, 0)
    # second starts 200 ms (4 rows) after the first: 6 overlap rows, 2 already due
    assert second.start_ns - first.start_ns == 200 * MS and second.first_future_index == 2
    w = np.arange(1, 5) / 5
    np.testing.assert_allclose(second.actions[:, 0], [0, 0, *w, 1, 1, 1, 1], rtol=1e-6)
    values = ctl.diagnostics()["values"]
    assert values["last_switch.overlap_rows"] == 6
    assert values["last_switch.boundary_jump"] == pytest.approx(0.2, rel=1e-5)
    assert values["execution.blend"] == "crossfade"


def test_inpaint_hands_the_executing_rows_to_the_policy(tmp_path):
    ctl, clock, policy, _ = _controller(tmp_path, {"execution.blend": "inpaint"},
                                        latency_ns=100 * MS)
    _observe(ctl, clock, 0)
    assert policy.guidance == [None, None]  # warm-up and the first chunk: nothing to continue
    clock.now += 100 * MS
    _observe(ctl, clock, 0)
    guidance = policy.guidance[-1]
    # the new chunk runs from its observation (4 rows after the old start); the latency
    # estimate (100 ms) makes 2 rows due before it is ready, and the third runs first
    assert (guidance.overlap_rows, guidance.frozen_rows) == (6, 3)
    np.testing.assert_array_equal(guidance.weights[:3], [1, 1, 1])
    assert guidance.weights[3] < 1
    assert np.all(guidance.weights[6:] == 0)


def test_execution_parameters_are_validated():
    s = Settings()
    assert validate_changes({"execution.blend": "inpaint"}, s) == (True, "")
    ok, reason = validate_changes({"execution.blend": "smooth"}, s)
    assert not ok and "execution.blend" in reason and "crossfade" in reason
    ok, reason = validate_changes({"execution.start": "now"}, s)
    assert not ok and "receipt" in reason
    assert not validate_changes({"execution.ensemble_decay": -1.0}, s)[0]
