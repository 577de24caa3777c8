"""Parameter changes and background session swaps of the controller, under one lock.

Every change goes through ``validate``/``apply`` (or ``request``, both at once) while
``Controller._lock`` is held, so a batch is checked and applied against the same settings.
During a swap ``settings`` already holds the target configuration; live changes made meanwhile
are handed to the new sessions when they are up, reload changes and instructions are refused
with a reason. Before a reload starts, the instruction is checked against the prompt files of
the variant it will load; a mixed batch is split by kind (configure-time values wait).
"""

from __future__ import annotations

import logging
import threading

from ..errors import MolmoActError
from .chunk_io import check_bundle, check_instruction, prompt_refusal
from .params import (
    CONFIGURE,
    LIVE,
    PARAMS,
    PARAMS_BY_NAME,
    RELOAD,
    Settings,
    apply_kind,
    validate_changes,
)

UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = "unconfigured", "inactive", "active", "finalized"
#: Parameters a running policy is told about when they change (the rest are read per chunk).
POLICY_LIVE = ("flow_steps", "instruction", "seed")
RELOAD_NAMES = tuple(p.name for p in PARAMS if p.apply == RELOAD)
log = logging.getLogger("molmoact2_ros.control.controller")


class SettingsControl:
    """Mixin of ``Controller``: validation, application and swaps of parameter changes."""

    @property
    def swapping(self) -> bool:
        return self._swapping

    def _effective(self, changes: dict) -> dict:
        """Drop values equal to what is already set (or pending for configure). With no
        runtime loaded (a swap and its rollback failed) a reload value is kept even if equal:
        setting the variant again must load it, never be a silent no-op."""
        current = self.settings.with_changes(self.pending_configure)
        no_runtime = (self.policy is None and self.state in (INACTIVE, ACTIVE)
                      and not self._swapping)
        return {k: v for k, v in changes.items()
                if k not in current.values or current[k] != v
                or (no_runtime and _kind(k) == RELOAD)}

    def validate(self, changes: dict) -> tuple[bool, str]:
        """Synchronous check of a parameter batch (what ``ros2 param set`` sees). Never
        raises: an unexpected error of a check becomes a refusal naming it."""
        try:
            return self._validate(changes)
        except Exception as exc:  # a policy or tokenizer bug must not reach rclpy
            log.error("parameter check failed: %s: %s", type(exc).__name__, exc)
            return False, f"refused: the check failed ({type(exc).__name__}: {exc})"

    def _validate(self, changes: dict) -> tuple[bool, str]:
        with self._lock:
            changes = self._effective(changes)
            if not changes:
                return True, ""
            ok, reason = validate_changes(changes, self.settings)
            if not ok:
                return ok, reason
            kinds = {_kind(k) for k in changes}
            if self._swapping:
                target = self.settings["variant"]
                if RELOAD in kinds:
                    return False, (f"a session swap to {target} is in progress; "
                                   "try again when it finishes")
                if "instruction" in changes:
                    return False, (f"a session swap to {target} is in progress; the instruction "
                                   "is checked against the loaded variant: set it again when "
                                   "the swap finishes")
            proposed = self.settings.with_changes(changes)
            if RELOAD in kinds and self.state in (INACTIVE, ACTIVE):
                ok, reason = check_bundle(proposed)
                if not ok:
                    return ok, reason
                if proposed["instruction"]:  # against the variant the reload will load
                    ok, reason = check_instruction(proposed)
                    if not ok:
                        return ok, reason
            if changes.get("instruction") and self.policy is not None and RELOAD not in kinds:
                try:
                    self.policy.plan(changes["instruction"])
                except MolmoActError as exc:
                    return False, str(exc)
            elif changes.get("instruction") and RELOAD not in kinds and proposed.bundle_path():
                reason = prompt_refusal(proposed)  # not configured yet: the bundle's prompt
                if reason:
                    return False, reason
            return True, ""

    def apply(self, changes: dict) -> str:
        """Apply a validated batch; returns how: live, reload (background) or configure,
        ``+configure`` when a mixed batch left configure-time values for the next configure
        (the live and reload ones apply now)."""
        with self._lock:
            changes = self._effective(changes)
            kind = apply_kind(changes)
            if not changes:
                return LIVE
            later = ""
            if kind == CONFIGURE and self.state in (INACTIVE, ACTIVE):
                self.pending_configure.update(
                    {k: v for k, v in changes.items() if _kind(k) == CONFIGURE})
                changes = {k: v for k, v in changes.items() if _kind(k) != CONFIGURE}
                if not changes:
                    return CONFIGURE
                kind, later = apply_kind(changes), "+" + CONFIGURE
            old, new = self.settings, self.settings.with_changes(changes)
            self.settings = new
            if kind == RELOAD and self.state in (INACTIVE, ACTIVE):
                self._swapping = True
                self.health = ("warn", f"session swap to {new['variant']} in progress")
                self._swap = threading.Thread(target=self._swap_sessions, args=(old, new),
                                              name="molmoact2-swap", daemon=True)
                self._swap.start()
                return RELOAD + later
            self._pending_live.update({k: v for k, v in changes.items() if k in POLICY_LIVE})
        # Never wait for a running chunk here (this runs in the parameter service): the change
        # is queued and the inference thread applies it before its next chunk.
        if self._policy_lock.acquire(blocking=False):
            try:
                self._apply_pending_live()
            finally:
                self._policy_lock.release()
        return kind + later

    def request(self, changes: dict) -> tuple[bool, str, str]:
        """``validate`` and ``apply`` as one step under the lock: ``(ok, reason, how)``.
        Never raises (the node's parameter callback has no try)."""
        with self._lock:
            ok, reason = self.validate(changes)
            if not ok:
                return ok, reason, ""
            try:
                return ok, reason, self.apply(changes)
            except Exception as exc:
                log.error("parameter change failed: %s: %s", type(exc).__name__, exc)
                return False, f"refused: applying it failed ({type(exc).__name__}: {exc})", ""

    def _apply_pending_live(self) -> None:
        """Hand queued live changes to the policy; call with ``_policy_lock`` held."""
        with self._lock:
            changes, self._pending_live = self._pending_live, {}
            settings = self.settings
        if self.policy is None or not changes:
            return
        if "flow_steps" in changes:
            self.policy.set_flow_steps(settings.flow_steps() or self._default_steps())
        if "seed" in changes:
            self.policy.reseed(None if settings["seed"] < 0 else settings["seed"])
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


def _kind(name: str) -> str:
    spec = PARAMS_BY_NAME.get(name)
    return spec.apply if spec is not None else LIVE
