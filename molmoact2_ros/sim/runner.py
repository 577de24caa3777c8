"""Closed-loop LIBERO episodes through the node's own controller, ROS-free.

One ``EpisodeRunner`` holds one simulator and one policy behind the node's ``Controller``
(loaded once) and runs any number of ``(suite, task, init)`` episodes. The controller reads a
sim clock, as replay drives it on a bag clock: observations carry sim-time stamps, chunk timing
(``execution.start``), blending, safety and triggers run as in the node, and the simulator plays
the published rows by their stamps (``executor.py``). Time modes:

- ``lockstep``: sim time stands still while the policy computes (independent of machine speed;
  the usual offline evaluation);
- ``latency``: a chunk becomes executable ``latency`` after its observation in sim time (a fixed
  ``latency_ms``, e.g. the board's, or the measured wall time of each chunk); meanwhile the sim
  keeps executing the previous chunk, or a zero command;
- ``realtime``: wall clock, through ROS (the ``libero_sim`` node, with GPU rendering or the node
  on the board over DDS); not run in-process.

Each episode gives a plain-data record (``EpisodeRecord.to_json``) for the ledger; its
wall-clock measurements sit apart under ``timing``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..control.chunk_io import PolicyFactory, load_policy
from ..control.controller import Controller, Published
from ..control.params import Settings
from ..control.stamps import CLOCK_JUMP_BACK_S
from ..errors import MolmoActError
from .executor import ChunkExecutor
from .libero_env import LiberoSim, SimStep
from .policy_status import WorstStatus
from .protocol import EXECUTION, episode_seeds

TIME_MODES = ("lockstep", "latency", "realtime")
#: Sim time of each episode's reset; every episode starts here again (a backward clock jump).
EPISODE_T0_NS = 1_000_000_000
#: Before a reset the clock runs on to at least this far past the next episode's first step,
#: so that the jump back is a clock reset for the controller (``CLOCK_JUMP_BACK_S``), however
#: early the last episode ended.
MIN_EPISODE_NS = int((CLOCK_JUMP_BACK_S + 0.5) * 1e9)
#: The node protocol's settings: infer when the chunk is consumed (the node's
#: ``execution.overlap_s`` early), LIBERO's delta end-effector rows, reproducible noise;
#: everything else is the node's default. ``protocol.EXECUTION`` holds both protocols'.
EVAL_DEFAULTS = {**EXECUTION["node"], "seed": 7}
#: The controller's status is sampled every this many steps (1 s of sim time, as the node's
#: diagnostics), after the reset and at the end of each episode.
DIAGNOSTICS_STEPS = 20
log = logging.getLogger("molmoact2_ros.sim.runner")


@dataclass(frozen=True)
class EpisodeSpec:
    """Which episode: a task of a suite from one of its fixed init states."""

    suite: str
    task_id: int
    init_index: int

    @property
    def key(self) -> str:
        return f"{self.suite}/{self.task_id}/{self.init_index}"


@dataclass
class EpisodeTiming:
    """Wall-clock measurements of an episode (machine-dependent; everything else is not)."""

    wall_s: float = 0.0
    reset_s: float = 0.0
    build_s: float = 0.0
    settle_s: float = 0.0
    #: mean bare ``env.step`` (physics and both cameras), timed on the env thread
    env_step_ms: float = 0.0
    #: mean per step of everything else in the loop: controller tick, executor, the hand-off
    #: to the env thread, image rotation and state (inference and video excluded)
    overhead_ms: float = 0.0
    video_ms: float = 0.0
    inference_ms: list[float] = field(default_factory=list)
    sim_steps_per_s: float = 0.0


@dataclass
class EpisodeRecord:
    """One finished episode as plain data (one line of ``episodes.jsonl``)."""

    key: str
    suite: str
    task_id: int
    init_index: int
    instruction: str
    #: ``ok``; ``refused``: the policy refused the instruction (counted as a failure)
    status: str = "ok"
    reason: str = ""
    success: bool = False
    #: the episode's env and flow-noise seeds (``protocol.episode_seeds``)
    env_seed: int = 0
    noise_seed: int = 0
    steps: int = 0
    max_steps: int = 0
    settle_steps: int = 0
    sim_time_s: float = 0.0
    time_mode: str = "lockstep"
    latency_ms: float = 0.0
    chunks: int = 0
    rows_executed: int = 0
    rows_skipped: int = 0
    idle_steps: int = 0
    #: largest change of the executed command's pose dims (x y z roll pitch yaw) from one step
    #: to the next, in the action's units: the jump a switch of chunks gives the robot
    largest_command_change: float = 0.0
    clipped_steps: int = 0
    clipped_values: int = 0
    #: the latency each chunk had in sim time (lockstep: 0)
    chunk_latency_ms: list[float] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    video: str = ""
    #: the worst status the policy reported during the episode (``policy_status.WorstStatus``:
    #: worst, message, statuses, stalls); None in ledgers written before it was recorded
    policy_diagnostics: dict[str, Any] | None = None
    timing: EpisodeTiming = field(default_factory=EpisodeTiming)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeRecord:
        data = dict(data)
        timing = EpisodeTiming(**data.pop("timing", {}))
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known}, timing=timing)


class SimClock:
    """Sim time in ns for the controller; it never runs backwards except by ``jump_to``."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def advance_to(self, t_ns: int) -> None:
        self.now = max(self.now, int(t_ns))

    def jump_to(self, t_ns: int) -> None:
        self.now = int(t_ns)


class _TimedPolicy:
    """The policy as the controller sees it: ``latency`` mode advances the sim clock by the
    chunk's latency while it computes (fixed, or its measured wall time)."""

    def __init__(self, policy, clock: SimClock, mode: str, latency_ms: float) -> None:
        self.policy, self.clock, self.mode, self.latency_ms = policy, clock, mode, latency_ms
        self.flow_steps = getattr(policy, "flow_steps", 10)
        self.running = False
        self.wall_ms: list[float] = []

    def predict(self, obs, guidance=None):
        t = time.perf_counter()
        chunk = (self.policy.predict(obs) if guidance is None
                 else self.policy.predict(obs, guidance=guidance))
        wall_ms = (time.perf_counter() - t) * 1e3
        if self.running:
            self.wall_ms.append(wall_ms)
            if self.mode == "latency":
                ms = self.latency_ms if self.latency_ms > 0 else wall_ms
                self.clock.now += int(round(ms * 1e6))
        return chunk

    def set_flow_steps(self, steps: int) -> None:
        self.policy.set_flow_steps(steps)
        self.flow_steps = getattr(self.policy, "flow_steps", steps)

    def __getattr__(self, name):
        return getattr(self.policy, name)


class EpisodeRunner:
    """One simulator + one policy (behind the node's controller), many episodes."""

    def __init__(
        self,
        sim: LiberoSim,
        settings: Settings,
        *,
        policy_factory: PolicyFactory = load_policy,
        time_mode: str = "lockstep",
        latency_ms: float = 0.0,
        max_steps: int | None = None,
        seed: int = 0,
        video_dir: Path | None = None,
        videos: str = "all",
        keep_row_log: bool = False,
    ) -> None:
        if time_mode == "realtime":
            raise MolmoActError(
                "time mode realtime runs on the wall clock through ROS: ros2 launch "
                "molmoact2_ros libero.launch.py time_mode:=realtime (needs rendering faster "
                "than 20 Hz); in-process, use lockstep or latency")
        if time_mode not in TIME_MODES:
            raise MolmoActError(f"time mode {time_mode!r}; choose one of {', '.join(TIME_MODES)}")
        if latency_ms < 0:
            raise MolmoActError(f"latency_ms={latency_ms} must be >= 0 (0 = measured)")
        if videos not in ("all", "failures", "none"):
            raise MolmoActError(f"videos={videos!r}; choose all, failures or none")
        self.sim = sim
        self.time_mode = time_mode
        self.latency_ms = float(latency_ms)
        self.max_steps = max_steps
        self.seed = int(seed)
        self.video_dir = Path(video_dir) if video_dir is not None else None
        self.videos = videos if video_dir is not None else "none"
        if self.videos != "none":
            from .video import check_video_support

            check_video_support()
        self.clock = SimClock()
        self.period_ns = int(round(settings["control_period_s"] * 1e9))
        if abs(settings["control_period_s"] - sim.period_s) > 1e-9:
            raise MolmoActError(
                f"control_period_s={settings['control_period_s']} but LIBERO steps at "
                f"{sim.period_s} s (20 Hz); set control_period_s=0.05")
        self.executor = ChunkExecutor(self.period_ns, keep_log=keep_row_log)
        self._policies: list[_TimedPolicy] = []

        def factory(s: Settings):
            timed = _TimedPolicy(policy_factory(s), self.clock, time_mode, self.latency_ms)
            self._policies.append(timed)
            return timed

        #: the latest published chunks (tests and reports read them)
        self.published: deque[Published] = deque(maxlen=256)
        # latency is measured on the sim clock too: on the wall clock, lockstep episodes would
        # depend on the machine's speed and on the episodes run before them
        self.controller = Controller(settings, publish=self.published.append,
                                     policy_factory=factory, clock_ns=self.clock,
                                     monotonic_ns=self.clock)
        self.controller.configure()
        self.controller.activate(worker=False)
        for p in self._policies:
            p.running = True
        #: called after every step with the episode and its observation (progress, tests)
        self.on_step: Callable[[EpisodeSpec, SimStep], None] | None = None
        #: called when an episode enters a phase: ``build`` (the task's env), ``reset``,
        #: ``settle``, ``run``, ``video`` (from the env thread during the first three)
        self.on_phase: Callable[[EpisodeSpec, str], None] | None = None
        #: the running episode's record so far (its chunks, for a status line)
        self.current: EpisodeRecord | None = None
        self.should_stop: Callable[[], bool] | None = None

    @property
    def policy(self) -> _TimedPolicy:
        return self._policies[-1]

    def run(self, spec: EpisodeSpec) -> EpisodeRecord | None:
        """Run one episode; None when ``should_stop`` interrupted it (nothing to record)."""
        wall0 = time.perf_counter()
        info = self.sim.task(spec.suite, spec.task_id)
        max_steps = self.max_steps or info.max_steps
        rec = EpisodeRecord(spec.key, spec.suite, spec.task_id, spec.init_index, info.language,
                            max_steps=max_steps, settle_steps=self.sim.settle_steps,
                            time_mode=self.time_mode, latency_ms=self.latency_ms)
        if not 0 <= spec.init_index < info.num_inits:
            raise MolmoActError(f"{spec.suite} task {spec.task_id} has init states "
                                f"0..{info.num_inits - 1}; init {spec.init_index} does not exist")
        self.current = rec
        seeds = episode_seeds(spec.suite, spec.task_id, spec.init_index, self.seed)
        rec.env_seed, rec.noise_seed = seeds["env_seed"], seeds["noise_seed"]
        ok, reason, _ = self.controller.request({"instruction": info.language,
                                                 "seed": rec.noise_seed})
        if not ok:
            rec.status, rec.reason = "refused", reason
            log.warning("%s: instruction refused: %s", spec.key, reason)
            video = self._video(spec, info.language)
            if video is not None:
                self._phase(spec, "video")
                video.finish("refused", reason)
                rec.video = self._video_path(video)
            rec.timing.wall_s = time.perf_counter() - wall0
            return rec
        t0 = EPISODE_T0_NS + self.sim.settle_steps * self.period_ns
        # let the clock run far enough that the jump back to t0 is a reset for the controller
        if self.clock.now:
            self.clock.advance_to(t0 + MIN_EPISODE_NS)
            self.controller.tick()
        t = time.perf_counter()
        self.sim.on_phase = lambda phase: self._phase(spec, phase)
        try:
            obs = self.sim.reset(spec.suite, spec.task_id, spec.init_index, seed=rec.env_seed)
        finally:
            self.sim.on_phase = None
        self._phase(spec, "run")
        rec.timing.reset_s = self.sim.timing.get("reset_s", time.perf_counter() - t)
        rec.timing.build_s = self.sim.timing.pop("build_s", 0.0)
        rec.timing.settle_s = self.sim.timing.get("settle_s", 0.0)
        self.clock.jump_to(t0)
        status = WorstStatus()  # sampled like the node's /diagnostics: each second of sim time
        self._sample(status)
        self.executor.reset()
        executed_before, skipped_before = self.executor.rows_executed, self.executor.rows_skipped
        idle_before = self.executor.idle_steps
        drops_before = dict(self.controller.drops)
        wall_before = len(self.policy.wall_ms)
        trigger = self.controller.settings["trigger"]
        video = self._video(spec, info.language)
        env_s = over_s = video_s = infer_s = 0.0
        in_flight_until = 0
        loop0 = time.perf_counter()
        try:
            if video is not None:
                v = time.perf_counter()
                video.add(obs.raw_images, 0, obs.success)
                video_s += time.perf_counter() - v
            for k in range(max_steps):
                it = time.perf_counter()
                now = t0 + k * self.period_ns
                self.clock.advance_to(now)
                self.controller.tick()
                inf = 0.0
                if now >= in_flight_until and (self.controller.inference_requested()
                                               or trigger == "on_observation"):
                    self.controller.on_observation(obs.images, obs.state, now)
                    self.controller.inference_requested()
                    w = time.perf_counter()
                    out = self.controller.process_pending()
                    inf = time.perf_counter() - w
                    if out is not None:
                        self.executor.accept(out, out.ready_ns)
                        rec.chunks += 1
                        rec.chunk_latency_ms.append((out.ready_ns - out.received_ns) / 1e6)
                        in_flight_until = out.ready_ns
                    else:
                        in_flight_until = self.clock.now
                if k % DIAGNOSTICS_STEPS == DIAGNOSTICS_STEPS - 1:
                    self._sample(status)
                action = self.executor.command(now)
                obs = self.sim.step(action)
                env = self.sim.last_env_step_s  # the bare env.step: the rest is our overhead
                vs = 0.0
                if video is not None:
                    v = time.perf_counter()
                    video.add(obs.raw_images, obs.step, obs.success)
                    vs = time.perf_counter() - v
                env_s += env
                infer_s += inf
                video_s += vs
                over_s += time.perf_counter() - it - env - inf - vs
                rec.steps = obs.step
                if self.on_step is not None:
                    self.on_step(spec, obs)
                if obs.success:
                    break
                if self.should_stop is not None and self.should_stop():
                    return None
            if video is not None:
                self._phase(spec, "video")
                video.finish("success" if obs.success else "failure")
        finally:
            if video is not None:
                video.close()
        loop_s = time.perf_counter() - loop0
        rec.success = bool(obs.success)
        rec.sim_time_s = round((self.sim.settle_steps + rec.steps) * self.period_ns / 1e9, 6)
        self.clock.advance_to(t0 + rec.steps * self.period_ns)
        self._sample(status)
        rec.policy_diagnostics = status.to_json()
        rec.rows_executed = self.executor.rows_executed - executed_before
        rec.rows_skipped = self.executor.rows_skipped - skipped_before
        rec.idle_steps = self.executor.idle_steps - idle_before
        rec.largest_command_change = round(self.executor.largest_command_change, 6)
        rec.clipped_steps, rec.clipped_values = self.sim.clipped_steps, self.sim.clipped_values
        rec.drops = {k: v - drops_before.get(k, 0) for k, v in self.controller.drops.items()
                     if v - drops_before.get(k, 0)}
        tm = rec.timing
        n = max(rec.steps, 1)
        tm.env_step_ms = round(env_s / n * 1e3, 3)
        tm.overhead_ms = round(over_s / n * 1e3, 3)
        tm.video_ms = round(video_s / n * 1e3, 3)
        tm.inference_ms = [round(x, 3) for x in self.policy.wall_ms[wall_before:]]
        tm.sim_steps_per_s = round(rec.steps / loop_s, 3) if loop_s > 0 else 0.0
        tm.wall_s = round(time.perf_counter() - wall0, 3)
        if video is not None:
            if self.videos == "failures" and rec.success:
                video.path.unlink(missing_ok=True)
            else:
                rec.video = self._video_path(video)
        return rec

    def _phase(self, spec: EpisodeSpec, phase: str) -> None:
        if self.on_phase is not None:
            self.on_phase(spec, phase)

    def _video_path(self, video) -> str:
        return str(video.path.relative_to(self.video_dir.parent)
                   if self.video_dir.parent in video.path.parents else video.path)

    def _sample(self, status: WorstStatus) -> None:
        d = self.controller.diagnostics()
        status.add(d["level"], d["message"])

    def _video(self, spec: EpisodeSpec, instruction: str):
        if self.videos == "none":
            return None
        from .video import EpisodeVideo

        stem = f"{spec.suite}_task{spec.task_id:02d}_init{spec.init_index:02d}"
        return EpisodeVideo(self.video_dir, stem, instruction, size=self.sim.camera_size)

    def close(self) -> None:
        """Release the policy (the simulator belongs to the caller)."""
        self.controller.shutdown()
