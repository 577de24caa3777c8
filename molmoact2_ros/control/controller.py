"""Everything the node does that needs no ROS, in one class: lifecycle effects, the inputs
(stamps, the newest-only slot, staleness) and one-at-a-time inference.

Its decisions live beside it, one file each, as mixins sharing its state: ``trigger.py``
(when to infer), ``publish.py`` (what a predicted chunk becomes: timing, blending, safety,
targets), ``swap.py`` (parameter changes and session swaps) and ``health.py`` (what
diagnostics say). ``node.py`` (rclpy), ``replay.py`` (rosbag files) and ``sim/`` drive it.
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
from ..host.state import StateConvention
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
from .execution import Executing, LatencyTracker, resolve_action_type
from .health import (  # noqa: F401  (re-exported: readers import them here)
    NO_OVERLAP_WARN_CHUNKS,
    STALL_MESSAGE,
    STALL_PERIODS,
    HealthReport,
)
from .params import Settings, validate_changes
from .publish import PublishControl
from .stamps import StampGate, describe_jump
from .swap import ACTIVE, FINALIZED, INACTIVE, UNCONFIGURED, SettingsControl
from .sync import ApproxTimeSync, NewestSlot
from .trigger import MIN_EXPECTED_PERIOD_S, TriggerControl  # noqa: F401  (re-exported)

__all__ = ["ACTIVE", "FINALIZED", "INACTIVE", "UNCONFIGURED", "Controller", "Published",
           "chunk_message_fields", "trajectory_message_fields"]
log = logging.getLogger("molmoact2_ros.control.controller")


class Controller(TriggerControl, PublishControl, HealthReport, SettingsControl):
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
        self._executing_meaning: tuple = ()  # what its rows mean (publish.row_meaning)
        self._faults: dict[str, str] = {}  # faults said once, until their episode ends
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
            stats = getattr(self.policy, "norm_stats", None)
            if stats is not None and hasattr(stats, "describe"):  # where they came from
                log.info("%s", stats.describe())
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
        self._faults.clear()
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
        if self._refuse_state(obs.state, self.settings):
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
                # and so do state.*: the robot's pose in the policy's frame and convention
                state = StateConvention.from_settings(settings).apply(
                    obs.state, getattr(getattr(self.policy, "norm_stats", None), "state", None))
                obs = Observation(mount_images(obs.images, settings.mounts()), state,
                                  obs.instruction, obs.stamp_ns)
                guidance = self._guidance(settings, stamp_ns, received, action_type)
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
        return self._publish_chunk(chunk, obs, settings, action_type, guidance, received,
                                   received_mono, jumps_before)

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
