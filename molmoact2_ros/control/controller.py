"""Everything the node does that needs no ROS: lifecycle effects, parameter handling, the
newest-only observation slot with staleness, triggers, one-at-a-time inference, the
background session swap with rollback, output safety and the numbers diagnostics report.

``node.py`` (rclpy) and ``replay.py`` (rosbag files) both drive this class.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import MolmoActError
from ..host.images import mount_images
from ..policy import Observation
from .chunk_io import (  # noqa: F401  (re-exported: node.py and replay.py import them here)
    PolicyFactory,
    PolicyLike,
    Published,
    check_bundle,
    chunk_message_fields,
    load_policy,
    trajectory_message_fields,
    trajectory_targets,
)
from .execution import (
    Executing,
    LatencyTracker,
    auto_uses_observation,
    blend,
    chunk_timing,
    delta_dims,
    inpaint_guidance,
    resolve_action_type,
    takeover_reference,
)
from .params import Settings, validate_changes
from .safety import UnsafeChunk, apply_safety
from .stamps import StampGate, describe_jump
from .swap import ACTIVE, FINALIZED, INACTIVE, UNCONFIGURED, SettingsControl
from .sync import ApproxTimeSync, NewestSlot

__all__ = ["ACTIVE", "FINALIZED", "INACTIVE", "UNCONFIGURED", "Controller", "Published",
           "chunk_message_fields", "trajectory_message_fields"]
log = logging.getLogger("molmoact2_ros.control.controller")
#: Watchdog: nothing published for this many expected periods while inputs arrive is a WARN,
#: three times as many an ERROR (diagnostics name the largest drop counter).
STALL_PERIODS = 10
#: How the watchdog's status message begins (readers count stalls by it).
STALL_MESSAGE = "nothing published for"
#: The shortest expected period the watchdog assumes (on_observation has no period of its own).
MIN_EXPECTED_PERIOD_S = 0.1
#: chunks in a row without an overlap (blend set) before diagnostics warn
NO_OVERLAP_WARN_CHUNKS = 5


class Controller(SettingsControl):
    """ROS-free core of the policy node."""

    def __init__(
        self,
        settings: Settings,
        *,
        publish: Callable[[Published], None],
        policy_factory: PolicyFactory = load_policy,
        clock_ns: Callable[[], int] = time.time_ns,
        on_swap_done: Callable[[bool, str, Settings], None] | None = None,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``clock_ns`` is the node's clock (stamps, due times; it may jump); inference latency
        is measured on ``monotonic_ns`` (a simulation passes its virtual clock for both)."""
        self.settings = settings
        self.state = UNCONFIGURED
        self.policy: PolicyLike | None = None
        self._publish = publish
        self._factory = policy_factory
        self._clock = clock_ns
        self._monotonic = monotonic_ns
        self._latency = LatencyTracker()
        self._on_swap_done = on_swap_done
        self._slot = NewestSlot()
        self._wake = threading.Event()
        self._policy_lock = threading.Lock()  # held while a chunk runs or sessions swap
        self._lock = threading.RLock()  # settings, pending changes and swap start: one place
        self._thread: threading.Thread | None = None
        self._running = False
        self._swap: threading.Thread | None = None
        self._swapping = False
        self.pending_configure: dict = {}
        self._pending_live: dict = {}
        self.counts: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()
        self.last_latency_ms: dict[str, float] = {}
        self.latency_estimate_s = 0.0
        self.last_observation_age_s = float("nan")
        self.health = ("ok", "")
        self.last_clock_event = ""
        self._stamps = StampGate()
        self._sync: ApproxTimeSync | None = None
        self._sync_drops_before = 0
        self._sequence = 0
        self._last_action: np.ndarray | None = None
        self._chunk_started_ns: int | None = None
        self._chunk_rows = 0
        self._last_tick_ns = 0
        self._executing: Executing | None = None  # the last published chunk (blending)
        self._targets: np.ndarray | None = None  # its trajectory targets (delta: integrated)
        self._no_overlap = 0  # chunks in a row that met nothing to blend with
        self.last_switch: dict[str, Any] = {}
        self._in_past = False  # the last chunk was entirely due when ready (not published)
        self._last_logged: dict[str, float] = {}
        self._last_input_ns: int | None = None  # clock when the last input message arrived
        self._last_output_ns: int | None = None  # clock of the last publish (or activation)

    # -- lifecycle -----------------------------------------------------------------------------
    def configure(self) -> None:
        """Validate settings, load the runtime and warm it up. Raises MolmoActError."""
        from ..host.jit import switched_off
        from ..util.threads import threads_from_env

        switched_off()  # a MOLMOACT2_NUMBA value that is not on/off fails configure, named
        threads_from_env()  # and so does a MOLMOACT2_THREADS that is not a thread count
        with self._lock:
            ok, reason = validate_changes(dict(self.settings.values), self.settings)
            if not ok:
                raise MolmoActError(reason)
            self.settings = self.settings.with_changes(self.pending_configure)
            self.pending_configure = {}
            settings = self.settings
        with self._policy_lock:
            self.policy = self._factory(settings)
            try:
                self._warm_up()
            except Exception:
                self.policy.close()
                self.policy = None
                raise
        self.health = ("ok", "")
        self.state = INACTIVE

    def _warm_up(self) -> None:
        """One chunk on a blank observation: the first run on the NPU is slow, and a runtime
        that cannot run a chunk should fail configure, not the first real observation."""
        from ..bundle.variants import get_variant

        v = get_variant(self.settings["variant"])
        blank = np.zeros((256, 256, 3), np.uint8)
        obs = Observation(images=(blank,) * v.num_cameras,
                          state=np.zeros(v.state_dim, np.float32),
                          instruction=self.settings["instruction"] or "pick up the object")
        chunk = self.policy.predict(obs)
        self.last_latency_ms = {f"warmup.{k}": t for k, t in chunk.latency_ms.items()}

    def activate(self, *, worker: bool = True) -> None:
        """Start accepting observations; ``worker=False`` leaves inference to the caller
        (``process_pending``), which is how replay runs one chunk per observation in order."""
        self._require(INACTIVE, "activate")
        if self.policy is None:
            raise MolmoActError(
                "cannot activate: no runtime is loaded (the last swap and its rollback failed); "
                "set 'variant' to load one, or cleanup and configure again")
        seed = self.settings["seed"]
        self.policy.reseed(None if seed < 0 else seed)
        self._last_action = None
        self._chunk_started_ns = None
        self._executing = None
        self._targets = None
        self._no_overlap = 0
        self._latency.reset()
        self.latency_estimate_s = 0.0
        self._stamps.reset()
        self._last_output_ns = self._clock()
        if worker:
            self._running = True
            self._start_thread()
        self.state = ACTIVE

    def deactivate(self) -> None:
        self._require(ACTIVE, "deactivate")
        self._stop_thread()
        self._slot.clear()
        self.state = INACTIVE

    def cleanup(self) -> None:
        self._require(INACTIVE, "cleanup")
        self._release()
        self.state = UNCONFIGURED

    def shutdown(self) -> None:
        """Stop everything from any state; safe to call twice (also on SIGINT/SIGTERM)."""
        self._stop_thread()
        if self._swap is not None:
            self._swap.join()
        self._release()
        self.state = FINALIZED

    def shutdown_runtime(self) -> None:
        """Release the runtime after a failed transition or an error; back to unconfigured."""
        self._stop_thread()
        self._release()
        self.state = UNCONFIGURED

    def _require(self, state: str, transition: str) -> None:
        if self.state != state:
            raise MolmoActError(f"cannot {transition} from state {self.state}")

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="molmoact2-inference",
                                        daemon=True)
        self._thread.start()

    def _stop_thread(self) -> None:
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _release(self) -> None:
        with self._policy_lock:
            if self.policy is not None:
                self.policy.close()
                self.policy = None

    # -- time ------------------------------------------------------------------------------------
    def attach_sync(self, sync: ApproxTimeSync | None) -> None:
        """The synchroniser feeding this controller: reset on clock jumps, counted in
        diagnostics (``drop.sync_out_of_order``)."""
        if self._sync is not None:
            self._sync_drops_before += self._sync.dropped_out_of_order
        self._sync = sync

    def on_time_jump(self, delta_ns: int) -> None:
        """The clock jumped by ``delta_ns`` (node: rclpy's jump callback; else seen in tick).

        Backwards (sim-time reset, bag loop): forget queued messages, the held observation, the
        last stamp and the trigger times, so output resumes on the new time line. Forwards:
        counted only; staleness and the triggers already handle it.
        """
        self.last_clock_event = describe_jump(delta_ns)
        if delta_ns >= 0:
            self.counts["clock_jumps_forward"] += 1
            log.warning("%s", self.last_clock_event)
            return
        self.counts["clock_resets"] += 1
        self._stamps.reset()  # the next clock reading is the new baseline (no clock call here:
        # rclpy runs this callback while it sets the time)
        if self._sync is not None:
            self._sync.reset()
        self._slot.clear()
        self._last_tick_ns = 0
        self._chunk_started_ns = None
        self._last_action = None
        self._executing = None  # its due times are on the old time line
        self._targets = None
        log.warning("%s (sim-time reset or bag loop): synchroniser, observation slot and "
                    "triggers reset", self.last_clock_event)

    def _watch_clock(self) -> int:
        now = self._clock()
        delta = self._stamps.clock_jump(now)
        if delta:
            self.on_time_jump(delta)
        return now

    # -- inputs ----------------------------------------------------------------------------------
    def offer(self, sync: ApproxTimeSync, stream: int, stamp_ns: int, msg: Any) -> bool:
        """One input message on its way into ``sync`` (node and replay): a stamp further
        ahead of the clock than ``max_future_stamp_s`` is dropped here, before the
        synchroniser, which would keep it as its newest and drop every later message as out
        of order until the clock reached it (for a garbage stamp: forever)."""
        now = self._clock()
        self._last_input_ns = now
        tolerance_s = self.settings["max_future_stamp_s"]
        if int(stamp_ns) - now > tolerance_s * 1e9:
            self.drops["future_input"] += 1
            self._log_throttled(logging.WARNING, "future_input", (
                f"input stamped {(int(stamp_ns) - now) / 1e9:+.3f} s from now skipped before "
                f"synchronisation (max_future_stamp_s={tolerance_s}); check the sensor "
                f"clocks; {self.drops['future_input']} so far"))
            return False
        return sync.add(stream, stamp_ns, msg)

    def on_observation(
        self, images: Sequence[np.ndarray], state: np.ndarray, stamp_ns: int
    ) -> None:
        """A synchronised observation arrived (already decoded)."""
        self.counts["synced"] += 1
        self._last_input_ns = self._clock()
        if self.state != ACTIVE:
            self.drops["inactive"] += 1
            return
        now = self._watch_clock()
        tolerance_s = self.settings["max_future_stamp_s"]
        reason = self._stamps.admit(int(stamp_ns), now, tolerance_s)
        if reason is not None:
            self.drops[reason] += 1
            ahead_s = (stamp_ns - now) / 1e9
            self._log_throttled(logging.WARNING, reason, (
                f"observation stamped {ahead_s:+.3f} s from now skipped: "
                + ("further ahead than max_future_stamp_s="
                   f"{tolerance_s}; check the sensor clocks" if reason == "future_stamp" else
                   "older than the last one; check the sensor clocks")
                + f"; {self.drops[reason]} so far"))
            return
        replaced = self._slot.replaced
        self._slot.put(Observation(images=tuple(images), state=state, stamp_ns=stamp_ns),
                       stamp_ns)
        if self._slot.replaced != replaced:
            self.drops["superseded"] += 1
        if self.settings["trigger"] == "on_observation":
            self._wake.set()

    def on_invalid(self, reason: str) -> None:
        """An input could not be turned into an observation; count it under its reason."""
        self.drops[reason] += 1

    def tick(self) -> None:
        """Timer hook (node timer or replay clock) for the rate and chunk_consumed triggers;
        it also restarts the inference thread if it ended and watches the clock."""
        now = self._watch_clock()
        self._ensure_thread()
        trigger = self.settings["trigger"]
        if trigger == "rate":
            if now - self._last_tick_ns >= 1e9 / self.settings["rate_hz"]:
                self._last_tick_ns = now
                self._wake.set()
        elif trigger == "chunk_consumed":
            if self._chunk_started_ns is None:
                self._wake.set()
                return
            horizon_s = self._chunk_rows * self.settings["control_period_s"]
            remaining = horizon_s - (now - self._chunk_started_ns) / 1e9
            if remaining <= self.latency_estimate_s + self.settings["execution.overlap_s"]:
                self._wake.set()

    # -- inference -------------------------------------------------------------------------------
    def _loop(self) -> None:
        """The inference thread: any error is caught, counted and reported; it never ends
        silently (if it ends anyway, diagnostics say ERROR and ``tick`` restarts it)."""
        try:
            while self._running:
                self._wake.wait(0.1)
                self._wake.clear()
                if not self._running:
                    break
                try:
                    self.process_pending()
                except Exception as exc:
                    self.counts["inference_errors"] += 1
                    self.health = ("error", f"inference failed: {type(exc).__name__}: {exc}")
                    self._log_throttled(logging.ERROR, "inference_error",
                                        f"inference failed, next observation continues: "
                                        f"{type(exc).__name__}: {exc}")
        finally:
            if self._running:
                self.health = ("error", "inference thread ended unexpectedly; restarting it")
                log.error("inference thread ended unexpectedly; it is restarted on the next tick")

    def _ensure_thread(self) -> None:
        """Restart the inference thread if it ended while the controller is active."""
        thread = self._thread
        if self._running and thread is not None and not thread.is_alive():
            self.counts["inference_thread_restarts"] += 1
            self._start_thread()

    def inference_requested(self) -> bool:
        """Whether ``tick`` or ``on_observation`` asked for a chunk since the last call (and
        clear it): drivers without the inference thread (the simulator) poll this."""
        requested = self._wake.is_set()
        self._wake.clear()
        return requested

    def thread_alive(self) -> bool:
        """False when the inference thread should run but does not."""
        return not self._running or (self._thread is not None and self._thread.is_alive())

    def process_pending(self) -> Published | None:
        """Run one chunk on the newest observation, if any; publish it if it is safe."""
        item = self._slot.take()
        if item is None:
            return None
        obs, stamp_ns = item
        received = self._clock()
        received_mono = self._monotonic()
        jumps_before = self.counts["clock_resets"] + self.counts["clock_jumps_forward"]
        age_s = (received - stamp_ns) / 1e9
        self.last_observation_age_s = age_s
        if age_s > self.settings["max_observation_age_s"]:
            self.drops["stale"] += 1
            self._log_throttled(logging.WARNING, "stale", (
                f"observation is {age_s:.3f} s old (max_observation_age_s="
                f"{self.settings['max_observation_age_s']}): skipped; "
                f"{self.drops['stale']} so far"))
            return None
        with self._policy_lock:
            if self.policy is None:
                self.drops["no_runtime"] += 1
                return None
            if self._pending_live:
                self._apply_pending_live()
            settings = self.settings
            action_type = resolve_action_type(settings["execution.action_type"], self.policy)
            try:
                # flip_images.* apply to the next chunk: read here, like every live setting
                obs = Observation(mount_images(obs.images, settings.mounts()), obs.state,
                                  obs.instruction, obs.stamp_ns)
                guidance = self._guidance(settings, stamp_ns, received)
                if guidance is None:
                    chunk = self.policy.predict(obs)
                else:
                    chunk = self.policy.predict(obs, guidance=guidance)
            except MolmoActError as exc:
                self.drops[type(exc).__name__] += 1
                self._report_error(exc)
                return None
            except Exception as exc:  # a bug or a library error: counted, reported, survived
                self.drops["inference_error"] += 1
                self.health = ("error", f"inference failed: {type(exc).__name__}: {exc}")
                self._log_throttled(logging.ERROR, "inference_error",
                                    f"inference failed: {type(exc).__name__}: {exc}")
                return None
            finally:
                if self.health[0] == "error" and self.health[1].startswith("runtime failed"):
                    self._recover()
        ready = self._clock()
        period_ns = int(round(settings["control_period_s"] * 1e9))
        horizon = chunk.actions.shape[0]
        self._record_latency((self._monotonic() - received_mono) / 1e9, ready - received,
                             jumps_before, horizon * period_ns / 1e9)
        timing = chunk_timing(settings["execution.start"], chunk.observation_stamp_ns, ready,
                              period_ns, horizon,
                              next_latency_ns=int(self.latency_estimate_s * 1e9),
                              overlap_ns=int(settings["execution.overlap_s"] * 1e9))
        self._in_past = timing.first_future_index >= horizon
        if self._in_past:
            self.drops["chunk_in_past"] += 1
            self._log_throttled(logging.WARNING, "chunk_in_past", (
                f"chunk ready {(ready - timing.start_ns) / 1e9:.3f} s after its observation: "
                "every action is already due, not published; lower the latency or set "
                "execution.start=auto"))
            return None
        mask = delta_dims(action_type, settings["action_names"])
        prev = None if self._executing is None else self._executing.on_grid(period_ns)
        blended = blend(settings["execution.blend"], chunk.actions, prev,
                        timing.start_ns, timing.first_future_index,
                        ramp=settings["execution.crossfade_ramp"],
                        decay=settings["execution.ensemble_decay"])
        lower, upper, delta = settings.limits()
        try:
            actions, report = apply_safety(
                blended.actions, lower=lower, upper=upper, max_step_delta=delta,
                previous=takeover_reference(prev, timing.start_ns, timing.first_future_index),
                first_row=timing.first_future_index, delta=mask,
            )
        except UnsafeChunk as exc:
            self.drops["non_finite"] += 1
            self.health = ("error", str(exc))
            return None
        if report.clamped:
            self.counts["clamped_chunks"] += 1
        self._sequence += 1
        published = Published(
            chunk, actions, self._sequence, report, settings, received, ready,
            timing.start_ns, timing.trajectory_stamp_ns, timing.first_future_index,
            action_type=action_type,
            base_pose=self._base_pose(obs, prev, timing, action_type),
            start_mode=timing.mode,
            inpaint_frozen_rows=0 if guidance is None else int(guidance.frozen_rows),
            inpaint_weights=None if guidance is None else np.asarray(guidance.weights).copy(),
            inpaint_method="" if guidance is None else guidance.method)
        self.last_latency_ms = dict(chunk.latency_ms)
        self._last_action = actions[-1].copy()
        self._chunk_started_ns = timing.start_ns
        self._chunk_rows = actions.shape[0]
        self._executing = Executing(actions.copy(), timing.start_ns, period_ns, blended.counts,
                                    mask)
        self._targets = trajectory_targets(published) if mask is not None else None
        overlapped = blended.overlap_rows > 0 or guidance is not None
        self._no_overlap = 0 if overlapped or prev is None else self._no_overlap + 1
        self.last_switch = {
            "first_future_index": timing.first_future_index,
            "overlap_rows": blended.overlap_rows,
            "boundary_jump": blended.boundary_jump,
            "start_mode": timing.mode,
            "inpaint_frozen_rows": published.inpaint_frozen_rows,
            "inpaint_weights": ("" if guidance is None else
                                ",".join(f"{w:.3g}" for w in np.asarray(guidance.weights))),
        }
        self.counts["published"] += 1
        self._last_output_ns = ready
        if self.health[0] != "ok" and "swap" not in self.health[1]:
            self.health = ("ok", "")
        self._publish(published)
        return published

    def _guidance(self, settings: Settings, stamp_ns: int, received_ns: int):
        """Inpaint guidance for the next chunk from the executing one (blend=inpaint), on the
        timing the chunk is expected to get (auto: decided from the latency estimate)."""
        if settings["execution.blend"] != "inpaint" or self._executing is None:
            return None
        latency_ns = int(self.latency_estimate_s * 1e9)
        ready_estimate = received_ns + latency_ns
        period_ns = int(round(settings["control_period_s"] * 1e9))
        horizon = self._executing.actions.shape[0]  # the same variant: swaps reset _executing
        mode = settings["execution.start"]
        if mode == "auto":
            mode = "observation" if auto_uses_observation(
                ready_estimate - stamp_ns, period_ns, horizon, latency_ns,
                int(settings["execution.overlap_s"] * 1e9)) else "receipt"
        start = stamp_ns if mode == "observation" else ready_estimate
        return inpaint_guidance(self._executing, start, ready_estimate, horizon,
                                period_ns=period_ns,
                                schedule=settings["execution.inpaint_schedule"],
                                method=settings["execution.inpaint_method"],
                                beta=settings["execution.inpaint_beta"])

    def _record_latency(self, monotonic_s: float, clock_ns: int, jumps_before: int,
                        cap_s: float) -> None:
        """One latency sample on the monotonic clock; dropped when the node's clock jumped
        (or went back) during the inference; the estimate is the window's p95 in [0, cap]."""
        jumped = self.counts["clock_resets"] + self.counts["clock_jumps_forward"] != jumps_before
        # the node clock disagreeing with the monotonic one by more than a sim-time rate
        # could explain is a jump seen first here (one inference apart)
        jumped = jumped or clock_ns < 0 or abs(clock_ns / 1e9 - monotonic_s) > max(
            1.0, monotonic_s)
        if jumped or not self._latency.add(monotonic_s):
            self.counts["latency_samples_dropped"] += 1
        else:
            self.latency_estimate_s = self._latency.estimate(cap_s)

    def _base_pose(self, obs, prev: Executing | None, timing, action_type: str):
        """Delta chunks: the pose their targets are integrated from; the observation's, or on
        receipt timing the executing chunk's target at the new start (where the robot is
        meant to be when the new rows begin)."""
        if action_type != "delta":
            return None
        pose = np.asarray(obs.state, np.float64).reshape(-1)[:6].copy()
        if timing.mode == "receipt" and prev is not None and self._targets is not None:
            reached = prev.row_offset(timing.start_ns) - 1
            if reached >= 0:
                pose = self._targets[min(reached, len(self._targets) - 1), :6].copy()
        return pose

    def _recover(self) -> None:
        """Restart the runtime after a worker failure; the next observation runs on it."""
        try:
            self.policy.recover()
        except Exception as exc:
            self.health = ("error", f"{self.health[1]}; restart failed: {exc}")
            log.error("runtime restart failed: %s", str(exc))
            return
        self.counts["runtime_restarts"] += 1
        self.health = ("warn", f"recovered: {self.health[1]}")
        log.warning("runtime restarted after a failure")

    def _log_throttled(self, level: int, key: str, message: str, period_s: float = 5.0) -> None:
        """Log a per-observation problem at most once per ``period_s`` per kind."""
        now = time.monotonic()
        if now - self._last_logged.get(key, -period_s) >= period_s:
            self._last_logged[key] = now
            log.log(level, message)

    def _report_error(self, exc: Exception) -> None:
        from ..errors import RuntimeBackendError

        if isinstance(exc, RuntimeBackendError):
            self.health = ("error", f"runtime failed: {exc}")
        self._log_throttled(logging.ERROR, type(exc).__name__, f"inference skipped: {exc}")

    # -- diagnostics -----------------------------------------------------------------------------
    def diagnostics(self) -> dict[str, Any]:
        """Plain data for /diagnostics: status level, message and key values."""
        s = self.settings
        values: dict[str, Any] = {
            "lifecycle_state": self.state,
            "variant": s["variant"],
            "backend": s["backend"],
            **{f"context_suffix.{g}": v or '""' for g, v in s.suffixes().items()},
            "flow_steps": getattr(self.policy, "flow_steps", s.flow_steps()),
            "trigger": s["trigger"],
            "runtime_loaded": self.policy is not None,
            "observation_age_s": round(self.last_observation_age_s, 4),
            "latency_estimate_s": round(self.latency_estimate_s, 4),
            "latency_max_s": round(self._latency.maximum(), 4),
            "execution.start": s["execution.start"],
            "execution.blend": s["execution.blend"],
            "execution.action_type": s["execution.action_type"],
            **{f"last_switch.{k}": round(v, 6) if isinstance(v, float) else v
               for k, v in self.last_switch.items()},
        }
        if self.last_clock_event:
            values["last_clock_event"] = self.last_clock_event
        drops = Counter(self.drops)
        sync_drops = self._sync_drops_before + (
            self._sync.dropped_out_of_order if self._sync is not None else 0)
        if sync_drops:
            drops["sync_out_of_order"] = sync_drops
        values.update({f"count.{k}": v for k, v in sorted(self.counts.items())})
        values.update({f"drop.{k}": v for k, v in sorted(drops.items())})
        values.update({f"latency_ms.{k}": round(v, 3) for k, v in self.last_latency_ms.items()})
        load_stats = getattr(getattr(self.policy, "pipeline", None), "load_stats", None)
        for worker, st in (load_stats() if callable(load_stats) else {}).items():
            values[f"load_s.{worker}"] = round(float(st.get("load_s", 0.0)), 3)
            values[f"peak_rss_mib.{worker}"] = round(float(st.get("peak_rss_mib", 0.0)), 1)
        level, message = self.health
        stall = self._stall(drops)
        if stall is not None and level != "error":
            level, message = stall
        elif not self.thread_alive():
            level = "error"
            message = "inference thread is not running; restarting it on the next tick"
        elif level == "ok" and not s["instruction"]:
            level, message = "warn", "no instruction: set the 'instruction' parameter"
        elif level == "ok" and self._in_past:
            level, message = "warn", (
                f"the last chunk was entirely due when ready (latency > chunk duration; "
                f"{self.drops['chunk_in_past']} so far): set execution.start=auto or "
                "execution.start=receipt")
        elif level == "ok" and self._no_overlap >= NO_OVERLAP_WARN_CHUNKS \
                and s["execution.blend"] != "none":
            level, message = "warn", (
                f"execution.blend={s['execution.blend']} but the last {self._no_overlap} chunks "
                "met no executing rows to blend with: raise execution.overlap_s or use "
                "trigger=chunk_consumed")
        elif level == "ok" and self.drops.get("stale"):
            message = f"{self.drops['stale']} stale observations skipped"
        return {"level": level, "message": message or "running", "values": values}

    def expected_period_s(self) -> float:
        """How often a chunk should come out with the current trigger (watchdog's unit)."""
        s = self.settings
        if s["trigger"] == "rate":
            period = 1.0 / s["rate_hz"]
        elif s["trigger"] == "chunk_consumed":
            period = max(self._chunk_rows, 1) * s["control_period_s"]
        else:
            period = 0.0
        return max(period, self.latency_estimate_s, MIN_EXPECTED_PERIOD_S)

    def _stall(self, drops: Counter) -> tuple[str, str] | None:
        """Watchdog: inputs kept arriving for ``STALL_PERIODS`` expected periods after the last
        publish and still arrive (WARN; three times as long: ERROR), naming the largest drop
        counter. Inputs that stopped soon after the last publish (a sim reset between episodes,
        a sensor going away) are not a stall, however long the clock runs on."""
        if self.state != ACTIVE or self._swapping or self._last_output_ns is None \
                or self._last_input_ns is None:
            return None
        now = self._clock()
        period_ns = self.expected_period_s() * 1e9
        silent_ns = now - self._last_output_ns
        if silent_ns < 0:  # the clock went back: the new time line is the baseline
            self._last_output_ns = now
            self._last_input_ns = min(self._last_input_ns, now)
            return None
        arriving_ns = self._last_input_ns - self._last_output_ns
        if arriving_ns < STALL_PERIODS * period_ns or \
                now - self._last_input_ns > STALL_PERIODS * period_ns:
            return None
        worst = max(drops.items(), key=lambda kv: kv[1], default=None)
        why = (f"largest drop counter: drop.{worst[0]}={worst[1]}" if worst else
               "no drops counted; check the trigger and the input topics")
        level = "error" if arriving_ns >= 3 * STALL_PERIODS * period_ns else "warn"
        return level, (f"{STALL_MESSAGE} {silent_ns / 1e9:.1f} s "
                       f"({silent_ns / period_ns:.0f} expected periods) while inputs arrive; "
                       + why)
