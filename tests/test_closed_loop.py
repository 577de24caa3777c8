"""Closed-loop benchmark: trajectory-controller sampling rules, the scene, the synthetic policy,
and the acceptance numbers of ``molmoact2 bench --closed-loop`` (seeded, synthetic policy)."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.bench.closed_loop import TrajectoryFollower, run_closed_loop
from molmoact2_ros.bench.closed_loop_scene import Scene, TargetTrackingPolicy, locate_target
from molmoact2_ros.control.controller import Published
from molmoact2_ros.control.params import Settings
from molmoact2_ros.control.safety import SafetyReport
from molmoact2_ros.policy import ActionChunk

MS = 1_000_000


def _published(rows, stamp_ns, sequence=1):
    actions = np.asarray(rows, np.float32)[:, None].repeat(7, axis=1)
    chunk = ActionChunk(actions, actions, "v", 1, stamp_ns, "task", {})
    return Published(chunk, actions, sequence, SafetyReport(), Settings(), 0, 0,
                     stamp_ns, stamp_ns, 0)


def test_zero_stamp_starts_at_the_first_sample_and_blends_in_from_the_current_command():
    robot = TrajectoryFollower(np.zeros(7))
    robot.sample(0)
    assert robot.accept(_published([1.0, 2.0, 3.0], 0), arrived_ns=20 * MS)
    # first sample at 40 ms: start = 40 ms, point 0 due at 90 ms; linear from the last
    # command (0 at the previous sample, 0 ms)
    cmd, idle = robot.sample(40 * MS)
    assert cmd[0] == pytest.approx(40 / 90) and not idle
    assert robot.sample(90 * MS)[0][0] == pytest.approx(1.0)
    assert robot.sample(115 * MS)[0][0] == pytest.approx(1.5)
    cmd, idle = robot.sample(190 * MS)  # last point due exactly now: not waiting yet
    assert cmd[0] == 3.0 and not idle
    cmd, idle = robot.sample(200 * MS)  # played out: holds the last point
    assert cmd[0] == 3.0 and idle


def test_a_stamp_in_the_past_samples_inside_the_trajectory_and_one_that_ended_is_rejected():
    robot = TrajectoryFollower(np.zeros(7))
    # stamped 120 ms ago: points due at -70, -20, +30 ms relative to now (50 ms period)
    assert robot.accept(_published([1.0, 2.0, 3.0], 1000 * MS), arrived_ns=1120 * MS)
    assert robot.sample(1125 * MS)[0][0] == pytest.approx(2.5)  # half way from point 1 to 2
    late = _published([5.0, 6.0, 7.0], 800 * MS, sequence=2)  # ended at 950 ms
    assert not robot.accept(late, arrived_ns=1130 * MS)
    assert robot.sequence == 1


def test_the_scene_shows_the_target_and_the_state_carries_the_robot():
    scene = Scene()
    robot = np.array([0.05, -0.02, 0.1, 0, 0, 0, 0.5])
    obs = scene.observe(1_500 * MS, robot)
    np.testing.assert_allclose(locate_target(obs.images[0]), scene.target(1.5)[:2], atol=1e-3)
    np.testing.assert_allclose(obs.state[:3], robot[:3])
    assert obs.state[6] == pytest.approx(0.5) and obs.state[7] == pytest.approx(-0.5)


def test_the_synthetic_flow_samples_its_gaussian():
    scene, policy = Scene(), TargetTrackingPolicy(horizon=8, seed=1)
    obs = scene.observe(0, np.zeros(7))
    chunks = np.stack([policy.predict(obs).actions for _ in range(400)])
    mean = policy.plan_mean(obs)
    sd = np.sqrt(np.diag(policy.cov)) * policy.scale_m
    # the sample mean sits within 4 standard errors of the plan, the spread near the model's
    assert np.all(np.abs(chunks.mean(0) - mean) < 4 * sd[:, None] / np.sqrt(400))
    assert np.allclose(chunks.std(0), sd[:, None], rtol=0.25)


@pytest.mark.parametrize("latency_ms", [300, 600])
def test_crossfade_and_inpaint_halve_the_largest_switch_jump_without_more_waiting(latency_ms):
    results = {}
    for blend in ("none", "crossfade", "inpaint"):
        results[blend], _ = run_closed_loop(
            TargetTrackingPolicy(seed=0), blend=blend, start="receipt", latency_ms=latency_ms,
            jitter_ms=30, duration_s=8.0, seed=0)
    none = results["none"]
    assert none.switches >= 5
    for blend in ("crossfade", "inpaint"):
        assert results[blend].max_jump <= 0.5 * none.max_jump, (blend, results[blend], none)
        assert results[blend].waiting_s <= none.waiting_s


def test_cli_prints_the_table_and_writes_the_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from molmoact2_ros.cli.app import main

    png = tmp_path / "closed_loop.png"
    code = main(["bench", "--closed-loop", "--latencies-ms", "300", "--duration-s", "7",
                 "--plot", str(png), "--json", str(tmp_path / "cl.json")])
    out = capsys.readouterr().out
    assert code == 0 and png.stat().st_size > 10_000
    for blend in ("none", "crossfade", "ensemble", "inpaint"):
        assert f"synthetic  receipt     {blend:<9} {300:6d}" in out


def test_the_tiny_bundle_runs_closed_loop_with_inpainting_in_its_flow_loop(tiny_root):
    pytest.importorskip("onnxruntime")
    from molmoact2_ros.policy import Policy

    class Recording:
        """Delegates to the real policy and keeps the guidance it was given."""

        def __init__(self, policy):
            self.policy, self.guided = policy, []
            self.flow_steps = policy.flow_steps

        def predict(self, obs, guidance=None):
            chunk = self.policy.predict(obs, guidance=guidance)
            if guidance is not None:
                want = self.policy.norm_stats.action.normalize(guidance.prefix)
                frozen = guidance.frozen_rows
                self.guided.append(np.abs(chunk.actions_normalized[:frozen] - want[:frozen]).max())
            return chunk

        def __getattr__(self, name):
            return getattr(self.policy, name)

    with Policy.load(tiny_root / "lp_vtp_sd", backend="onnx", instruction="track the target",
                     seed=0) as policy:
        recording = Recording(policy)
        result, trace = run_closed_loop(recording, blend="inpaint", start="receipt",
                                        latency_ms=300, duration_s=2.0, seed=0, name="tiny")
    assert result.switches >= 3 and np.isfinite(trace.commands).all()
    # every chunk after the first was inpainted, its frozen rows exactly on the executing ones
    assert len(recording.guided) >= 3 and max(recording.guided) == 0.0
