"""Output safety: never publish non-finite actions; optional limits and step-delta clamps."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class UnsafeChunk(Exception):
    """A chunk that must not be published (NaN/inf)."""


@dataclass(frozen=True)
class SafetyReport:
    """What the safety stage did to one chunk."""

    clamped_to_limits: int = 0
    clamped_step_delta: int = 0

    @property
    def clamped(self) -> bool:
        return bool(self.clamped_to_limits or self.clamped_step_delta)

    def describe(self) -> str:
        return (
            f"clamped {self.clamped_to_limits} values to action limits and "
            f"{self.clamped_step_delta} values to max_step_delta"
        )


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
