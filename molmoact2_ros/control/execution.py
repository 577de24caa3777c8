"""Chunk execution timing and continuity across replans: start stamps, blending, inpaint guidance.

Action ``i`` of a chunk is meant to run at ``start + (i+1)·period``. With ``start=observation``
the start is the observation stamp (the moment the policy planned for), so rows whose time has
passed when the chunk is published are marked by ``first_future_index``; with ``receipt`` the
chunk starts when it is received. Blending reconciles a new chunk with the rows of the chunk
the robot is still executing (numpy only; the controller and the closed-loop bench share it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..host.flow import InpaintGuidance

START_MODES = ("observation", "receipt")
BLENDS = ("none", "crossfade", "ensemble", "inpaint")
RAMPS = ("linear", "cosine")


@dataclass(frozen=True)
class ChunkTiming:
    """When a published chunk runs: row i at ``start_ns + (i+1)·period_ns``."""

    start_ns: int
    #: JointTrajectory header stamp: the start, or 0 (= "start when received") for receipt.
    trajectory_stamp_ns: int
    #: index of the first row whose time is still ahead at publish time (horizon = none).
    first_future_index: int


def chunk_timing(
    mode: str, observation_ns: int, publish_ns: int, period_ns: int, horizon: int
) -> ChunkTiming:
    """Start stamp, trajectory header stamp and first future row of a chunk published now."""
    if mode == "receipt":
        return ChunkTiming(int(publish_ns), 0, 0)
    if mode != "observation":
        raise ValueError(f"execution.start={mode!r}; choose one of {', '.join(START_MODES)}")
    return ChunkTiming(
        int(observation_ns),
        int(observation_ns),
        first_future_index(observation_ns, publish_ns, period_ns, horizon),
    )


def first_future_index(start_ns: int, now_ns: int, period_ns: int, horizon: int) -> int:
    """Number of rows due at or before ``now_ns`` (row i is due at start + (i+1)·period)."""
    if period_ns <= 0:
        raise ValueError(f"period must be > 0 ns, got {period_ns}")
    due = (int(now_ns) - int(start_ns)) // int(period_ns)
    return int(min(max(due, 0), horizon))


@dataclass(frozen=True)
class Executing:
    """The chunk the robot is executing, as published (de-normalised rows)."""

    actions: np.ndarray
    start_ns: int
    period_ns: int
    #: ensemble: how many predictions each row averages (None = 1 each)
    counts: np.ndarray | None = None

    def row_offset(self, start_ns: int) -> int:
        """Row of this chunk that runs at the same time as row 0 of a chunk from ``start_ns``."""
        return int(round((int(start_ns) - self.start_ns) / self.period_ns))

    def at_rows(self, start_ns: int, rows: int) -> np.ndarray:
        """This chunk's command at the times of rows 0..rows-1 of a chunk from ``start_ns``
        (the last row held after its end, the first before its start)."""
        idx = np.clip(np.arange(rows) + self.row_offset(start_ns), 0, len(self.actions) - 1)
        return self.actions[idx]

    def overlap(self, start_ns: int, horizon: int) -> tuple[int, int]:
        """``(offset, rows)``: rows 0..rows-1 of the new chunk coincide with rows offset+i here."""
        offset = self.row_offset(start_ns)
        if offset < 0:
            return offset, 0
        return offset, int(min(max(len(self.actions) - offset, 0), horizon))


@dataclass(frozen=True)
class BlendResult:
    """A blended chunk plus what diagnostics report about the switch."""

    actions: np.ndarray
    overlap_rows: int
    boundary_jump: float
    counts: np.ndarray


def ramp_weights(rows: int, ramp: str = "linear") -> np.ndarray:
    """Weights of the new chunk over ``rows`` overlapping rows: strictly between 0 and 1,
    rising (``linear``: k/(rows+1); ``cosine``: the same through ½(1 − cos πx))."""
    x = np.arange(1, rows + 1, dtype=np.float64) / (rows + 1)
    if ramp == "cosine":
        return 0.5 - 0.5 * np.cos(np.pi * x)
    if ramp != "linear":
        raise ValueError(f"execution.crossfade_ramp={ramp!r}; choose one of {', '.join(RAMPS)}")
    return x


def boundary_jump(actions: np.ndarray, prev: Executing | None, start_ns: int, first: int) -> float:
    """Largest per-dimension change the robot sees at the switch: the new chunk's first future
    row against what the previous chunk commands at that time."""
    if prev is None or first >= len(actions):
        return 0.0
    old = prev.at_rows(start_ns, first + 1)[first]
    return float(np.max(np.abs(actions[first].astype(np.float64) - old)))


def blend(
    mode: str,
    new: np.ndarray,
    prev: Executing | None,
    start_ns: int,
    first_future: int,
    *,
    ramp: str = "linear",
    decay: float = 0.01,
) -> BlendResult:
    """Blend ``new`` [H, D] (row i at start + (i+1)·period) with the executing chunk.

    - ``none`` and ``inpaint`` (continuity comes from the flow loop): ``new`` unchanged;
    - ``crossfade``: overlap rows already due keep the old values; the future overlap rows go
      from old to new by ``ramp``; rows past the overlap are new;
    - ``ensemble`` (ACT): each overlap row is the average of every prediction for its time
      with weights exp(−decay·k), k = 0 for the oldest.
    """
    if mode not in BLENDS:
        raise ValueError(f"execution.blend={mode!r}; choose one of {', '.join(BLENDS)}")
    new = np.asarray(new, dtype=np.float32)
    horizon = new.shape[0]
    counts = np.ones(horizon, np.int64)
    if prev is None:
        return BlendResult(new.copy(), 0, 0.0, counts)
    offset, rows = prev.overlap(start_ns, horizon)
    out = new.astype(np.float64)
    if rows and mode == "crossfade":
        old = prev.actions[offset : offset + rows].astype(np.float64)
        first = min(first_future, rows)
        out[:first] = old[:first]
        w = ramp_weights(rows - first, ramp)[:, None]
        out[first:rows] = (1.0 - w) * old[first:] + w * out[first:rows]
    elif rows and mode == "ensemble":
        old = prev.actions[offset : offset + rows].astype(np.float64)
        old_counts = (np.ones(len(prev.actions), np.int64) if prev.counts is None
                      else np.asarray(prev.counts, np.int64))[offset : offset + rows]
        # sum_{k<c} exp(-decay k): the weight the c earlier predictions carry together
        k = np.arange(int(old_counts.max()) + 1)
        cumulative = np.concatenate([[0.0], np.cumsum(np.exp(-decay * k))])
        old_weight = cumulative[old_counts][:, None]
        new_weight = np.exp(-decay * old_counts)[:, None]
        out[:rows] = (old_weight * old + new_weight * out[:rows]) / (old_weight + new_weight)
        counts[:rows] = old_counts + 1
    out32 = out.astype(np.float32)
    jump = boundary_jump(out32, prev, start_ns, first_future)
    return BlendResult(out32, rows, jump, counts)


def inpaint_weights(frozen: int, overlap: int, horizon: int) -> np.ndarray:
    """1 for the first ``frozen`` rows, decaying to 0 over the rest of the overlap, 0 beyond
    (real-time chunking's soft mask c·(e^c − 1)/(e − 1), c = (overlap−i)/(overlap−frozen+1))."""
    w = np.zeros(horizon, np.float32)
    overlap = int(min(max(overlap, 0), horizon))
    frozen = int(min(max(frozen, 0), overlap))
    w[:frozen] = 1.0
    i = np.arange(frozen, overlap, dtype=np.float64)
    c = (overlap - i) / (overlap - frozen + 1)
    w[frozen:overlap] = c * np.expm1(c) / math.expm1(1.0)
    return w


def inpaint_guidance(
    prev: Executing | None, start_ns: int, ready_estimate_ns: int, horizon: int
) -> InpaintGuidance | None:
    """Guidance for a chunk that will run from ``start_ns`` and be ready at about
    ``ready_estimate_ns``: the rows due by then and the first one it will execute
    (d = floor((ready − start)/period) + 1) are frozen to the executing chunk's, the rest of
    its overlap decays; None without an overlap."""
    if prev is None:
        return None
    offset, rows = prev.overlap(start_ns, horizon)
    if rows <= 0:
        return None
    frozen = max(int(ready_estimate_ns) - int(start_ns), 0) // prev.period_ns + 1
    prefix = np.zeros((horizon, prev.actions.shape[1]), np.float32)
    prefix[:rows] = prev.actions[offset : offset + rows]
    weights = inpaint_weights(frozen, rows, horizon)
    return InpaintGuidance(prefix, weights, int(min(frozen, rows)), rows)
