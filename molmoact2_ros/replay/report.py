"""Replay and compare reports: ``summary.json`` and PNG plots that show where a run diverges
from its golden. Plots need matplotlib (``[plot]`` extra).

Plots: ``actions.png`` (run and golden per dimension, row i of a chunk at its stamp +
(i+1)·period), ``residuals.png`` (run − golden per dimension with the tolerance band),
``error_per_chunk.png`` (1 − cosine and the within fraction per chunk beside their limits,
max-abs error), ``continuity.png`` (the jump at each chunk switch, run and golden),
``latency.png`` (a table of the median, p95 and max per component, in pipeline order) and,
for ``compare``,
``error_distribution.png`` (per dimension, in the action's own units).
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..util.outputs import write_file, writing

#: the order the stages run in, for the latency panels
PIPELINE_ORDER = ("preprocess", "vision", "ipc", "embed", "llm_split0", "llm_split1",
                  "llm_split2", "llm_split3", "action_context", "action_step", "postprocess",
                  "total")


def machine() -> str:
    """This machine, as titles and summaries name it."""
    return f"{platform.node()} ({platform.machine()})"


@dataclass
class ReportData:
    """What a report draws: two sets of chunks by stamp and how they were compared."""

    run: dict[int, np.ndarray]
    golden: dict[int, np.ndarray] | None
    names: list[str]
    period_s: float
    summary: Any = None  # chunk_match.MatchSummary
    run_label: str = "run"
    golden_label: str = "golden"
    #: what the axes call the two sides: replay's run and golden, compare's A and B
    short_labels: tuple[str, str] = ("run", "golden")
    title: str = ""  # backend and machine
    latency: list[dict[str, float]] = field(default_factory=list)


def chunk_times(stamp_ns: int, t0_ns: int, rows: int, period_s: float) -> np.ndarray:
    """Seconds since ``t0`` when each row is due: row i at the stamp + (i+1)·period."""
    return (stamp_ns - t0_ns) / 1e9 + period_s * (np.arange(rows) + 1)


def continuity(chunks: dict[int, np.ndarray], period_s: float, scale=None) -> dict[int, float]:
    """The jump at each chunk switch: max over dimensions of |first row − the previous chunk's
    row due at the same time| (its last row once it ran out), normalised when ``scale``."""
    out: dict[int, float] = {}
    stamps = sorted(chunks)
    period_ns = period_s * 1e9
    for prev, cur in zip(stamps, stamps[1:]):
        a, b = chunks[prev], chunks[cur]
        if scale is not None:
            a, b = scale.normalise(a), scale.normalise(b)
        j = int(round((cur - prev) / period_ns))
        j = min(max(j, 0), a.shape[0] - 1)
        out[cur] = float(np.max(np.abs(np.asarray(b[0], np.float64) - a[j])))
    return out


def continuity_rows(data: ReportData) -> list[dict[str, Any]]:
    scale = getattr(data.summary, "scale", None)
    run = continuity(data.run, data.period_s, scale)
    gold = continuity(data.golden, data.period_s, scale) if data.golden else {}
    return [{"stamp_ns": s, "run_jump": run[s], "golden_jump": gold.get(s)} for s in sorted(run)]


def error_distribution(a: dict[int, np.ndarray], b: dict[int, np.ndarray],
                       names: list[str]) -> dict[str, dict[str, float]]:
    """Per dimension, a − b over every matched row, in the action's own units."""
    stamps = [s for s in sorted(a) if s in b and a[s].shape == b[s].shape]
    if not stamps:
        return {}
    diff = np.concatenate([np.asarray(a[s], np.float64) - b[s] for s in stamps])
    out = {}
    for d, name in enumerate(names[: diff.shape[1]]):
        col = diff[:, d]
        absd = np.abs(col)
        out[name] = {"mean": float(col.mean()), "std": float(col.std()),
                     "p50_abs": float(np.percentile(absd, 50)),
                     "p95_abs": float(np.percentile(absd, 95)),
                     "p99_abs": float(np.percentile(absd, 99)), "max_abs": float(absd.max()),
                     "n": int(col.size)}
    return out


def summary_data(result, settings, summary, differences=(), *, golden=None,
                 noise_problem: str = "") -> dict[str, Any]:
    """Everything ``summary.json`` of a replay holds: settings, counts, drops, match verdict,
    latency, the golden's provenance and the run's."""
    from .. import __version__

    latency: dict[str, list[float]] = {}
    for p in result.published:
        for key, value in p.chunk.latency_ms.items():
            latency.setdefault(key, []).append(float(value))
    return {
        "settings": {k: v for k, v in settings.values.items()
                     if not k.startswith(("bundle.", "topics."))},
        "run": {"backend": settings["backend"], "machine": machine(),
                "package_version": __version__, "numpy_version": np.__version__},
        "golden": golden.provenance if golden is not None else None,
        "noise_stream": noise_problem or ("same as the golden's" if golden is not None
                                          and golden.settings.get("noise_fingerprint")
                                          else "not recorded"),
        "messages": result.messages, "synchronised": result.synced,
        "chunks": len(result.published), "interrupted": result.interrupted,
        "drops": {k: {"count": v, "first": result.reasons.get(k, "")}
                  for k, v in result.drops.items()},
        "differences_from_golden": list(differences),
        "match": summary.to_json() if summary is not None else None,
        "latency_ms": {k: {"median": float(np.median(v)), "p95": float(np.percentile(v, 95)),
                           "max": float(np.max(v))} for k, v in latency.items()},
    }


def state_tokens(states, settings) -> dict[str, Any] | None:
    """The run's state per dimension against the training range: raw values (after the
    state.* conventions), their tokens, and how many observations fell outside [low, high]
    (their token is pinned at 0 or the last bin). A robot standing still should sit inside."""
    from ..bundle.bundle import Bundle
    from ..errors import MolmoActError
    from ..host.state import StateConvention, state_bins

    if not states:
        return None
    try:
        stats = Bundle.open(settings.bundle_path(), settings["variant"]).norm_stats().state
    except (MolmoActError, OSError):
        return None
    convention = StateConvention.from_settings(settings)
    values = np.stack([np.asarray(convention.apply(s, stats), np.float32) for s in states])
    tokens = np.stack([state_bins(v, stats) for v in values])
    dims = []
    for i, name in enumerate(stats.names):
        outside = int(np.sum((values[:, i] < stats.q01[i]) | (values[:, i] > stats.q99[i])))
        dims.append({"name": name, "normalised": bool(stats.mask[i]),
                     "training": [float(stats.q01[i]), float(stats.q99[i])],
                     "raw": [float(values[:, i].min()), float(values[:, i].max())],
                     "tokens": [int(tokens[:, i].min()), int(tokens[:, i].max())],
                     "outside_training_range": outside if stats.mask[i] else 0})
    return {"observations": len(states), "dimensions": dims,
            "outside": [d["name"] for d in dims if d["outside_training_range"]]}


def report_from_replay(folder: Path, result, settings, summary, *, golden=None,
                       differences=(), noise_problem: str = "") -> list[Path]:
    """The report of ``replay`` (``--golden`` adds the comparison panels)."""
    data = ReportData(
        run={p.chunk.observation_stamp_ns: p.actions for p in result.published},
        golden=dict(golden.chunks) if golden is not None else None,
        names=list(settings["action_names"]), period_s=float(settings["control_period_s"]),
        summary=summary, run_label=f"replay ({settings['backend']})",
        golden_label=(f"golden ({golden.settings.get('backend', '?')})"
                      if golden is not None else "golden"),
        title=f"{settings['variant']} on {settings['backend']}, {machine()}",
        latency=[dict(p.chunk.latency_ms) for p in result.published])
    extra = summary_data(result, settings, summary, differences, golden=golden,
                         noise_problem=noise_problem)
    extra["state_tokens"] = state_tokens(getattr(result, "states", []), settings)
    return write_report(folder, data, extra)


def write_report(folder: Path, data: ReportData, extra: dict[str, Any]) -> list[Path]:
    """``summary.json`` (``extra`` plus per-chunk continuity) and the plots; returns the
    files written (PNGs only with matplotlib installed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / "summary.json"]
    extra = dict(extra)
    extra["continuity"] = continuity_rows(data)
    write_file(files[0], json.dumps(extra, indent=2, sort_keys=True, default=_json) + "\n",
               what="--report")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plots: pip install -e '.[plot]' in the source checkout (or pip install "
              "matplotlib)")
        return files
    if data.run:
        files.append(_plot_actions(plt, folder, data))
    if data.golden and data.summary is not None and data.summary.chunks:
        files.append(_plot_residuals(plt, folder, data))
        files.append(_plot_errors(plt, folder, data))
    if len(data.run) > 1:
        files.append(_plot_continuity(plt, folder, data, extra["continuity"]))
    if data.latency:
        files.append(_plot_latency(plt, folder, data))
    if "error_distribution" in extra and data.golden:
        files.append(_plot_distribution(plt, folder, data))
    return files


def _json(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _t0(data: ReportData) -> int:
    stamps = list(data.run) + (list(data.golden) if data.golden else [])
    return min(stamps)


def _plot_actions(plt, folder: Path, data: ReportData) -> Path:
    names, t0 = data.names, _t0(data)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.7 * len(names)), sharex=True,
                             squeeze=False)
    axes = axes[:, 0]
    for k, stamp in enumerate(sorted(data.run)):
        got = data.run[stamp]
        t = chunk_times(stamp, t0, got.shape[0], data.period_s)
        want = data.golden.get(stamp) if data.golden else None
        for d, ax in enumerate(axes):
            if want is not None:
                ax.plot(t, want[:, d], color="0.55", lw=3.0,
                        label=data.golden_label if k == 0 else None)
            ax.plot(t, got[:, d], color="C0", lw=1.2, marker=".", ms=3,
                    label=data.run_label if k == 0 else None)
    for d, ax in enumerate(axes):
        ax.set_ylabel(f"{names[d]}\n[action units]", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title(f"actions per dimension, each chunk from its observation "
                      f"(row i at stamp + (i+1)·{data.period_s:g} s)\n{data.title}", fontsize=9)
    axes[-1].set_xlabel("time since the first observation [s]")
    return _save(plt, fig, folder / "actions.png")


def _plot_residuals(plt, folder: Path, data: ReportData) -> Path:
    """run − golden per dimension (normalised units when the scale is known), the band
    ±(atol + rtol·|golden|), failing chunks in red."""
    summary = data.summary
    scale, tol = summary.scale, summary.tolerance
    verdict = {c.stamp_ns: c for c in summary.chunks}
    names, t0 = data.names, _t0(data)
    units = "normalised" if scale is not None else "action units"
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.7 * len(names)), sharex=True,
                             squeeze=False)
    axes = axes[:, 0]
    widest = np.zeros(len(names))  # per dimension: the band's and the residual's extent
    largest = np.zeros(len(names))
    for stamp in sorted(verdict):
        got, want = data.run[stamp], data.golden[stamp]
        if got.shape != want.shape:
            continue
        if scale is not None:
            got, want = scale.normalise(got), scale.normalise(want)
        t = chunk_times(stamp, t0, got.shape[0], data.period_s)
        atol = tol.atol_for(want.shape)
        band = atol + tol.rtol * np.abs(want)
        res = got - want
        widest = np.maximum(widest, band.max(axis=0))
        largest = np.maximum(largest, np.abs(np.nan_to_num(res, posinf=1e6, neginf=-1e6))
                             .max(axis=0))
        color = "C2" if verdict[stamp].passed else "C3"
        for d, ax in enumerate(axes):
            ax.fill_between(t, -band[:, d], band[:, d], color="0.85", lw=0)
            ax.plot(t, res[:, d], color=color, lw=1.0, marker=".", ms=3)
            outside = np.abs(res[:, d]) > band[:, d]
            if outside.any():
                ax.plot(t[outside], res[outside, d], "x", color="C3", ms=5)
    first, second = data.short_labels
    scaled = []
    for d, ax in enumerate(axes):
        ax.axhline(0.0, color="0.4", lw=0.6)
        if residual_scale(widest[d], largest[d]) == "symlog":
            # linear within the band, logarithmic beyond: the band and the error both show
            ax.set_yscale("symlog", linthresh=float(widest[d]))
            ax.set_ylim(-3.0 * largest[d], 3.0 * largest[d])
            scaled.append(names[d])
        ax.set_ylabel(f"{names[d]}\n{first} − {second}", fontsize=8)
        ax.grid(alpha=0.3)
    failed = sum(not c.passed for c in summary.chunks)
    scale_note = (f"; symlog (linear within the band) for {', '.join(scaled)}" if scaled
                  else "")
    axes[0].set_title(
        f"residual {first} − {second} per dimension [{units}]; grey: tolerance band "
        f"±(atol + {tol.rtol:g}·|{second}|){scale_note}\ngreen: chunk passed, red: failed, "
        f"x: outside the band ({failed} of {len(summary.chunks)} chunks failed)\n"
        + (f"{first}: {data.run_label}; {second}: {data.golden_label}\n"
           if (data.run_label, data.golden_label) != data.short_labels else "")
        + data.title, fontsize=8)
    axes[-1].set_xlabel("time since the first observation [s] (row i at stamp + (i+1)·period)")
    return _save(plt, fig, folder / "residuals.png")


def _plot_errors(plt, folder: Path, data: ReportData) -> Path:
    summary = data.summary
    chunks = summary.chunks
    t0 = _t0(data)
    t = [(c.stamp_ns - t0) / 1e9 for c in chunks]
    colors = ["C2" if c.passed else "C3" for c in chunks]
    tol = summary.tolerance
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 7), sharex=True)
    ax1.scatter(t, [max(1.0 - c.cosine, 1e-12) if np.isfinite(c.cosine) else 2.0
                    for c in chunks], c=colors, s=18)
    ax1.axhline(1.0 - tol.min_cosine, color="C3", ls="--", lw=1,
                label=f"limit (cosine {tol.min_cosine:g})")
    ax1.set_yscale("log")
    ax1.set_ylabel("1 − cosine")
    ax1.legend(fontsize=8)
    ax1.set_title(f"per chunk: cosine and within fraction against their limits (green pass, "
                  f"red fail; a chunk needs both)\n{data.title}", fontsize=9)
    ax2.scatter(t, [c.within_tol for c in chunks], c=colors, s=18)
    ax2.plot(t, [c.within_tol for c in chunks], color="0.6", lw=0.8)
    ax2.axhline(tol.min_within, color="C3", ls="--", lw=1,
                label=f"limit ({tol.min_within:.0%} within atol + rtol·|golden|)")
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_ylabel("fraction within")
    ax2.legend(fontsize=8)
    floor = 1e-9  # exact matches are drawn on the floor of the log axis
    errors = [min(max(c.max_abs, floor), 1e6) for c in chunks]
    ax3.scatter(t, errors, c=colors, s=18)
    ax3.plot(t, errors, color="0.6", lw=0.8)
    ax3.set_yscale("log")
    ax3.set_ylim(floor / 2, max(max(errors), 1.0) * 2)
    ax3.set_ylabel("max-abs error" + (" [normalised]" if summary.scale is not None else ""))
    ax3.set_xlabel("observation time since the first observation [s]")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
    return _save(plt, fig, folder / "error_per_chunk.png")


def _plot_continuity(plt, folder: Path, data: ReportData, rows) -> Path:
    t0 = _t0(data)
    fig, ax = plt.subplots(1, 1, figsize=(10, 3.2))
    t = [(r["stamp_ns"] - t0) / 1e9 for r in rows]
    ax.plot(t, [r["run_jump"] for r in rows], "o-", color="C0", label=data.run_label)
    if any(r["golden_jump"] is not None for r in rows):
        ax.plot(t, [np.nan if r["golden_jump"] is None else r["golden_jump"] for r in rows],
                "s--", color="0.45", label=data.golden_label)
    units = "normalised" if getattr(data.summary, "scale", None) is not None else "action units"
    ax.set_ylabel(f"jump at the switch\n[{units}]", fontsize=8)
    ax.set_xlabel("observation time of the new chunk [s]")
    ax.set_title("continuity: max |first row − previous chunk's row due then| per switch; did "
                 f"the run switch as smoothly as the golden?\n{data.title}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(plt, fig, folder / "continuity.png")


def latency_table(samples: list[dict[str, float]]) -> list[tuple[str, float, float, float]]:
    """(component, median, p95, max) in ms over the chunks, in pipeline order."""
    present = {k for sample in samples for k in sample}
    keys = [k for k in PIPELINE_ORDER if k in present] + sorted(present - set(PIPELINE_ORDER))
    rows = []
    for key in keys:
        values = np.asarray([s[key] for s in samples if key in s], np.float64)
        rows.append((key, float(np.median(values)), float(np.percentile(values, 95)),
                     float(values.max())))
    return rows


def _plot_latency(plt, folder: Path, data: ReportData) -> Path:
    """A table, not histograms: a few chunks give no distribution, and medians compare."""
    rows = latency_table(data.latency)
    fig, ax = plt.subplots(1, 1, figsize=(7, 0.9 + 0.28 * (len(rows) + 1)))
    ax.axis("off")
    cells = [[key, f"{median:.2f}", f"{p95:.2f}", f"{top:.2f}"]
             for key, median, p95, top in rows]
    table = ax.table(cellText=cells, colLabels=["component", "median ms", "p95 ms", "max ms"],
                     loc="center", cellLoc="right", colLoc="right")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    ax.set_title(f"latency per component over {len(data.latency)} chunks, in pipeline order"
                 f"\n{data.title}", fontsize=9)
    return _save(plt, fig, folder / "latency.png")


def residual_scale(band: float, error: float) -> str:
    """``symlog`` when the largest residual is more than ten times the band (the band would
    be a hairline at the error's scale), else ``linear``."""
    return "symlog" if band > 0 and error > 10.0 * band else "linear"


def _plot_distribution(plt, folder: Path, data: ReportData) -> Path:
    names = data.names
    stamps = [s for s in sorted(data.run) if s in data.golden]
    diff = np.concatenate([np.asarray(data.run[s], np.float64) - data.golden[s]
                           for s in stamps])
    fig, axes = plt.subplots(1, len(names), figsize=(2.2 * len(names), 2.8), squeeze=False)
    for d, ax in enumerate(axes[0]):
        ax.hist(diff[:, d], bins=30, color="C0")
        ax.set_title(f"{names[d]}: max |Δ| {np.abs(diff[:, d]).max():.3g}", fontsize=8)
        ax.set_xlabel(f"{data.short_labels[0]} − {data.short_labels[1]}\n[action units]",
                      fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("rows")
    fig.suptitle(f"error distribution per dimension, in the action's own units — {data.title}",
                 fontsize=9)
    return _save(plt, fig, folder / "error_distribution.png")


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    with writing(path, what="--report") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)
    return path
