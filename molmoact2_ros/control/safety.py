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
) -> tuple[np.ndarray, SafetyReport]:
    """Return a safe copy of ``actions`` [T, D] and what was changed.

    Raises ``UnsafeChunk`` if any value is NaN/inf: such a chunk is dropped, never repaired.
    ``max_step_delta`` bounds the change between consecutive actions, starting from
    ``previous`` (the last action published) when given.
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
        limit = np.asarray(max_step_delta, np.float32)
        prev = None if previous is None else np.asarray(previous, np.float32)
        for i in range(actions.shape[0]):
            if prev is not None:
                row = np.clip(actions[i], prev - limit, prev + limit)
                n_delta += int(np.count_nonzero(row != actions[i]))
                actions[i] = row
            prev = actions[i]
    return actions, SafetyReport(n_limits, n_delta)
