"""Parameter changes and background session swaps of the controller, under one lock.

Every change goes through ``validate``/``apply`` (or ``request``, both at once) while
``Controller._lock`` is held, so a batch is checked and applied against the same settings.
During a swap ``settings`` already holds the target configuration; live changes made meanwhile
are handed to the new sessions when they are up, reload changes and instructions are refused
with a reason (an instruction can only be checked against the variant once it is loaded).
"""

from __future__ import annotations

import logging
import threading

from ..errors import MolmoActError
from .chunk_io import check_bundle
from .params import CONFIGURE, LIVE, PARAMS, RELOAD, Settings, apply_kind, validate_changes

UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = "unconfigured", "inactive", "active", "finalized"
#: Parameters a running policy is told about when they change (the rest are read per chunk).
POLICY_LIVE = ("flow_steps", "instruction")
RELOAD_NAMES = tuple(p.name for p in PARAMS if p.apply == RELOAD)
log = logging.getLogger("molmoact2_ros.control.controller")


class SettingsControl:
    """Mixin of ``Controller``: validation, application and swaps of parameter changes."""

    @property
    def swapping(self) -> bool:
        return self._swapping

    def _effective(self, changes: dict) -> dict:
        """Drop values equal to what is already set (or pending for configure)."""
        current = self.settings.with_changes(self.pending_configure)
        return {k: v for k, v in changes.items()
                if k not in current.values or current[k] != v}

    def validate(self, changes: dict) -> tuple[bool, str]:
        """Synchronous check of a parameter batch (what ``ros2 param set`` sees)."""
        with self._lock:
            changes = self._effective(changes)
            if not changes:
                return True, ""
            ok, reason = validate_changes(changes, self.settings)
            if not ok:
                return ok, reason
            kind = apply_kind(changes)
            if self._swapping:
                target = self.settings["variant"]
                if kind == RELOAD:
                    return False, (f"a session swap to {target} is in progress; "
                                   "try again when it finishes")
                if "instruction" in changes:
                    return False, (f"a session swap to {target} is in progress; the instruction "
                                   "is checked against the loaded variant: set it again when "
                                   "the swap finishes")
            proposed = self.settings.with_changes(changes)
            if kind == RELOAD and self.state in (INACTIVE, ACTIVE):
                ok, reason = check_bundle(proposed)
                if not ok:
                    return ok, reason
            if changes.get("instruction") and self.policy is not None and kind != RELOAD:
                try:
                    self.policy.plan(changes["instruction"])
                except MolmoActError as exc:
                    return False, str(exc)
            return True, ""

    def apply(self, changes: dict) -> str:
        """Apply a validated batch; returns how: live, reload (background) or configure."""
        with self._lock:
            changes = self._effective(changes)
            kind = apply_kind(changes)
            if not changes:
                return LIVE
            if kind == CONFIGURE and self.state in (INACTIVE, ACTIVE):
                self.pending_configure.update(changes)
                return CONFIGURE
            old, new = self.settings, self.settings.with_changes(changes)
            self.settings = new
            if kind == RELOAD and self.state in (INACTIVE, ACTIVE):
                self._swapping = True
                self.health = ("warn", f"session swap to {new['variant']} in progress")
                self._swap = threading.Thread(target=self._swap_sessions, args=(old, new),
                                              name="molmoact2-swap", daemon=True)
                self._swap.start()
                return RELOAD
            self._pending_live.update({k: v for k, v in changes.items() if k in POLICY_LIVE})
        # Never wait for a running chunk here (this runs in the parameter service): the change
        # is queued and the inference thread applies it before its next chunk.
        if self._policy_lock.acquire(blocking=False):
            try:
                self._apply_pending_live()
            finally:
                self._policy_lock.release()
        return kind

    def request(self, changes: dict) -> tuple[bool, str, str]:
        """``validate`` and ``apply`` as one step under the lock: ``(ok, reason, how)``."""
        with self._lock:
            ok, reason = self.validate(changes)
            return ok, reason, self.apply(changes) if ok else ""

    def _apply_pending_live(self) -> None:
        """Hand queued live changes to the policy; call with ``_policy_lock`` held."""
        with self._lock:
            changes, self._pending_live = self._pending_live, {}
            settings = self.settings
        if self.policy is None or not changes:
            return
        if "flow_steps" in changes:
            self.policy.set_flow_steps(settings.flow_steps() or self._default_steps())
        if changes.get("instruction"):
            try:
                self.policy.set_instruction(changes["instruction"])
            except MolmoActError as exc:  # validated before; say so if it fails anyway
                self.counts["refused_live_changes"] += 1
                running = getattr(self.policy, "instruction", None)
                if running is not None:
                    with self._lock:  # settings say what runs: never split
                        self.settings = self.settings.with_changes({"instruction": running})
                self.health = ("warn", f"instruction not applied, the previous one stays: {exc}")
                log.error("instruction not applied, the previous one stays: %s", exc)

    def _default_steps(self) -> int:
        from ..bundle.variants import get_variant

        return get_variant(self.settings["variant"]).default_flow_steps

    def wait_for_swap(self, timeout_s: float | None = None) -> None:
        if self._swap is not None:
            self._swap.join(timeout_s)

    def _swap_sessions(self, old: Settings, new: Settings) -> None:
        """Pause inference, release the old sessions, load the new ones; roll back on failure.

        If the rollback fails too, no runtime is loaded: diagnostics say ERROR, observations
        are dropped as ``no_runtime``, deactivate/cleanup work and a new variant loads.
        """
        ok, reason, policy = True, "", None
        with self._policy_lock:
            if self.state not in (INACTIVE, ACTIVE):  # cleaned up before the swap began
                with self._lock:
                    self._swapping = False
                return
            if self.policy is not None:
                self.policy.close()
                self.policy = None
            loaded_with = new
            try:
                policy = self._factory(new)
            except Exception as exc:
                ok, reason = False, f"loading {new['variant']} failed ({exc}); rolled back"
                log.error("%s", reason)
                with self._lock:
                    loaded_with = self.settings.with_changes(
                        {k: old[k] for k in RELOAD_NAMES})
                try:
                    policy = self._factory(loaded_with)
                except Exception as exc2:
                    policy = None
                    reason = (f"loading {new['variant']} failed ({exc}) and the previous "
                              f"configuration failed to load too ({exc2}): no runtime is "
                              "loaded; set 'variant' to load one, or deactivate and cleanup")
                    log.error("%s", reason)
            with self._lock:
                self.policy = policy
                self.settings = self.settings.with_changes(
                    {k: loaded_with[k] for k in RELOAD_NAMES})
                # Live changes accepted while loading reach the new sessions now.
                self._pending_live.update({k: self.settings[k] for k in POLICY_LIVE
                                           if self.settings[k] != loaded_with[k]})
                self._slot.clear()
                self._last_action = None
                self._executing = None  # blending never spans a swap
                self.counts["swaps" if ok else "swap_failures"] += 1
                self.health = ("ok", "") if ok else (
                    ("error", reason) if policy is None else ("warn", reason))
                self._swapping = False
                final = self.settings
            if policy is not None:
                self._apply_pending_live()
        if self._on_swap_done is not None:
            self._on_swap_done(ok, reason, final)
