"""Chunks of a run matched with golden chunks by observation stamp: per-chunk metrics, the
summary (compared, passed, missing, extra, worst chunk and dimension) and its verdict.

ROS-free: ``molmoact2 replay --golden`` and the replay checker node share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ..bundle.comparison import Limits, measure

#: the limits of a chunk (the shared comparison's; kept under this name for the checker)
Tolerance = Limits

#: ONNX Runtime on both sides (float32 end to end), in normalised action units
FP32 = Limits(min_cosine=0.9999, atol=1e-3, rtol=0.0, min_within=1.0)
#: fp16 I/O (HTP) against a float32 golden, in normalised action units per dimension
#: (x, y, z, roll, pitch, yaw, gripper): twice the largest difference measured between the
#: fake-HTP fp16 run and ONNX Runtime on the tiny bundles with the same settings
#: (docs/host_glue.md §13, "Default tolerances"). Flow steps 9 against 10 leave at most 77 % of a
#: chunk's values within these, swapped cameras at most 37 %: both fail every chunk.
FP16_SPREAD = (0.00205, 0.00195, 0.00147, 0.00303, 0.00110, 0.00092, 0.00198)
FP16_MARGIN = 2.0
FP16 = Limits(min_cosine=0.999, atol=(0.0041, 0.0039, 0.0030, 0.0061, 0.0022, 0.0019, 0.0040),
              rtol=0.0, min_within=0.95)


def default_tolerance(backend: str) -> Limits:
    """The calibrated limits of a replay on ``backend`` against a float32 golden."""
    return FP16 if backend == "htp" else FP32


@dataclass(frozen=True)
class ActionScale:
    """``normalised = (action − offset) / scale`` per dimension: the bundle's q01/q99 map
    (identity on dimensions it does not normalise), so limits read in normalised units."""

    offset: tuple[float, ...]
    scale: tuple[float, ...]

    def normalise(self, actions: np.ndarray) -> np.ndarray:
        a = np.asarray(actions, np.float64)
        return (a - np.asarray(self.offset)) / np.asarray(self.scale)

    def to_units(self, normalised: np.ndarray) -> np.ndarray:
        """A per-dimension width in normalised units as action units."""
        return np.asarray(normalised, np.float64) * np.asarray(self.scale)


@dataclass(frozen=True)
class ChunkMetrics:
    """One produced chunk against its golden chunk (metrics in normalised units when the
    action scale is known); ``failed`` names the failed criteria."""

    stamp_ns: int
    cosine: float
    max_abs: float
    within_tol: float
    worst_row: int
    worst_dim: int
    passed: bool
    failed: str = ""


def chunk_metrics(stamp_ns: int, got: np.ndarray, want: np.ndarray, tol: Limits,
                  scale: ActionScale | None = None) -> ChunkMetrics:
    """Cosine, max-abs error (and where), fraction within tolerance of one chunk."""
    a = np.asarray(got, np.float64)
    b = np.asarray(want, np.float64)
    if a.shape != b.shape:
        return ChunkMetrics(stamp_ns, float("nan"), float("inf"), 0.0, -1, -1, False,
                            f"shape {list(a.shape)} vs golden {list(b.shape)}")
    if scale is not None and b.ndim == 2 and b.shape[1] == len(scale.scale):
        a, b = scale.normalise(a), scale.normalise(b)
    try:
        m = measure(a, b, tol, exact=False)
    except ValueError as exc:  # per-dimension limits of another action width
        return ChunkMetrics(stamp_ns, float("nan"), float("inf"), 0.0, -1, -1, False, str(exc))
    row, dim = m.worst if len(m.worst) == 2 else (-1, -1)
    return ChunkMetrics(stamp_ns, m.cosine, m.max_abs, m.within, row, dim, m.passed, m.reason)


@dataclass
class MatchSummary:
    """The verdict of a run against a golden."""

    compared: int
    passed: int
    missing: list[int]
    extra: list[int]
    golden_total: int
    min_produced: float
    tolerance: Limits
    chunks: list[ChunkMetrics] = field(default_factory=list)
    scale: ActionScale | None = None

    @property
    def worst(self) -> ChunkMetrics | None:
        return max(self.chunks, key=lambda c: (not c.passed, c.max_abs), default=None)

    def failed_criteria(self) -> dict[str, int]:
        """How many chunks failed each criterion (cosine, within, shape, NaN)."""
        out: dict[str, int] = {}
        for c in self.chunks:
            for text in filter(None, c.failed.split("; ")):
                key = text.split(" ", 1)[0]
                out[key] = out.get(key, 0) + 1
        return out

    @property
    def produced_fraction(self) -> float:
        return self.compared / self.golden_total if self.golden_total else 0.0

    @property
    def ok(self) -> bool:
        return (self.compared > 0 and self.passed == self.compared and not self.extra
                and self.produced_fraction >= self.min_produced)

    def to_json(self) -> dict:
        worst = self.worst
        return {
            "ok": self.ok, "compared": self.compared, "passed": self.passed,
            "missing": len(self.missing), "extra": len(self.extra),
            "missing_stamps_ns": self.missing, "extra_stamps_ns": self.extra,
            "golden_chunks": self.golden_total, "produced_fraction": self.produced_fraction,
            "min_produced": self.min_produced, "tolerance": self.tolerance.to_json(),
            "units": "normalised" if self.scale is not None else "action",
            "action_scale": asdict(self.scale) if self.scale is not None else None,
            "failed_criteria": self.failed_criteria(),
            "worst": asdict(worst) if worst else None,
            "chunks": [asdict(c) for c in self.chunks],
        }


def check_atol(tol: Limits, dims: int) -> None:
    """A per-dimension ``--atol`` must give one value per action dimension."""
    from ..errors import MolmoActError

    if isinstance(tol.atol, tuple) and len(tol.atol) != dims:
        raise MolmoActError(f"--atol gives {len(tol.atol)} values but the actions have {dims} "
                            f"dimensions; give one value, or {dims} separated by commas")


def match_chunks(produced: Mapping[int, np.ndarray], golden: Mapping[int, np.ndarray],
                 tol: Limits, *, min_produced: float = 1.0,
                 scale: ActionScale | None = None) -> MatchSummary:
    """Compare every produced chunk with the golden chunk of the same observation stamp.

    A produced chunk without a golden one is ``extra`` (the run saw other observations);
    a golden chunk nobody produced is ``missing``. The run passes when every compared chunk
    matches, nothing is extra and at least ``min_produced`` of the golden chunks were produced
    (live ``ros2 bag play`` may skip observations; file replay should produce all).
    """
    chunks = [chunk_metrics(s, produced[s], golden[s], tol, scale)
              for s in sorted(produced) if s in golden]
    return MatchSummary(
        compared=len(chunks), passed=sum(c.passed for c in chunks),
        missing=sorted(set(golden) - set(produced)), extra=sorted(set(produced) - set(golden)),
        golden_total=len(golden), min_produced=min_produced, tolerance=tol, chunks=chunks,
        scale=scale)


def _stamp(ns: int) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}"


def format_summary(summary: MatchSummary, action_names: Sequence[str] = ()) -> str:
    """The lines replay and the checker node print."""
    s = summary
    lines = [f"compared {s.compared} of {s.golden_total} golden chunks: {s.passed} passed, "
             f"{s.compared - s.passed} failed, {len(s.missing)} missing, {len(s.extra)} extra "
             f"(produced {s.produced_fraction:.0%}, need {s.min_produced:.0%})"]
    worst = s.worst
    if worst is not None:
        name = (action_names[worst.worst_dim] if 0 <= worst.worst_dim < len(action_names)
                else f"dim {worst.worst_dim}")
        units = " normalised" if s.scale is not None else ""
        lines.append(f"worst chunk: stamp {_stamp(worst.stamp_ns)} s, cosine {worst.cosine:.6f}, "
                     f"max-abs {worst.max_abs:.4g}{units} at action {worst.worst_row} {name}, "
                     f"{worst.within_tol:.1%} within tolerance")
        if worst.failed:
            lines.append(f"failed criterion of the worst chunk: {worst.failed}")
    counts = s.failed_criteria()
    if counts:
        lines.append("chunks failing each criterion: " + ", ".join(
            f"{k} {v} of {s.compared}" for k, v in counts.items()))
    if s.extra:
        lines.append(f"first extra chunk (no golden chunk at its stamp): {_stamp(s.extra[0])} s")
    if s.missing and s.produced_fraction < s.min_produced:
        lines.append(f"first missing chunk: stamp {_stamp(s.missing[0])} s")
    units = "normalised units" if s.scale is not None else "action units"
    lines.append(f"{'PASS' if s.ok else 'FAIL'} ({s.tolerance.describe()}, {units})")
    return "\n".join(lines)


class LiveCheck:
    """Chunks arriving from a live ``ros2 bag play`` run, checked against a golden: collects
    them by stamp and decides when the run is over (every golden stamp seen, no chunk for
    ``idle_timeout_s`` after the last one, or none at all within ``timeout_s``).

    The checker node is a thin rclpy adapter over this class; times are plain seconds.
    """

    def __init__(self, golden: Mapping[int, np.ndarray], tol: Limits, *,
                 min_produced: float, idle_timeout_s: float, timeout_s: float,
                 start_s: float, scale: ActionScale | None = None) -> None:
        self.golden = dict(golden)
        self.tol = tol
        self.scale = scale
        self.min_produced = min_produced
        self.idle_timeout_s = idle_timeout_s
        self.timeout_s = timeout_s
        self.start_s = start_s
        self.last_s: float | None = None
        self.produced: dict[int, np.ndarray] = {}
        self.fields: dict = {}

    def add(self, stamp_ns: int, actions: np.ndarray, now_s: float, **fields) -> None:
        """One received chunk; ``fields`` (variant, instruction, flow_steps) of the first one
        are kept to name settings that differ from the golden's."""
        self.produced[int(stamp_ns)] = np.asarray(actions, np.float32)
        self.last_s = now_s
        if not self.fields:
            self.fields = dict(fields)

    def finished(self, now_s: float) -> str:
        """Why the run is over, or '' while it is not."""
        if self.golden and set(self.golden) <= set(self.produced):
            return "every golden chunk was produced"
        if self.last_s is not None and now_s - self.last_s >= self.idle_timeout_s:
            return f"no chunk for {self.idle_timeout_s:g} s"
        if self.last_s is None and now_s - self.start_s >= self.timeout_s:
            return f"no chunk within {self.timeout_s:g} s"
        return ""

    def summary(self) -> MatchSummary:
        return match_chunks(self.produced, self.golden, self.tol, min_produced=self.min_produced,
                            scale=self.scale)
