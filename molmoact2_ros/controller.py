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
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .errors import MolmoActError
from .execution import Executing, blend, chunk_timing, inpaint_guidance
from .params import CONFIGURE, RELOAD, Settings, apply_kind, validate_changes
from .policy import ActionChunk, Observation
from .safety import SafetyReport, UnsafeChunk, apply_safety
from .sync import NewestSlot

UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = "unconfigured", "inactive", "active", "finalized"
log = logging.getLogger("molmoact2_ros.controller")


class PolicyLike(Protocol):
    """What the controller needs from a policy (``molmoact2_ros.policy.Policy``)."""

    flow_steps: int

    def predict(self, obs: Observation) -> ActionChunk:
        """Also called as ``predict(obs, guidance=InpaintGuidance)`` with blend=inpaint."""
    def plan(self, instruction: str) -> Any: ...
    def set_instruction(self, instruction: str) -> None: ...
    def set_flow_steps(self, steps: int) -> None: ...
    def reseed(self, seed: int | None) -> None: ...
    def recover(self) -> None: ...
    def close(self) -> None: ...


PolicyFactory = Callable[[Settings], PolicyLike]


def load_policy(settings: Settings) -> PolicyLike:
    """Default factory: the bundle of the selected variant on the selected backend."""
    from .bundle import Suffixes
    from .policy import Policy

    seed = settings["seed"]
    return Policy.load(
        settings.bundle_path(),
        settings["variant"],
        backend=settings["backend"],
        suffixes=Suffixes.from_mapping(settings.suffixes()),
        pipeline_options=settings.runtime_options() if settings["backend"] == "htp" else {},
        flow_steps=settings.flow_steps(),
        seed=None if seed < 0 else seed,
        instruction=settings["instruction"] or None,
    )


@dataclass
class Published:
    """A chunk that passed safety, ready for the node to publish."""

    chunk: ActionChunk
    actions: np.ndarray
    sequence: int
    safety: SafetyReport
    settings: Settings
    received_ns: int
    ready_ns: int
    #: row i is due at start_ns + (i+1)·period; rows before first_future_index were due already
    start_ns: int = 0
    trajectory_stamp_ns: int = 0
    first_future_index: int = 0


def chunk_message_fields(out: Published) -> dict[str, Any]:
    """The ActionChunk.msg fields of a published chunk as plain values (times in ns).

    One mapping for the node (rclpy messages) and replay (rosbags messages).
    """
    s, chunk = out.settings, out.chunk
    return {
        "stamp_ns": chunk.observation_stamp_ns,
        "sequence": out.sequence,
        "variant": chunk.variant,
        "context_suffix_vision": s["context_suffix.vision"],
        "context_suffix_llm": s["context_suffix.llm"],
        "context_suffix_action": s["context_suffix.action"],
        "context_suffix_action_context": s["context_suffix.action_context"],
        "flow_steps": chunk.flow_steps,
        "instruction": chunk.instruction,
        "action_names": list(s["action_names"]),
        "horizon": int(out.actions.shape[0]),
        "action_dim": int(out.actions.shape[1]),
        "actions": out.actions.reshape(-1).astype(np.float32),
        "period_ns": int(round(s["control_period_s"] * 1e9)),
        "inference_latency_ns": int(out.ready_ns - out.received_ns),
        "start_stamp_ns": int(out.start_ns),
        "first_future_index": int(out.first_future_index),
    }


def trajectory_message_fields(out: Published) -> dict[str, Any]:
    """JointTrajectory of a published chunk as plain values: header stamp (0 = start on
    receipt), joint names, and per point its positions and ``time_from_start`` (ns)."""
    period_ns = int(round(out.settings["control_period_s"] * 1e9))
    return {
        "stamp_ns": int(out.trajectory_stamp_ns),
        "joint_names": list(out.settings["action_names"]),
        "points": [
            (row.astype(float).tolist(), (i + 1) * period_ns) for i, row in enumerate(out.actions)
        ],
    }


class Controller:
    """ROS-free core of the policy node."""

    def __init__(
        self,
        settings: Settings,
        *,
        publish: Callable[[Published], None],
        policy_factory: PolicyFactory = load_policy,
        clock_ns: Callable[[], int] = time.time_ns,
        on_swap_done: Callable[[bool, str, Settings], None] | None = None,
    ) -> None:
        self.settings = settings
        self.state = UNCONFIGURED
        self.policy: PolicyLike | None = None
        self._publish = publish
        self._factory = policy_factory
        self._clock = clock_ns
        self._on_swap_done = on_swap_done
        self._slot = NewestSlot()
        self._wake = threading.Event()
        self._policy_lock = threading.Lock()  # held while a chunk runs or sessions swap
        self._thread: threading.Thread | None = None
        self._running = False
        self._swap: threading.Thread | None = None
        self.pending_configure: dict = {}
        self._pending_live: dict = {}
        self.counts: Counter[str] = Counter()
        self.drops: Counter[str] = Counter()
        self.last_latency_ms: dict[str, float] = {}
        self.latency_estimate_s = 0.0
        self.last_observation_age_s = float("nan")
        self.health = ("ok", "")
        self._sequence = 0
        self._last_action: np.ndarray | None = None
        self._chunk_started_ns: int | None = None
        self._chunk_rows = 0
        self._last_tick_ns = 0
        self._executing: Executing | None = None  # the last published chunk (blending)
        self.last_switch: dict[str, Any] = {}
        self._in_past = False  # the last chunk was entirely due when ready (not published)
        self._last_logged: dict[str, float] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def configure(self) -> None:
        """Validate settings, load the runtime and warm it up. Raises MolmoActError."""
        ok, reason = validate_changes(dict(self.settings.values), self.settings)
        if not ok:
            raise MolmoActError(reason)
        self.settings = self.settings.with_changes(self.pending_configure)
        self.pending_configure = {}
        with self._policy_lock:
            self.policy = self._factory(self.settings)
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
        from .variants import get_variant

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
        seed = self.settings["seed"]
        self.policy.reseed(None if seed < 0 else seed)
        self._last_action = None
        self._chunk_started_ns = None
        self._executing = None
        if worker:
            self._running = True
            self._thread = threading.Thread(target=self._loop, name="molmoact2-inference",
                                            daemon=True)
            self._thread.start()
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
        if self.state != state or self.policy is None:
            raise MolmoActError(f"cannot {transition} from state {self.state}")

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

    # -- inputs ----------------------------------------------------------------------------------
    def on_observation(
        self, images: Sequence[np.ndarray], state: np.ndarray, stamp_ns: int
    ) -> None:
        """A synchronised observation arrived (already decoded)."""
        self.counts["synced"] += 1
        if self.state != ACTIVE:
            self.drops["inactive"] += 1
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
        """Timer hook (node timer or replay clock) for the rate and chunk_consumed triggers."""
        now = self._clock()
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
        while self._running:
            self._wake.wait(0.1)
            self._wake.clear()
            if self._running:
                self.process_pending()

    def process_pending(self) -> Published | None:
        """Run one chunk on the newest observation, if any; publish it if it is safe."""
        item = self._slot.take()
        if item is None:
            return None
        obs, stamp_ns = item
        received = self._clock()
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
            try:
                guidance = self._guidance(settings, stamp_ns, received)
                if guidance is None:
                    chunk = self.policy.predict(obs)
                else:
                    chunk = self.policy.predict(obs, guidance=guidance)
            except MolmoActError as exc:
                self.drops[type(exc).__name__] += 1
                self._report_error(exc)
                return None
            finally:
                if self.health[0] == "error" and self.health[1].startswith("runtime failed"):
                    self._recover()
        ready = self._clock()
        total_s = (ready - received) / 1e9
        previous_s = self.latency_estimate_s
        self.latency_estimate_s = total_s if previous_s == 0 else 0.8 * previous_s + 0.2 * total_s
        period_ns = int(round(settings["control_period_s"] * 1e9))
        timing = chunk_timing(settings["execution.start"], chunk.observation_stamp_ns, ready,
                              period_ns, chunk.actions.shape[0])
        self._in_past = timing.first_future_index >= chunk.actions.shape[0]
        if self._in_past:
            self.drops["chunk_in_past"] += 1
            self._log_throttled(logging.WARNING, "chunk_in_past", (
                f"chunk ready {(ready - timing.start_ns) / 1e9:.3f} s after its observation: "
                "every action is already due, not published; lower the latency or set "
                "execution.start=receipt"))
            return None
        blended = blend(settings["execution.blend"], chunk.actions, self._executing,
                        timing.start_ns, timing.first_future_index,
                        ramp=settings["execution.crossfade_ramp"],
                        decay=settings["execution.ensemble_decay"])
        lower, upper, delta = settings.limits()
        try:
            actions, report = apply_safety(
                blended.actions, lower=lower, upper=upper, max_step_delta=delta,
                previous=self._last_action,
            )
        except UnsafeChunk as exc:
            self.drops["non_finite"] += 1
            self.health = ("error", str(exc))
            return None
        if report.clamped:
            self.counts["clamped_chunks"] += 1
        self._sequence += 1
        published = Published(chunk, actions, self._sequence, report, settings, received, ready,
                              timing.start_ns, timing.trajectory_stamp_ns,
                              timing.first_future_index)
        self.last_latency_ms = dict(chunk.latency_ms)
        self._last_action = actions[-1].copy()
        self._chunk_started_ns = timing.start_ns
        self._chunk_rows = actions.shape[0]
        self._executing = Executing(actions.copy(), timing.start_ns, period_ns, blended.counts)
        self.last_switch = {
            "first_future_index": timing.first_future_index,
            "overlap_rows": blended.overlap_rows,
            "boundary_jump": blended.boundary_jump,
        }
        self.counts["published"] += 1
        if self.health[0] != "ok" and "swap" not in self.health[1]:
            self.health = ("ok", "")
        self._publish(published)
        return published

    def _guidance(self, settings: Settings, stamp_ns: int, received_ns: int):
        """Inpaint guidance for the next chunk from the executing one (blend=inpaint)."""
        if settings["execution.blend"] != "inpaint" or self._executing is None:
            return None
        ready_estimate = received_ns + int(self.latency_estimate_s * 1e9)
        start = stamp_ns if settings["execution.start"] == "observation" else ready_estimate
        horizon = self._executing.actions.shape[0]  # the same variant: swaps reset _executing
        return inpaint_guidance(self._executing, start, ready_estimate, horizon)

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
        from .errors import RuntimeBackendError

        if isinstance(exc, RuntimeBackendError):
            self.health = ("error", f"runtime failed: {exc}")
        self._log_throttled(logging.ERROR, type(exc).__name__, f"inference skipped: {exc}")

    # -- parameters ------------------------------------------------------------------------------
    def validate(self, changes: dict) -> tuple[bool, str]:
        """Synchronous check of a parameter batch (what ``ros2 param set`` sees)."""
        ok, reason = validate_changes(changes, self.settings)
        if not ok:
            return ok, reason
        proposed = self.settings.with_changes(changes)
        if self._swap is not None and self._swap.is_alive() and apply_kind(changes) == RELOAD:
            return False, "a session swap is in progress; try again when it finishes"
        if apply_kind(changes) == RELOAD and self.state in (INACTIVE, ACTIVE):
            ok, reason = check_bundle(proposed)
            if not ok:
                return ok, reason
        if "instruction" in changes and changes["instruction"] and self.policy is not None:
            if apply_kind(changes) != RELOAD:
                try:
                    self.policy.plan(changes["instruction"])
                except MolmoActError as exc:
                    return False, str(exc)
        return True, ""

    def apply(self, changes: dict) -> str:
        """Apply a validated batch; returns how: live, reload (background) or configure."""
        kind = apply_kind(changes)
        if kind == CONFIGURE and self.state in (INACTIVE, ACTIVE):
            self.pending_configure.update(changes)
            return CONFIGURE
        new = self.settings.with_changes(changes)
        if kind == RELOAD and self.policy is not None:
            old = self.settings
            self._swap = threading.Thread(
                target=self._swap_sessions, args=(old, new), name="molmoact2-swap", daemon=True
            )
            self.health = ("warn", "session swap in progress")
            self._swap.start()
            return RELOAD
        # Never wait for a running chunk here (this runs in the parameter service): the
        # change is queued and the inference thread applies it before its next chunk.
        self.settings = new
        self._pending_live.update(changes)
        if self._policy_lock.acquire(blocking=False):
            try:
                self._apply_pending_live()
            finally:
                self._policy_lock.release()
        return kind

    def _apply_pending_live(self) -> None:
        """Hand queued live changes to the policy; call with ``_policy_lock`` held."""
        changes, self._pending_live = self._pending_live, {}
        if self.policy is None:
            return
        if "flow_steps" in changes:
            self.policy.set_flow_steps(self.settings.flow_steps() or self._default_steps())
        if changes.get("instruction"):
            self.policy.set_instruction(changes["instruction"])

    def _default_steps(self) -> int:
        from .variants import get_variant

        return get_variant(self.settings["variant"]).default_flow_steps

    def wait_for_swap(self, timeout_s: float | None = None) -> None:
        if self._swap is not None:
            self._swap.join(timeout_s)

    def _swap_sessions(self, old: Settings, new: Settings) -> None:
        """Pause inference, release the old sessions, load the new ones; roll back on failure."""
        ok, reason = True, ""
        with self._policy_lock:
            if self.policy is not None:
                self.policy.close()
                self.policy = None
            try:
                self.policy = self._factory(new)
                self.settings = new
            except Exception as exc:
                ok, reason = False, f"loading {new['variant']} failed ({exc}); rolled back"
                log.error(reason)
                try:
                    self.policy = self._factory(old)
                    self.settings = old
                except Exception as exc2:
                    reason += f"; the previous configuration failed to load too ({exc2})"
                    self.settings = old
            self._slot.clear()
            self._last_action = None
            self._executing = None
            self.counts["swaps" if ok else "swap_failures"] += 1
        self.health = ("ok", "") if ok else (
            ("error", reason) if self.policy is None else ("warn", reason)
        )
        if self._on_swap_done is not None:
            self._on_swap_done(ok, reason, self.settings)

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
            "observation_age_s": round(self.last_observation_age_s, 4),
            "latency_estimate_s": round(self.latency_estimate_s, 4),
            "execution.start": s["execution.start"],
            "execution.blend": s["execution.blend"],
            **{f"last_switch.{k}": round(v, 6) if isinstance(v, float) else v
               for k, v in self.last_switch.items()},
        }
        values.update({f"count.{k}": v for k, v in sorted(self.counts.items())})
        values.update({f"drop.{k}": v for k, v in sorted(self.drops.items())})
        values.update({f"latency_ms.{k}": round(v, 3) for k, v in self.last_latency_ms.items()})
        load_stats = getattr(getattr(self.policy, "pipeline", None), "load_stats", None)
        for worker, st in (load_stats() if callable(load_stats) else {}).items():
            values[f"load_s.{worker}"] = round(float(st.get("load_s", 0.0)), 3)
            values[f"peak_rss_mib.{worker}"] = round(float(st.get("peak_rss_mib", 0.0)), 1)
        level, message = self.health
        if level == "ok" and not s["instruction"]:
            level, message = "warn", "no instruction: set the 'instruction' parameter"
        elif level == "ok" and self._in_past:
            level, message = "warn", (
                f"the last chunk was entirely due when ready (latency > chunk duration; "
                f"{self.drops['chunk_in_past']} so far): set execution.start=receipt")
        elif level == "ok" and self.drops.get("stale"):
            message = f"{self.drops['stale']} stale observations skipped"
        return {"level": level, "message": message or "running", "values": values}


def check_bundle(settings: Settings) -> tuple[bool, str]:
    """The bundle and context files a reload would need exist (cheap file checks only)."""
    from .bundle import Bundle, Suffixes

    try:
        bundle = Bundle.open(settings.bundle_path(), settings["variant"])
        bundle.check(settings["backend"], Suffixes.from_mapping(settings.suffixes()))
    except MolmoActError as exc:
        return False, str(exc)
    return True, ""
