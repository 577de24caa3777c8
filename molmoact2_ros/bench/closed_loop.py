"""``molmoact2 bench --closed-loop``: blend strategies measured on a simulated robot, ROS-free.

The real ``Controller`` runs the policy asynchronously on a virtual clock with a configured
latency (+ jitter) and the chunk_consumed trigger; the scene's observation depends on where
the robot is. Three robots: ``tracking`` follows the published JointTrajectory (absolute
targets, delta chunks integrated from the observed pose) with the timing rules of ros2_control's
joint_trajectory_controller (linear interpolation between points, the zero stamp = start at
the first sample, hold the last point); ``integrating`` applies each delta row as its step on
its tick and stops (zero step) when no row is due, as LIBERO's OSC_POSE controller is driven;
``libero`` sends the rows to LIBERO's arm itself (``closed_loop_libero.py``).

Judged over the whole run from t = 0 (a robot that never moves cannot score well): the largest
tick-to-tick change of what the robot is commanded (tracking: its target position; integrating
and libero: its step, i.e. its velocity), jerk of the executed path, time with nothing to
execute, target error, and intent error against what the policy meant: the *unguided* sample
from the same noise (inpainting) or its rows before blending (crossfade, ensemble). ``hold`` is
a baseline that keeps executing the old chunk over the whole overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..control.controller import Controller, Published, trajectory_targets
from ..control.params import Settings
from .closed_loop_scene import ACTION_DIM, DELTA_UNIT_M, Scene

#: ``libero``: LIBERO's arm under its OSC_POSE controller (``closed_loop_libero.py``)
ROBOTS = ("tracking", "integrating", "libero")
#: strategies: execution.blend values, ``pigdm`` (inpaint with the ΠGDM guidance) and
#: ``hold`` (blend none, the robot keeps the old chunk until it ends: a baseline)
STRATEGIES = ("none", "crossfade", "ensemble", "inpaint", "pigdm", "hold")

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
        self.points, self.times_ns = trajectory_targets(out).astype(np.float64), times
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


class DeltaRobot:
    """The integrating robot: on each tick the row of the newest started chunk due then is its
    step (``unit_m`` metres per unit on x, y, z); zero when no row is due (stop)."""

    def __init__(self, pose: np.ndarray, hold_old: bool = False,
                 unit_m: float = DELTA_UNIT_M) -> None:
        self.pose = np.asarray(pose, np.float64).copy()
        self.unit_m = float(unit_m)
        self.chunks: list[tuple[int, int, np.ndarray, int]] = []  # start, period, rows, seq
        self.hold_old = hold_old
        self.sequence = 0
        self.step = np.zeros_like(self.pose)

    def accept(self, out: Published, arrived_ns: int) -> bool:
        period_ns = int(round(out.settings["control_period_s"] * 1e9))
        self.chunks.append((int(out.start_ns), period_ns, out.actions.astype(np.float64),
                            out.sequence))
        del self.chunks[:-2]
        return True

    def row(self, now_ns: int) -> np.ndarray | None:
        """The row due on the tick ending at ``now_ns`` (None: nothing due, stop)."""
        # newest first; hold: oldest first, so the old chunk runs until its end
        for start, period, rows, seq in (self.chunks if self.hold_old else self.chunks[::-1]):
            i = -(-(now_ns - start) // period) - 1  # row i covers (start + i·P, start + (i+1)·P]
            if 0 <= i < len(rows):
                self.sequence = seq
                return rows[i]
            if i >= len(rows) and not self.hold_old:
                return None  # the newest chunk has played out: stop
        return None

    def sample(self, now_ns: int) -> tuple[np.ndarray, bool]:
        """Apply this tick's step; returns (the step in metres, whether nothing was due)."""
        row = self.row(now_ns)
        step = np.zeros_like(self.pose)
        if row is not None:
            step[:6] = row[:6] * self.unit_m
            self.pose[6] = row[6]
        self.pose[:6] += step[:6]
        self.step = step
        return step, row is None


@dataclass
class RunResult:
    """Metrics of one closed-loop run over the whole run from t = 0 (metres, seconds)."""

    policy: str
    scene: str
    robot: str
    action_type: str
    start: str
    blend: str
    latency_ms: float
    horizon: int
    seed: int
    switches: int
    max_step: float
    mean_jerk: float
    max_jerk: float
    waiting_s: float
    intent_error: float
    target_error: float


@dataclass
class Trace:
    """What a run executed, for the plot."""

    times_s: np.ndarray
    commands: np.ndarray  # the executed pose per tick
    switch_ticks: list[int]
    chunks: list[tuple[np.ndarray, np.ndarray]]  # (due times s, raw rows) per chunk
    #: the scene's target per tick, and each chunk's plan as ~/trajectory gives it (due times
    #: s, absolute targets: delta rows integrated from the observed pose), for the plot
    targets: np.ndarray | None = None
    plans: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


def _intended(out: Published, unguided: np.ndarray) -> Published:
    """The same published chunk with the unguided sample's rows (its intent)."""
    from dataclasses import replace

    return replace(out, actions=np.asarray(unguided, np.float32))


def run_closed_loop(policy, *, blend: str, start: str, latency_ms: float, jitter_ms: float = 0.0,
                    duration_s: float = 10.0, period_s: float = 0.05, seed: int = 0,
                    overlap_s: float = 0.1, robot: str = "tracking",
                    scene: Scene | None = None, name: str = "synthetic", arm=None,
                    changes: dict | None = None):
    """One run: returns (RunResult, Trace). ``blend`` is one of ``STRATEGIES``; the ``libero``
    robot needs ``arm``, a ``LiberoSim(cameras=False)`` (reset at the start of the run);
    ``changes``: node parameters over the bench's (e.g. ``execution.inpaint_beta``)."""
    if robot not in ROBOTS:
        raise ValueError(f"robot={robot!r}; choose one of {', '.join(ROBOTS)}")
    if robot == "libero" and arm is None:
        raise ValueError("the libero robot needs arm=LiberoSim(cameras=False)")
    scene = scene or Scene()
    clock = SimClock()
    timed = _Timed(policy, clock, latency_ms, jitter_ms, seed)
    action_type = getattr(policy, "action_type", "absolute")
    if robot != "tracking" and action_type != "delta":
        raise ValueError(f"the {robot} robot needs delta chunks")
    unit_m = float(getattr(policy, "delta_unit_m", DELTA_UNIT_M))
    unit_rad = float(getattr(policy, "delta_unit_rad", 0.5))
    settings = Settings().with_changes({
        "bundle.grid_sampler": ".", "instruction": "track the target", "trigger": "chunk_consumed",
        "control_period_s": period_s, "max_observation_age_s": 3600.0,
        "execution.start": start, "execution.overlap_s": overlap_s,
        "execution.blend": {"pigdm": "inpaint", "hold": "none"}.get(blend, blend),
        "execution.inpaint_method": "pigdm" if blend == "pigdm" else "pull",
        # the robots move the policy's unit per unit; the tracking robot's targets too
        "execution.delta_scale": [unit_m, unit_rad],
        **(changes or {}),
    })
    inflight: list[Published] = []
    ctl = Controller(settings, publish=inflight.append, policy_factory=lambda s: timed,
                     clock_ns=clock, monotonic_ns=clock)
    ctl.configure()
    ctl.activate(worker=False)
    timed.running = True
    period_ns = int(round(period_s * 1e9))
    hold = blend == "hold"
    if robot == "tracking":
        follower, intent = TrajectoryFollower(np.zeros(ACTION_DIM)), TrajectoryFollower(
            np.zeros(ACTION_DIM))
    elif robot == "integrating":
        follower = DeltaRobot(np.zeros(ACTION_DIM), hold_old=hold, unit_m=unit_m)
        intent = DeltaRobot(np.zeros(ACTION_DIM), unit_m=unit_m)
    else:
        from .closed_loop_libero import LiberoArm

        follower = LiberoArm(arm, hold_old=hold, unit_m=unit_m, seed=seed)
        intent = DeltaRobot(follower.pose, unit_m=unit_m)
    held: list[Published] = []  # hold baseline (tracking robot): chunks waiting for the old end
    unguided = getattr(policy, "unguided", {})
    commands, poses, waiting, intent_err, target_err, switch_ticks = [], [], [], [], [], []
    chunks: list[tuple[np.ndarray, np.ndarray]] = []
    plans: list[tuple[np.ndarray, np.ndarray]] = []
    targets = []
    pose = np.zeros(ACTION_DIM)
    steps_total = int(round(duration_s / period_s))
    for k in range(steps_total):
        now = k * period_ns
        clock.now = now
        previous = follower.sequence
        if inflight and inflight[0].ready_ns <= now:
            out = inflight.pop(0)
            raw = unguided.pop(int(out.chunk.observation_stamp_ns), None)
            # intent: the unguided sample (inpainting) or the policy's rows before blending
            intended = _intended(out, out.chunk.actions if raw is None else raw)
            if hold and robot == "tracking" and follower.points is not None:
                held.append(out)
            elif follower.accept(out, out.ready_ns):
                intent.accept(intended, out.ready_ns)
                due = (out.start_ns + (np.arange(len(out.actions)) + 1) * period_ns) / 1e9
                chunks.append((due, out.chunk.actions))
                plans.append((due, trajectory_targets(out)))
        if held and follower.start_ns is not None \
                and now >= follower.start_ns + follower.times_ns[-1]:
            out = held[-1]  # the old chunk has ended: the newest waiting one takes over
            held.clear()
            if follower.accept(out, now):
                intent.accept(out, now)
        command, idle = follower.sample(now)
        wanted, _ = intent.sample(now)
        if follower.sequence != previous and previous:
            switch_ticks.append(k)
        if robot == "tracking":
            pose = command.copy()
        else:
            pose = follower.pose.copy()
        commands.append(np.asarray(command, np.float64).copy())
        poses.append(pose)
        waiting.append(idle)
        intent_err.append(np.linalg.norm(np.asarray(command)[:3] - np.asarray(wanted)[:3]))
        goal = scene.target(now / 1e9)
        targets.append(goal)
        target_err.append(np.linalg.norm(pose[:2] - goal[:2]))
        if not inflight:
            ctl.tick()
            if ctl._wake.is_set():
                ctl._wake.clear()
                obs = scene.observe(now, pose)
                ctl.on_observation(obs.images, obs.state, now)
                ctl.process_pending()
                clock.now = now
    ctl.shutdown()
    cmd = np.asarray(commands)[:, :3]
    path = np.asarray(poses)[:, :3]
    steps = np.linalg.norm(np.diff(cmd, axis=0), axis=1) if len(cmd) > 1 else np.zeros(1)
    jerk = (np.linalg.norm(np.diff(path, n=3, axis=0), axis=1) / period_s**3
            if len(path) > 3 else np.zeros(1))
    result = RunResult(
        policy=name, scene=scene.name, robot=robot, action_type=action_type, start=start,
        blend=blend,
        latency_ms=latency_ms, horizon=int(getattr(policy, "horizon", 0)), seed=seed,
        switches=len(switch_ticks), max_step=float(np.max(steps)),
        mean_jerk=float(np.mean(jerk)), max_jerk=float(np.max(jerk)),
        waiting_s=float(np.sum(waiting) * period_s),
        intent_error=float(np.mean(intent_err)), target_error=float(np.mean(target_err)),
    )
    times = np.arange(len(cmd)) * period_s
    return result, Trace(times, np.asarray(poses), switch_ticks, chunks, np.asarray(targets),
                         plans)


@dataclass
class Summary:
    """One strategy over several seeds: mean and standard deviation of each metric."""

    key: tuple
    runs: list[RunResult]

    def stat(self, name: str) -> tuple[float, float]:
        values = np.array([getattr(r, name) for r in self.runs], np.float64)
        return float(values.mean()), float(values.std())


def summarise(results: list[RunResult]) -> list[Summary]:
    """Group runs that differ only in their seed."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in results:
        key = (r.policy, r.scene, r.robot, r.action_type, r.start, r.horizon, r.latency_ms, r.blend)
        groups.setdefault(key, []).append(r)
    return [Summary(k, v) for k, v in groups.items()]


def format_table(results: list[RunResult]) -> str:
    """Mean ± standard deviation over seeds; ``/none`` is the largest step against none's;
    the table ends with one line per latency saying which blend suits it and why."""
    summaries = summarise(results)
    head = (f"{'scene':<10} {'robot':<11} {'start':<8} {'H':>3} {'lat ms':>6} {'blend':<9} "
            f"{'seeds':>5} {'max step mm':>13} {'/none':>5} {'jerk m/s3':>11} {'wait s':>11} "
            f"{'target mm':>11} {'intent mm':>11}")
    lines = [head, "-" * len(head)]
    none = {s.key[:-1]: s.stat("max_step")[0] for s in summaries if s.key[-1] == "none"}
    for s in summaries:
        _, scene, robot, _, start, horizon, latency, blend = s.key
        ref = none.get(s.key[:-1])
        step, step_sd = s.stat("max_step")
        ratio = f"{step / ref:5.2f}" if ref else f"{'-':>5}"
        jerk, jerk_sd = s.stat("mean_jerk")
        wait, wait_sd = s.stat("waiting_s")
        target, target_sd = s.stat("target_error")
        intent, intent_sd = s.stat("intent_error")
        lines.append(
            f"{scene:<10} {robot:<11} {start:<8} {horizon:3d} {latency:6.0f} {blend:<9} "
            f"{len(s.runs):5d} {step * 1e3:6.2f}±{step_sd * 1e3:<6.2f} {ratio} "
            f"{jerk:5.1f}±{jerk_sd:<5.1f} {wait:5.2f}±{wait_sd:<5.2f} "
            f"{target * 1e3:5.1f}±{target_sd * 1e3:<5.1f} "
            f"{intent * 1e3:5.2f}±{intent_sd * 1e3:<5.2f}")
    lines += [f"which blend per latency (it must halve none's largest step within "
              f"{TARGET_COST:+.0%} target error in every scene and robot run):",
              *recommendations(results)]
    return "\n".join(lines)


#: what a blend must do to be worth it: halve none's largest step ...
STEP_RATIO = 0.5
#: ... while adding at most this much target error (the lag a blend costs)
TARGET_COST = 0.10
BLENDS_COMPARED = ("crossfade", "ensemble", "inpaint", "pigdm")


def recommendations(results: list[RunResult]) -> list[str]:
    """One line per latency: the blend that halves the largest step against ``none`` within
    +10 % target error in every scene and robot run at that latency (the least target error
    among those), or ``none`` with why."""
    summaries = summarise(results)
    lines = []
    for latency in sorted({s.key[6] for s in summaries}):
        at = [s for s in summaries if s.key[6] == latency]
        none = {s.key[:-1]: s for s in at if s.key[-1] == "none"}
        if not none:
            lines.append(f"{latency:g} ms: no advice (run with --blends none to compare)")
            continue
        per_group: dict[tuple, dict[str, tuple[float, float]]] = {}
        for s in at:
            ref = none.get(s.key[:-1])
            if s.key[-1] not in BLENDS_COMPARED or ref is None:
                continue
            step = s.stat("max_step")[0] / max(ref.stat("max_step")[0], 1e-12)
            cost = s.stat("target_error")[0] / max(ref.stat("target_error")[0], 1e-12) - 1.0
            per_group.setdefault(s.key[:-1], {})[s.key[-1]] = (step, cost)
        if not per_group:
            lines.append(f"{latency:g} ms: none (no blend was run beside it)")
            continue
        # a run where no chunk overlaps the next (every blend is none there) says nothing
        live = [g for g in per_group.values()
                if any(abs(st - 1.0) > 1e-9 or abs(c) > 1e-9 for st, c in g.values())]
        if not live:
            lines.append(f"{latency:g} ms: none: no chunk overlaps the next at this latency, so "
                         "every blend runs as none")
            continue
        worst: dict[str, tuple[float, float]] = {}
        for group in live:
            for blend, (step, cost) in group.items():
                prev = worst.get(blend, (0.0, -np.inf))
                worst[blend] = (max(prev[0], step), max(prev[1], cost))
        good = {b: v for b, v in worst.items() if v[0] <= STEP_RATIO and v[1] <= TARGET_COST}
        if good:
            blend, (step, cost) = min(good.items(), key=lambda kv: kv[1][1])
            lines.append(f"{latency:g} ms: {blend}: halves the largest step (at worst "
                         f"{step:.2f} of none's) for at most {cost:+.0%} target error")
            continue
        blend, (step, cost) = min(worst.items(), key=lambda kv: max(kv[1][0] / STEP_RATIO,
                                                                    kv[1][1] / TARGET_COST))
        why = (f"halving the largest step costs more than {TARGET_COST:+.0%} target error "
               "(the blend adds lag)" if step <= STEP_RATIO
               else "no blend halves the largest step")
        lines.append(f"{latency:g} ms: none: {why}; the closest, {blend}, gives {step:.2f} of "
                     f"none's largest step at {cost:+.0%} target error (a blend needs <= "
                     f"{STEP_RATIO:g} at <= {TARGET_COST:+.0%})")
    return lines


def write_plot(traces: dict[str, Trace], path: Path, title: str, window_s: tuple[float, float]):
    """Per strategy, around the switches: the target, each chunk's plan (the ~/trajectory it
    became) and the executed x; a plan that starts away from the path is a jump, an executed
    path that trails the target is lag (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 2.5 * len(traces)), sharex=True,
                             sharey=True)
    axes = np.atleast_1d(axes)
    lo, hi = window_s
    for ax, (blend, trace) in zip(axes, traces.items()):
        keep = (trace.times_s >= lo) & (trace.times_s <= hi)
        if trace.targets is not None and len(trace.targets):
            ax.step(trace.times_s[keep], trace.targets[keep, 0], where="post", color="0.2",
                    lw=1.0, ls="--")
        for due, plan in trace.plans:
            shown = (due >= lo - 0.5) & (due <= hi + 0.5)
            if shown.any():  # on top of the executed path, its first row marked
                ax.plot(due[shown], plan[shown, 0], color="C1", lw=1.0, zorder=3)
                ax.plot(due[:1], plan[:1, 0], "o", color="C1", ms=3, zorder=3)
        ax.plot(trace.times_s[keep], trace.commands[keep, 0], color="C0", lw=3.0, alpha=0.45)
        for i in trace.switch_ticks:
            if lo <= trace.times_s[i] <= hi:
                ax.axvline(trace.times_s[i], color="C3", lw=0.6, alpha=0.7)
        ax.set_xlim(lo, hi)
        ax.set_ylabel("x (m)")
        ax.set_title(f"blend={blend}", fontsize=9, loc="left")
    axes[0].plot([], [], color="0.2", lw=1.0, ls="--", label="target")
    axes[0].plot([], [], color="C1", lw=1.0, marker="o", ms=3, label="each chunk's plan (o: row 0)")
    axes[0].plot([], [], color="C0", lw=3.0, alpha=0.45, label="executed x")
    axes[0].plot([], [], color="C3", lw=0.6, label="chunk switch")
    axes[0].legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1].set_xlabel("time (s)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
