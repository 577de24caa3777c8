"""Chunk execution timing and continuity across replans: start stamps, blending, inpaint guidance.

Action ``i`` of a chunk is meant to run at ``start + (i+1)·period``. With ``start=observation``
the start is the observation stamp (the moment the policy planned for), so rows whose time has
passed when the chunk is published are marked by ``first_future_index``; with ``receipt`` the
chunk starts when it is received; ``auto`` takes the observation stamp while the rows still
ahead cover the next chunk's latency plus the overlap, and receipt otherwise. Blending
reconciles a new chunk with the rows of the chunk the robot is still executing, by time (numpy
only; the controller and the closed-loop bench share it).

Rows are ``absolute`` targets or ``delta`` commands (LIBERO: a pose step per tick that the
robot integrates, the gripper absolute). For deltas the executing chunk commands zero (stop)
after its last row, never a repeat of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..host.flow import DEFAULT_BETA, InpaintGuidance

START_MODES = ("auto", "observation", "receipt")
BLENDS = ("none", "crossfade", "ensemble", "inpaint")
RAMPS = ("linear", "cosine")
#: ``bundle``: the policy's own control mode (LIBERO: delta end-effector pose)
ACTION_TYPES = ("bundle", "delta", "absolute")
#: real-time chunking's prefix mask between the frozen rows and the end of the overlap
SCHEDULES = ("hard", "linear", "exp")


def resolve_action_type(setting: str, policy: object) -> str:
    """``delta`` or ``absolute``: the setting, or with ``bundle`` the policy's ``action_type``
    (a policy that declares none is taken as absolute)."""
    if setting not in ACTION_TYPES:
        raise ValueError(f"execution.action_type={setting!r}; choose one of "
                         f"{', '.join(ACTION_TYPES)}")
    if setting != "bundle":
        return setting
    declared = getattr(policy, "action_type", None)
    return declared if declared in ("delta", "absolute") else "absolute"


def delta_dims(action_type: str, gripper_dim: int, dims: int = 7) -> np.ndarray | None:
    """Which of ``dims`` dims the robot integrates: with ``delta`` every dim but
    ``gripper_dim`` (``execution.gripper_dim``: an absolute command; -1 = none), never
    inferred from a name; None for absolute chunks."""
    if action_type != "delta":
        return None
    mask = np.ones(int(dims), bool)
    if 0 <= int(gripper_dim) < dims:
        mask[int(gripper_dim)] = False
    return mask


@dataclass(frozen=True)
class ChunkTiming:
    """When a published chunk runs: row i at ``start_ns + (i+1)·period_ns``."""

    start_ns: int
    #: JointTrajectory header stamp: the start, or 0 (= "start when received") for receipt.
    trajectory_stamp_ns: int
    #: index of the first row whose time is still ahead at publish time (horizon = none).
    first_future_index: int
    #: the timing used: observation or receipt (auto resolves to one of them)
    mode: str = "observation"


def auto_uses_observation(delay_ns: int, period_ns: int, horizon: int, next_latency_ns: int,
                          overlap_ns: int) -> bool:
    """``auto``: observation timing while the rows still ahead after ``delay_ns`` cover the
    next chunk's latency plus the overlap (else the robot would wait for the next chunk)."""
    first = first_future_index(0, delay_ns, period_ns, horizon)
    return (horizon - first) * period_ns >= max(next_latency_ns, 0) + max(overlap_ns, 1)


def chunk_timing(
    mode: str, observation_ns: int, publish_ns: int, period_ns: int, horizon: int,
    *, next_latency_ns: int = 0, overlap_ns: int = 0,
) -> ChunkTiming:
    """Start stamp, trajectory header stamp and first future row of a chunk published now.

    ``auto`` uses the observation stamp when ``auto_uses_observation`` holds for the delay
    ``publish − observation``, the expected latency of the next chunk and the overlap."""
    if mode not in START_MODES:
        raise ValueError(f"execution.start={mode!r}; choose one of {', '.join(START_MODES)}")
    if mode == "auto":
        mode = "observation" if auto_uses_observation(
            int(publish_ns) - int(observation_ns), period_ns, horizon, next_latency_ns,
            overlap_ns) else "receipt"
    if mode == "receipt":
        return ChunkTiming(int(publish_ns), 0, 0, "receipt")
    return ChunkTiming(
        int(observation_ns),
        int(observation_ns),
        first_future_index(observation_ns, publish_ns, period_ns, horizon),
        "observation",
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
    #: dims the robot integrates (delta chunks); None = absolute rows
    delta: np.ndarray | None = None

    def row_offset(self, start_ns: int) -> int:
        """Row of this chunk that runs at the same time as row 0 of a chunk from ``start_ns``."""
        return int(round((int(start_ns) - self.start_ns) / self.period_ns))

    def rows_at(self, index: np.ndarray) -> np.ndarray:
        """The command of rows ``index`` (any integers): before the start the first row; after
        the end the last row held, or zero (stop) in the dims the robot integrates."""
        index = np.asarray(index)
        out = self.actions[np.clip(index, 0, len(self.actions) - 1)].astype(np.float32)
        if self.delta is not None:
            out[np.ix_(index >= len(self.actions), self.delta)] = 0.0
        return out

    def at_rows(self, start_ns: int, rows: int) -> np.ndarray:
        """This chunk's command at the times of rows 0..rows-1 of a chunk from ``start_ns``
        (the first row before its start; after its end see ``rows_at``)."""
        return self.rows_at(np.arange(rows) + self.row_offset(start_ns))

    def on_grid(self, period_ns: int) -> Executing:
        """This chunk resampled at ``period_ns`` over the same time span (a live
        ``control_period_s`` change): absolute dims interpolated linearly at the new times,
        delta dims as the displacement over each new tick (the integrated path is kept)."""
        period_ns = int(period_ns)
        if period_ns == self.period_ns:
            return self
        old = self.actions.astype(np.float64)
        rows = len(old)
        span = rows * self.period_ns
        new_rows = max(int(span // period_ns), 1)
        t_old = (np.arange(rows) + 1) * self.period_ns
        t_new = (np.arange(new_rows) + 1) * period_ns
        out = np.empty((new_rows, old.shape[1]), np.float64)
        for d in range(old.shape[1]):
            if self.delta is not None and self.delta[d]:
                path = np.concatenate([[0.0], np.cumsum(old[:, d])])
                at = np.interp(np.concatenate([[0], t_new]), np.concatenate([[0], t_old]), path)
                out[:, d] = np.diff(at)
            else:
                out[:, d] = np.interp(t_new, t_old, old[:, d])
        counts = None
        if self.counts is not None:
            near = np.clip(np.round(t_new / self.period_ns).astype(int) - 1, 0, rows - 1)
            counts = np.asarray(self.counts)[near]
        return Executing(out.astype(np.float32), self.start_ns, period_ns, counts, self.delta)

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
    row against what the previous chunk commands at that time (for deltas: the change of the
    step, i.e. of the velocity the robot integrates)."""
    if prev is None or first >= len(actions):
        return 0.0
    old = prev.at_rows(start_ns, first + 1)[first]
    return float(np.max(np.abs(actions[first].astype(np.float64) - old)))


def takeover_reference(prev: Executing | None, start_ns: int, first: int) -> np.ndarray | None:
    """The executing chunk's command when the new chunk's row ``first − 1`` is due (the tick
    before its first future row), interpolated between its rows as a trajectory controller
    does: what the step clamp measures that row against (None without an executing chunk)."""
    if prev is None:
        return None
    at = (int(start_ns) + int(first) * prev.period_ns - prev.start_ns) / prev.period_ns - 1.0
    lo = math.floor(at)
    f = np.float32(at - lo)
    below, above = prev.rows_at(np.array([lo, lo + 1]))
    return (below + f * (above - below)).astype(np.float32)


def blend(
    mode: str,
    new: np.ndarray,
    prev: Executing | None,
    start_ns: int,
    first_future: int,
    *,
    ramp: str = "linear",
    decay: float = 0.01,
    period_ns: int | None = None,
) -> BlendResult:
    """Blend ``new`` [H, D] (row i at start + (i+1)·period) with the executing chunk.

    Rows are paired by time: with ``period_ns`` different from the executing chunk's, that
    chunk is first resampled at the new rows' times (``Executing.on_grid``). For delta rows
    the blend works on the steps themselves, i.e. on the velocity the robot integrates.

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
    if period_ns is not None:
        prev = prev.on_grid(period_ns)
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


def inpaint_weights(frozen: int, overlap: int, horizon: int, schedule: str = "exp") -> np.ndarray:
    """Real-time chunking's prefix mask: 1 for the first ``frozen`` rows, 0 from ``overlap``
    on, in between c = (overlap−i)/(overlap−frozen+1) (``linear``), c·(e^c − 1)/(e − 1)
    (``exp``) or 0 (``hard``)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"execution.inpaint_schedule={schedule!r}; choose one of "
                         f"{', '.join(SCHEDULES)}")
    w = np.zeros(horizon, np.float32)
    overlap = int(min(max(overlap, 0), horizon))
    frozen = int(min(max(frozen, 0), overlap))
    w[:frozen] = 1.0
    if schedule == "hard":
        return w
    i = np.arange(frozen, overlap, dtype=np.float64)
    c = (overlap - i) / (overlap - frozen + 1)
    w[frozen:overlap] = c if schedule == "linear" else c * np.expm1(c) / math.expm1(1.0)
    return w


def inpaint_guidance(
    prev: Executing | None, start_ns: int, ready_estimate_ns: int, horizon: int,
    *, period_ns: int | None = None, schedule: str = "exp", method: str = "pull",
    beta: float = DEFAULT_BETA,
) -> InpaintGuidance | None:
    """Guidance for a chunk that will run from ``start_ns`` and be ready at about
    ``ready_estimate_ns``: the rows due by then and the first one it will execute
    (d = floor((ready − start)/period) + 1) are frozen to the executing chunk's (resampled at
    ``period_ns`` if that differs), the rest of its overlap follows ``schedule``; None
    without an overlap."""
    if prev is None:
        return None
    if period_ns is not None:
        prev = prev.on_grid(period_ns)
    offset, rows = prev.overlap(start_ns, horizon)
    if rows <= 0:
        return None
    frozen = max(int(ready_estimate_ns) - int(start_ns), 0) // prev.period_ns + 1
    prefix = np.zeros((horizon, prev.actions.shape[1]), np.float32)
    prefix[:rows] = prev.actions[offset : offset + rows]
    weights = inpaint_weights(frozen, rows, horizon, schedule)
    return InpaintGuidance(prefix, weights, int(min(frozen, rows)), rows, method, float(beta))


class LatencyTracker:
    """Inference latency from monotonic-clock samples: a window of the last ``window``
    samples, estimated by a high percentile (p95, as LeRobot's real-time chunking does) and
    clamped to [0, cap] (the chunk's duration), so one outlier cannot silence triggers."""

    def __init__(self, window: int = 20, quantile: float = 0.95) -> None:
        self.window, self.quantile = int(window), float(quantile)
        self.samples: list[float] = []
        self.dropped = 0

    def add(self, seconds: float) -> bool:
        """Record one sample; a negative or non-finite one is dropped (returns False)."""
        s = float(seconds)
        if not math.isfinite(s) or s < 0:
            self.dropped += 1
            return False
        self.samples.append(s)
        del self.samples[: -self.window]
        return True

    def reset(self) -> None:
        self.samples.clear()

    def estimate(self, cap_s: float) -> float:
        """The p95 of the window (0 without samples), clamped to [0, cap_s]."""
        if not self.samples:
            return 0.0
        value = float(np.quantile(np.asarray(self.samples), self.quantile))
        return float(min(max(value, 0.0), max(cap_s, 0.0)))

    def maximum(self) -> float:
        return max(self.samples, default=0.0)
