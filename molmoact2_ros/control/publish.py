"""What is published for a predicted chunk: when its rows run, how it meets the executing
chunk (blend, inpaint guidance; never across a change of what a row means), what the safety
stage lets through (the state, the rows, the trajectory's targets and the workspace), and the
pose its delta targets are integrated from. A fault that publishes nothing is said once per
episode: when it begins, again only after a chunk (or a state) passed.

A mixin of ``Controller`` (``controller.py``), sharing its state.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from ..policy import ActionChunk, Observation
from .chunk_io import Published, targets_of
from .execution import (
    Executing,
    auto_uses_observation,
    blend,
    chunk_timing,
    delta_dims,
    inpaint_guidance,
    takeover_reference,
)
from .params import Settings
from .safety import HeldChunk, UnsafeChunk, apply_safety, bound_targets, state_fault

log = logging.getLogger("molmoact2_ros.control.controller")
#: fault kinds whose episode ends when a chunk is published
CHUNK_FAULTS = ("non_finite", "unsafe_target", "outside_workspace", "unsafe_bounds")


def row_meaning(settings: Settings, action_type: str) -> tuple:
    """What a row means: chunks of a different meaning are never blended or compared (a
    target is not a step; a step of another scale or another gripper is another command)."""
    if action_type != "delta":
        return (action_type,)
    return (action_type, int(settings["execution.gripper_dim"]),
            tuple(float(v) for v in settings["execution.delta_scale"]))


class PublishControl:
    """Mixin of ``Controller``: from a predicted chunk to the ``Published`` one."""

    def _publish_chunk(self, chunk: ActionChunk, obs: Observation, settings: Settings,
                       action_type: str, guidance, received: int, received_mono: int,
                       jumps_before: int) -> Published | None:
        """Time, blend and check ``chunk``; publish it and make it the executing chunk, or
        count why not (None)."""
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
        mask = delta_dims(action_type, settings["execution.gripper_dim"], chunk.actions.shape[1])
        executing = self._executing_for(settings, action_type)
        prev = None if executing is None else executing.on_grid(period_ns)
        blended = blend(settings["execution.blend"], chunk.actions, prev,
                        timing.start_ns, timing.first_future_index,
                        ramp=settings["execution.crossfade_ramp"],
                        decay=settings["execution.ensemble_decay"])
        lower, upper, delta = settings.limits()
        takeover = takeover_reference(prev, timing.start_ns, timing.first_future_index)
        try:
            actions, report = apply_safety(
                blended.actions, lower=lower, upper=upper, max_step_delta=delta,
                previous=takeover, first_row=timing.first_future_index, delta=mask,
            )
        except UnsafeChunk as exc:
            self._fault("non_finite", str(exc))
            return None
        base_pose = self._base_pose(obs, prev, timing, action_type)
        try:
            actions, targets, clamped = bound_targets(
                actions, targets_of(actions, mask, base_pose, settings),
                sanity_abs=settings["safety.sanity_target_abs"], workspace=settings.workspace(),
                mode=settings["safety.workspace_mode"], delta=mask, base_pose=base_pose,
                scale_m=float(settings["execution.delta_scale"][0]))
            if clamped:
                # the clamped rows must still keep every other bound, or nothing is published
                _, check = apply_safety(actions, lower=lower, upper=upper, max_step_delta=delta,
                                        previous=takeover, first_row=timing.first_future_index,
                                        delta=mask)
                if check.clamped:
                    raise HeldChunk("unsafe_bounds", (
                        "clamping the targets onto the workspace would break action_min/"
                        "action_max or max_step_delta: the chunk was not published; widen the "
                        "workspace or the limits"))
        except HeldChunk as exc:
            self._fault(exc.kind, str(exc),
                        "warn" if exc.kind == "outside_workspace" else "error")
            return None
        self._fault_over(*CHUNK_FAULTS)
        if clamped:
            self.counts["workspace_clamped"] += clamped
            report = replace(report, clamped_to_workspace=clamped)
        if report.clamped:
            self.counts["clamped_chunks"] += 1
        self._sequence += 1
        published = Published(
            chunk, actions, self._sequence, report, settings, received, ready,
            timing.start_ns, timing.trajectory_stamp_ns, timing.first_future_index,
            action_type=action_type,
            base_pose=base_pose,
            start_mode=timing.mode,
            inpaint_frozen_rows=0 if guidance is None else int(guidance.frozen_rows),
            inpaint_weights=None if guidance is None else np.asarray(guidance.weights).copy(),
            inpaint_method="" if guidance is None else guidance.method,
            targets=targets)
        self.last_latency_ms = dict(chunk.latency_ms)
        self._last_action = actions[-1].copy()
        self._chunk_started_ns = timing.start_ns
        self._chunk_rows = actions.shape[0]
        self._executing = Executing(actions.copy(), timing.start_ns, period_ns, blended.counts,
                                    mask)
        self._executing_meaning = row_meaning(settings, action_type)
        self._targets = targets if mask is not None else None
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

    def _guidance(self, settings: Settings, stamp_ns: int, received_ns: int,
                  action_type: str):
        """Inpaint guidance for the next chunk from the executing one (blend=inpaint), on the
        timing the chunk is expected to get (auto: decided from the latency estimate)."""
        executing = self._executing_for(settings, action_type)
        if settings["execution.blend"] != "inpaint" or executing is None:
            return None
        latency_ns = int(self.latency_estimate_s * 1e9)
        ready_estimate = received_ns + latency_ns
        period_ns = int(round(settings["control_period_s"] * 1e9))
        horizon = executing.actions.shape[0]  # the same variant: swaps reset _executing
        mode = settings["execution.start"]
        if mode == "auto":
            mode = "observation" if auto_uses_observation(
                ready_estimate - stamp_ns, period_ns, horizon, latency_ns,
                int(settings["execution.overlap_s"] * 1e9)) else "receipt"
        start = stamp_ns if mode == "observation" else ready_estimate
        return inpaint_guidance(executing, start, ready_estimate, horizon,
                                period_ns=period_ns,
                                schedule=settings["execution.inpaint_schedule"],
                                method=settings["execution.inpaint_method"],
                                beta=settings["execution.inpaint_beta"])

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

    def _executing_for(self, settings: Settings, action_type: str) -> Executing | None:
        """The executing chunk if its rows mean what the next chunk's will, else None: a
        change of ``execution.action_type`` (or of the gripper or the scale of delta rows)
        ends blending, and the next chunk starts clean."""
        if self._executing is None or self._executing_meaning != row_meaning(settings,
                                                                             action_type):
            return None
        return self._executing

    def _refuse_state(self, state: np.ndarray, settings: Settings) -> bool:
        """True (counted, said once per episode) when the observed state must not be acted
        on: not finite, or beyond ``safety.sanity_state_abs``."""
        why = state_fault(state, float(settings["safety.sanity_state_abs"]))
        if why is None:
            self._fault_over("unsafe_state")
            return False
        self._fault("unsafe_state", why)
        return True

    def _fault(self, kind: str, message: str, level: str = "error") -> None:
        """Nothing published because of ``kind``: counted every time, the status says why, the
        log says it once per episode of the fault."""
        self.drops[kind] += 1
        self.health = (level, message)
        if kind not in self._faults:
            self._faults[kind] = message
            log.log(logging.ERROR if level == "error" else logging.WARNING,
                    "%s (said once until it clears; drop.%s counts it)", message, kind)

    def _fault_over(self, *kinds: str) -> None:
        """The episode of these faults ended: the next one is said again."""
        for kind in kinds:
            message = self._faults.pop(kind, None)
            if message is not None and self.health[1] == message:
                self.health = ("ok", "")
