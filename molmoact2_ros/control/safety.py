"""Output safety: never publish non-finite actions; optional limits and step-delta clamps; what
reaches the arm (the observed state, the trajectory's targets) sane, finite and inside the
workspace box."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class UnsafeChunk(Exception):
    """A chunk that must not be published (NaN/inf)."""


class HeldChunk(Exception):
    """A chunk that is not published; ``kind`` is the drop counter it is counted under."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class SafetyReport:
    """What the safety stage did to one chunk."""

    clamped_to_limits: int = 0
    clamped_step_delta: int = 0
    #: trajectory targets clamped onto the workspace box (x, y, z values)
    clamped_to_workspace: int = 0

    @property
    def clamped(self) -> bool:
        return bool(self.clamped_to_limits or self.clamped_step_delta
                    or self.clamped_to_workspace)

    def describe(self) -> str:
        text = (f"clamped {self.clamped_to_limits} values to action limits and "
                f"{self.clamped_step_delta} values to max_step_delta")
        if self.clamped_to_workspace:
            text += f", {self.clamped_to_workspace} target values onto the workspace"
        return text


def apply_safety(
    actions: np.ndarray,
    *,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
    max_step_delta: np.ndarray | None = None,
    previous: np.ndarray | None = None,
    first_row: int = 0,
    delta: np.ndarray | None = None,
) -> tuple[np.ndarray, SafetyReport]:
    """Return a safe copy of ``actions`` [T, D] and what was changed.

    Raises ``UnsafeChunk`` if any value is NaN/inf: such a chunk is dropped, never repaired.
    ``max_step_delta`` bounds the change between consecutive commands from row ``first_row``
    on (rows already due are left alone), the first against ``previous`` (the command the
    robot executes on the tick before) when given. In the dims marked by ``delta`` a row is
    itself the step the robot takes, so it is bounded directly.
    """
    actions = np.array(actions, dtype=np.float32, copy=True)
    bad = ~np.isfinite(actions)
    if bad.any():
        rows = sorted(set(np.argwhere(bad)[:, 0].tolist()))
        raise UnsafeChunk(f"chunk has NaN/inf in rows {rows}; it was not published")
    n_limits = 0
    if lower is not None or upper is not None:
        lo = -np.inf if lower is None else np.asarray(lower, np.float32)
        hi = np.inf if upper is None else np.asarray(upper, np.float32)
        clipped = np.clip(actions, lo, hi)
        n_limits = int(np.count_nonzero(clipped != actions))
        actions = clipped
    n_delta = 0
    if max_step_delta is not None:
        limit = np.broadcast_to(np.asarray(max_step_delta, np.float32), actions.shape[1:]).copy()
        steps = np.zeros(actions.shape[1], bool) if delta is None else np.asarray(delta, bool)
        prev = None if previous is None else np.asarray(previous, np.float32)
        for i in range(max(int(first_row), 0), actions.shape[0]):
            row = actions[i].copy()
            row[steps] = np.clip(row[steps], -limit[steps], limit[steps])
            if prev is not None:
                pos = ~steps
                row[pos] = np.clip(row[pos], prev[pos] - limit[pos], prev[pos] + limit[pos])
            n_delta += int(np.count_nonzero(row != actions[i]))
            actions[i] = row
            prev = actions[i]
    return actions, SafetyReport(n_limits, n_delta)


def state_fault(state: np.ndarray, limit: float) -> str | None:
    """Why the observed state must not be acted on (not finite, or a value beyond ``limit``,
    ``safety.sanity_state_abs``), or None."""
    state = np.asarray(state, np.float64).reshape(-1)
    bad = np.flatnonzero(~np.isfinite(state))
    if bad.size:
        return (f"the observed state is not finite (values {bad.tolist()}): nothing published "
                "until it is; check the state source")
    if state.size and float(np.abs(state).max()) > limit:
        i = int(np.argmax(np.abs(state)))
        return (f"the observed state's value {i} is {state[i]:.4g}, beyond "
                f"safety.sanity_state_abs={limit:g}: nothing published until it is back; check "
                "the state source and its units")
    return None


def bound_targets(
    actions: np.ndarray,
    targets: np.ndarray,
    *,
    sanity_abs: float,
    workspace: tuple | None = None,
    mode: str = "clamp",
    delta: np.ndarray | None = None,
    base_pose: np.ndarray | None = None,
    scale_m: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(actions, targets, clamped)``: the trajectory's ``targets`` [H, D] checked and, with a
    ``workspace`` (lower, upper x, y, z), kept inside it on their first three values.

    Raises ``HeldChunk`` for a target that is not finite or beyond ``sanity_abs`` (garbage is
    never clamped into a command), a ``base_pose`` outside the box (clamping would jump the arm
    back into it in one step) and, with ``mode="hold"``, any target outside it. With ``clamp``
    the targets are clamped and the rows follow: absolute rows take the clamped value, delta
    rows (``delta``, integrated from ``base_pose`` with ``scale_m``) become the steps between
    clamped targets, never larger than the step they replace.
    """
    targets = np.array(targets, np.float64, copy=True)
    bad = ~np.isfinite(targets)
    if bad.any():
        rows = sorted(set(np.argwhere(bad)[:, 0].tolist()))
        raise HeldChunk("unsafe_target", f"trajectory targets are not finite in rows {rows}: "
                                         "the chunk was not published")
    if targets.size and float(np.abs(targets).max()) > sanity_abs:
        row, dim = np.unravel_index(int(np.argmax(np.abs(targets))), targets.shape)
        raise HeldChunk("unsafe_target", (
            f"trajectory target row {row} value {dim} is {targets[row, dim]:.4g}, beyond "
            f"safety.sanity_target_abs={sanity_abs:g}: the chunk was not published; check the "
            "policy's output and execution.delta_scale"))
    actions = np.array(actions, np.float32, copy=True)
    if workspace is None:
        return actions, targets, 0
    lo = np.asarray(workspace[0], np.float64)
    hi = np.asarray(workspace[1], np.float64)
    n = min(3, targets.shape[1])
    lo, hi = lo[:n], hi[:n]
    integrated = np.zeros(n, bool) if delta is None else np.asarray(delta, bool)[:n]
    if integrated.any() and base_pose is not None:
        pose = np.asarray(base_pose, np.float64)[:n]
        if np.any((pose < lo) | (pose > hi)):
            raise HeldChunk("outside_workspace", (
                f"the observed pose {np.round(pose, 4).tolist()} is outside the workspace "
                f"(safety.workspace_min {lo.tolist()}, safety.workspace_max {hi.tolist()}): "
                "nothing published until the arm is back inside"))
    position = targets[:, :n]
    outside = (position < lo) | (position > hi)
    count = int(np.count_nonzero(outside))
    if count == 0:
        return actions, targets, 0
    if mode == "hold":
        row, dim = np.argwhere(outside)[0]
        raise HeldChunk("outside_workspace", (
            f"trajectory target row {row} value {dim} is {position[row, dim]:.4g}, outside the "
            f"workspace [{lo[dim]:g}, {hi[dim]:g}] (safety.workspace_min/safety.workspace_max): "
            "the chunk was held (safety.workspace_mode=hold)"))
    clamped = np.clip(position, lo, hi)
    for d in range(n):
        if integrated[d] and base_pose is not None:
            path = np.concatenate([[float(np.asarray(base_pose, np.float64)[d])], clamped[:, d]])
            steps = np.diff(path) / scale_m
            old = actions[:, d].astype(np.float64)
            actions[:, d] = np.clip(steps, np.minimum(old, 0.0), np.maximum(old, 0.0))
        else:
            actions[:, d] = clamped[:, d]
    targets[:, :n] = clamped
    return actions, targets, count
