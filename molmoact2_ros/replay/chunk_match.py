"""Chunks of a run matched with golden chunks by observation stamp: per-chunk metrics, the
summary (compared, passed, missing, extra, worst chunk and dimension) and its verdict.

ROS-free: ``molmoact2 replay --golden`` and the replay checker node share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """When a chunk matches: cosine >= ``min_cosine`` and at least ``min_within`` of its
    values within ``|a - b| <= atol + rtol * |b|``."""

    min_cosine: float
    atol: float
    rtol: float
    min_within: float


#: ONNX Runtime on both sides (float32 end to end)
FP32 = Tolerance(min_cosine=0.9999, atol=1e-3, rtol=1e-2, min_within=1.0)
#: a run on the HTP (fp16 I/O and contexts) against a float32 golden
FP16 = Tolerance(min_cosine=0.999, atol=2e-2, rtol=5e-2, min_within=0.95)


def default_tolerance(backend: str) -> Tolerance:
    return FP16 if backend == "htp" else FP32


@dataclass(frozen=True)
class ChunkMetrics:
    """One produced chunk against its golden chunk."""

    stamp_ns: int
    cosine: float
    max_abs: float
    within_tol: float
    worst_row: int
    worst_dim: int
    passed: bool


def chunk_metrics(stamp_ns: int, got: np.ndarray, want: np.ndarray,
                  tol: Tolerance) -> ChunkMetrics:
    """Cosine, max-abs error (and where), fraction within tolerance of one chunk."""
    a = np.asarray(got, np.float64)
    b = np.asarray(want, np.float64)
    if a.shape != b.shape or not np.all(np.isfinite(a)):
        return ChunkMetrics(stamp_ns, float("nan"), float("inf"), 0.0, -1, -1, False)
    diff = np.abs(a - b)
    row, dim = np.unravel_index(int(np.argmax(diff)), diff.shape)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cos = 1.0 if na == nb == 0.0 else (0.0 if na == 0.0 or nb == 0.0
                                       else float(np.vdot(a, b) / (na * nb)))
    within = float(np.mean(diff <= tol.atol + tol.rtol * np.abs(b)))
    passed = cos >= tol.min_cosine and within >= tol.min_within
    return ChunkMetrics(stamp_ns, cos, float(diff.max()), within, int(row), int(dim), passed)


@dataclass
class MatchSummary:
    """The verdict of a run against a golden."""

    compared: int
    passed: int
    missing: list[int]
    extra: list[int]
    golden_total: int
    min_produced: float
    tolerance: Tolerance
    chunks: list[ChunkMetrics] = field(default_factory=list)

    @property
    def worst(self) -> ChunkMetrics | None:
        return max(self.chunks, key=lambda c: (not c.passed, c.max_abs), default=None)

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
            "min_produced": self.min_produced, "tolerance": asdict(self.tolerance),
            "worst": asdict(worst) if worst else None,
            "chunks": [asdict(c) for c in self.chunks],
        }


def match_chunks(produced: Mapping[int, np.ndarray], golden: Mapping[int, np.ndarray],
                 tol: Tolerance, *, min_produced: float = 1.0) -> MatchSummary:
    """Compare every produced chunk with the golden chunk of the same observation stamp.

    A produced chunk without a golden one is ``extra`` (the run saw other observations);
    a golden chunk nobody produced is ``missing``. The run passes when every compared chunk
    matches, nothing is extra and at least ``min_produced`` of the golden chunks were produced
    (live ``ros2 bag play`` may skip observations; file replay should produce all).
    """
    chunks = [chunk_metrics(s, produced[s], golden[s], tol)
              for s in sorted(produced) if s in golden]
    return MatchSummary(
        compared=len(chunks), passed=sum(c.passed for c in chunks),
        missing=sorted(set(golden) - set(produced)), extra=sorted(set(produced) - set(golden)),
        golden_total=len(golden), min_produced=min_produced, tolerance=tol, chunks=chunks)


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
        lines.append(f"worst chunk: stamp {_stamp(worst.stamp_ns)} s, cosine {worst.cosine:.6f}, "
                     f"max-abs {worst.max_abs:.4g} at action {worst.worst_row} {name}, "
                     f"{worst.within_tol:.1%} within tolerance")
    if s.extra:
        lines.append(f"first extra chunk (no golden chunk at its stamp): {_stamp(s.extra[0])} s")
    if s.missing and s.produced_fraction < s.min_produced:
        lines.append(f"first missing chunk: stamp {_stamp(s.missing[0])} s")
    t = s.tolerance
    lines.append(f"{'PASS' if s.ok else 'FAIL'} (cosine >= {t.min_cosine}, >= {t.min_within:.0%} "
                 f"within {t.atol} + {t.rtol}*|golden|)")
    return "\n".join(lines)


class LiveCheck:
    """Chunks arriving from a live ``ros2 bag play`` run, checked against a golden: collects
    them by stamp and decides when the run is over (every golden stamp seen, no chunk for
    ``idle_timeout_s`` after the last one, or none at all within ``timeout_s``).

    The checker node is a thin rclpy adapter over this class; times are plain seconds.
    """

    def __init__(self, golden: Mapping[int, np.ndarray], tol: Tolerance, *,
                 min_produced: float, idle_timeout_s: float, timeout_s: float,
                 start_s: float) -> None:
        self.golden = dict(golden)
        self.tol = tol
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
        return match_chunks(self.produced, self.golden, self.tol, min_produced=self.min_produced)
