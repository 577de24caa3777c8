"""``molmoact2 bench --closed-loop``: blend strategies measured on a simulated robot, ROS-free.

A kinematic robot samples the published chunks at the control rate with the timing rules of
ros2_control's joint_trajectory_controller (linear interpolation between points, the zero stamp
= start at the first sample, hold the last point); the real ``Controller`` runs the policy
asynchronously on a virtual clock with a configured latency (+ jitter) and the chunk_consumed
trigger; the scene's observation depends on where the robot is. Reports per strategy and
latency the largest/mean jump at chunk switches, mean jerk, waiting time and tracking error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..control.controller import Controller, Published
from ..control.params import Settings
from .closed_loop_scene import ACTION_DIM, Scene

MS = 1_000_000


class SimClock:
    """Virtual time in ns."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class _Timed:
    """Wraps a policy so that a chunk takes ``latency + jitter`` of virtual time."""

    def __init__(self, policy, clock: SimClock, latency_ms: float, jitter_ms: float, seed: int):
        self.policy, self.clock = policy, clock
        self.latency_ms, self.jitter_ms = latency_ms, jitter_ms
        self.rng = np.random.default_rng(seed)
        self.flow_steps = getattr(policy, "flow_steps", 10)
        self.running = False

    def predict(self, obs, guidance=None):
        chunk = (self.policy.predict(obs) if guidance is None
                 else self.policy.predict(obs, guidance=guidance))
        if self.running:
            jitter = self.rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0.0
            self.clock.now += int(max(self.latency_ms + jitter, 1.0) * MS)
        return chunk

    def __getattr__(self, name):
        return getattr(self.policy, name)


class TrajectoryFollower:
    """The robot's side: joint_trajectory_controller sampling semantics on plain arrays."""

    def __init__(self, command: np.ndarray) -> None:
        self.command = np.asarray(command, np.float64)
        self.points: np.ndarray | None = None
        self.times_ns: np.ndarray | None = None
        self.start_ns: int | None = None
        self.stamp_ns = 0
        self.last_sample_ns = 0
        self.before = (0, self.command.copy())  # (time, command) the first point is reached from
        self.sequence = 0

    def accept(self, out: Published, arrived_ns: int) -> bool:
        """A trajectory arrives; one with a non-zero stamp that already ended is rejected."""
        period_ns = int(round(out.settings["control_period_s"] * 1e9))
        times = (np.arange(out.actions.shape[0]) + 1) * period_ns
        if out.trajectory_stamp_ns and out.trajectory_stamp_ns + times[-1] < arrived_ns:
            return False
        self.points, self.times_ns = out.actions.astype(np.float64), times
        self.stamp_ns, self.start_ns = out.trajectory_stamp_ns, None
        self.sequence = out.sequence
        return True

    def sample(self, now_ns: int) -> tuple[np.ndarray, bool]:
        """The command at ``now_ns`` and whether the trajectory has played out (waiting)."""
        if self.points is None:
            self.last_sample_ns = now_ns
            return self.command, True
        if self.start_ns is None:  # first sample: as with interpolate_from_desired_state,
            self.start_ns = self.stamp_ns or now_ns  # from the last command and its time
            self.before = (self.last_sample_ns, self.command.copy())
        self.last_sample_ns = now_ns
        due = self.start_ns + self.times_ns
        if now_ns < due[0]:
            t0, c0 = self.before
            f = min(max((now_ns - t0) / max(due[0] - t0, 1), 0.0), 1.0)
            self.command = c0 + f * (self.points[0] - c0)
            return self.command, False
        if now_ns >= due[-1]:
            self.command = self.points[-1]
            return self.command, now_ns > due[-1]
        i = int(np.searchsorted(due, now_ns, side="right")) - 1
        f = (now_ns - due[i]) / (due[i + 1] - due[i])
        self.command = self.points[i] + f * (self.points[i + 1] - self.points[i])
        return self.command, False


@dataclass
class RunResult:
    """Metrics of one closed-loop run (action units; times in seconds)."""

    policy: str
    start: str
    blend: str
    latency_ms: float
    switches: int
    max_jump: float
    mean_jump: float
    mean_step: float
    max_step: float
    mean_jerk: float
    waiting_s: float
    intent_error: float
    target_error: float


@dataclass
class Trace:
    """What a run executed, for the plot."""

    times_s: np.ndarray
    commands: np.ndarray
    switch_ticks: list[int]
    chunks: list[tuple[np.ndarray, np.ndarray]]  # (due times s, raw actions) per chunk


def run_closed_loop(policy, *, blend: str, start: str, latency_ms: float, jitter_ms: float = 0.0,
                    duration_s: float = 10.0, period_s: float = 0.05, seed: int = 0,
                    overlap_s: float = 0.25,
                    scene: Scene | None = None, name: str = "synthetic"):
    """One run: returns (RunResult, Trace)."""
    scene = scene or Scene()
    clock = SimClock()
    timed = _Timed(policy, clock, latency_ms, jitter_ms, seed)
    settings = Settings().with_changes({
        "bundle.grid_sampler": ".", "instruction": "track the target", "trigger": "chunk_consumed",
        "control_period_s": period_s, "max_observation_age_s": 3600.0,
        "execution.start": start, "execution.blend": blend, "execution.overlap_s": overlap_s,
    })
    inflight: list[Published] = []
    ctl = Controller(settings, publish=inflight.append, policy_factory=lambda s: timed,
                     clock_ns=clock)
    ctl.configure()
    ctl.activate(worker=False)
    timed.running = True
    period_ns = int(round(period_s * 1e9))
    robot = TrajectoryFollower(np.zeros(ACTION_DIM))
    raw: list[tuple[int, np.ndarray]] = []  # (start ns, raw chunk) of every accepted chunk
    commands, waiting, intent_err, target_err, switch_ticks = [], [], [], [], []
    chunks: list[tuple[np.ndarray, np.ndarray]] = []
    started = False
    for k in range(int(round(duration_s / period_s))):
        now = k * period_ns
        clock.now = now
        previous = robot.sequence
        if inflight and inflight[0].ready_ns <= now:
            out = inflight.pop(0)
            if robot.accept(out, out.ready_ns):
                raw.append((out.start_ns, out.chunk.actions.astype(np.float64)))
                due = (out.start_ns + (np.arange(len(out.actions)) + 1) * period_ns) / 1e9
                chunks.append((due, out.chunk.actions))
        command, idle = robot.sample(now)
        if robot.sequence != previous and previous:
            switch_ticks.append(len(commands))
        started = started or robot.points is not None
        if started:
            commands.append(command.copy())
            waiting.append(idle)
            if raw:
                s0, rows = raw[-1]
                i = int(np.clip(round((now - s0) / period_ns) - 1, 0, len(rows) - 1))
                intent_err.append(np.linalg.norm(command - rows[i]))
            target_err.append(np.linalg.norm(command[:2] - scene.target(now / 1e9)[:2]))
        if not inflight:
            ctl.tick()
            if ctl._wake.is_set():
                ctl._wake.clear()
                obs = scene.observe(now, command)
                ctl.on_observation(obs.images, obs.state, now)
                ctl.process_pending()
                clock.now = now
    ctl.shutdown()
    cmd = np.asarray(commands)
    steps = np.linalg.norm(np.diff(cmd, axis=0), axis=1) if len(cmd) > 1 else np.zeros(1)
    # a switch's jump: the larger of the command steps into the switch tick and the next one
    # (a zero-stamped trajectory reaches its first point over two control cycles)
    jumps = np.array([steps[i - 1:i + 1].max() for i in switch_ticks if 0 < i <= len(steps)]
                     or [0.0])
    jerk = np.diff(cmd, n=3, axis=0) / period_s**3 if len(cmd) > 3 else np.zeros((1, 1))
    result = RunResult(
        policy=name, start=start, blend=blend, latency_ms=latency_ms,
        switches=len(switch_ticks), max_jump=float(np.max(jumps)),
        mean_jump=float(np.mean(jumps)), mean_step=float(np.mean(steps)),
        max_step=float(np.max(steps)), mean_jerk=float(np.mean(np.linalg.norm(jerk, axis=1))),
        waiting_s=float(np.sum(waiting) * period_s),
        intent_error=float(np.mean(intent_err)) if intent_err else 0.0,
        target_error=float(np.mean(target_err)) if target_err else 0.0,
    )
    times = np.arange(len(cmd)) * period_s + (k + 1 - len(cmd)) * period_s
    return result, Trace(times, cmd, switch_ticks, chunks)


def format_table(results: list[RunResult]) -> str:
    head = (f"{'policy':<10} {'start':<11} {'blend':<9} {'lat ms':>6} {'switch':>6} "
            f"{'max jump':>9} {'mean jump':>9} {'/none':>6} {'step':>7} {'max step':>8} "
            f"{'jerk':>7} "
            f"{'wait s':>7} {'intent':>7} {'target':>7}")
    lines = [head, "-" * len(head)]
    none = {(r.policy, r.start, r.latency_ms): r.max_jump for r in results if r.blend == "none"}
    for r in results:
        ref = none.get((r.policy, r.start, r.latency_ms))
        ratio = f"{r.max_jump / ref:6.2f}" if ref else f"{'-':>6}"
        lines.append(
            f"{r.policy:<10} {r.start:<11} {r.blend:<9} {r.latency_ms:6.0f} {r.switches:6d} "
            f"{r.max_jump:9.4f} {r.mean_jump:9.4f} {ratio} {r.mean_step:7.4f} {r.max_step:8.4f} "
            f"{r.mean_jerk:7.1f} "
            f"{r.waiting_s:7.2f} {r.intent_error:7.4f} {r.target_error:7.4f}")
    return "\n".join(lines)


def write_plot(traces: dict[str, Trace], path: Path, title: str, window_s: tuple[float, float]):
    """Executed x command around the switches, one panel per strategy (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 2.3 * len(traces)), sharex=True,
                             sharey=True)
    axes = np.atleast_1d(axes)
    lo, hi = window_s
    for ax, (blend, trace) in zip(axes, traces.items()):
        keep = (trace.times_s >= lo) & (trace.times_s <= hi)
        for due, rows in trace.chunks:
            inside = (due >= lo) & (due <= hi)
            if inside.any():
                ax.plot(due[inside], rows[inside, 0], color="0.75", lw=0.8)
        ax.plot(trace.times_s[keep], trace.commands[keep, 0], color="C0", lw=1.8,
                label="executed x")
        for i in trace.switch_ticks:
            if lo <= trace.times_s[i] <= hi:
                ax.axvline(trace.times_s[i], color="C3", lw=0.6, alpha=0.7)
        ax.set_ylabel("x (m)")
        ax.set_title(f"blend={blend}", fontsize=9, loc="left")
    axes[0].plot([], [], color="0.75", label="raw chunks (as predicted)")
    axes[0].plot([], [], color="C3", lw=0.6, label="chunk switch")
    axes[0].legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
