"""Replay report: ``summary.json`` and PNG plots (predicted vs golden actions over time, error
per chunk, per-component latency histogram). Plots need matplotlib (``[plot]`` extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def summary_data(result, settings, summary, differences=()) -> dict[str, Any]:
    """Everything ``summary.json`` holds: settings, counts, drops, match verdict, latency."""
    latency: dict[str, list[float]] = {}
    for p in result.published:
        for key, value in p.chunk.latency_ms.items():
            latency.setdefault(key, []).append(float(value))
    return {
        "settings": {k: v for k, v in settings.values.items()
                     if not k.startswith(("bundle.", "topics."))},
        "messages": result.messages, "synchronised": result.synced,
        "chunks": len(result.published), "interrupted": result.interrupted,
        "drops": {k: {"count": v, "first": result.reasons.get(k, "")}
                  for k, v in result.drops.items()},
        "differences_from_golden": list(differences),
        "match": summary.to_json() if summary is not None else None,
        "latency_ms": {k: {"median": float(np.median(v)), "p95": float(np.percentile(v, 95)),
                           "max": float(np.max(v))} for k, v in latency.items()},
    }


def write_report(folder: Path, result, settings, summary, *, golden=None,
                 differences=()) -> list[Path]:
    """Write the report into ``folder``; returns the files written (PNGs only with
    matplotlib installed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / "summary.json"]
    files[0].write_text(json.dumps(summary_data(result, settings, summary, differences),
                                   indent=2, sort_keys=True) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plots: pip install 'molmoact2_ros[plot]' (matplotlib)")
        return files
    names = list(settings["action_names"])
    period_s = float(settings["control_period_s"])
    if result.published:
        files.append(_plot_actions(plt, folder, result.published, golden, names, period_s))
        files.append(_plot_latency(plt, folder, result.published))
    if summary is not None and summary.chunks:
        files.append(_plot_errors(plt, folder, summary, names))
    return files


def _plot_actions(plt, folder: Path, published, golden, names, period_s) -> Path:
    t0 = min(p.chunk.observation_stamp_ns for p in published)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.7 * len(names)), sharex=True)
    for k, p in enumerate(sorted(published, key=lambda p: p.chunk.observation_stamp_ns)):
        stamp = p.chunk.observation_stamp_ns
        t = (stamp - t0) / 1e9 + period_s * np.arange(p.actions.shape[0])
        want = golden.chunks.get(stamp) if golden is not None else None
        for d, ax in enumerate(axes):
            if want is not None:
                ax.plot(t, want[:, d], color="0.55", lw=3.0, label="golden" if k == 0 else None)
            ax.plot(t, p.actions[:, d], color="C0", lw=1.2, marker=".", ms=3,
                    label="replay" if k == 0 else None)
    for d, ax in enumerate(axes):
        ax.set_ylabel(names[d])
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title("actions per dimension: replay vs golden (each chunk from its observation)")
    axes[-1].set_xlabel("time since the first observation [s]")
    fig.tight_layout()
    path = folder / "actions.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_errors(plt, folder: Path, summary, names) -> Path:
    chunks = summary.chunks
    t0 = chunks[0].stamp_ns
    t = [(c.stamp_ns - t0) / 1e9 for c in chunks]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    colors = ["C2" if c.passed else "C3" for c in chunks]
    floor = 1e-9  # exact matches are drawn on the floor of the log axis
    errors = [min(max(c.max_abs, floor), 1e6) for c in chunks]
    ax1.scatter(t, errors, c=colors, s=18)
    ax1.plot(t, errors, color="0.6", lw=0.8)
    ax1.axhline(summary.tolerance.atol, color="0.4", ls=":", lw=1,
                label=f"atol {summary.tolerance.atol}")
    ax1.set_ylabel("max-abs error")
    ax1.set_yscale("log")
    ax1.set_ylim(floor / 2, max(max(errors), 1.0) * 2)
    ax1.legend(fontsize=8)
    ax1.set_title("error per chunk (green pass, red fail; exact matches at 1e-9)")
    ax2.scatter(t, [max(1.0 - c.cosine, 1e-12) if np.isfinite(c.cosine) else 2.0
                    for c in chunks], c=colors, s=18)
    ax2.axhline(1.0 - summary.tolerance.min_cosine, color="C3", ls="--", lw=1,
                label=f"limit (cosine {summary.tolerance.min_cosine})")
    ax2.set_yscale("log")
    ax2.set_ylabel("1 - cosine")
    ax2.set_xlabel("observation time since the first compared chunk [s]")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = folder / "error_per_chunk.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_latency(plt, folder: Path, published) -> Path:
    keys = [k for k in published[0].chunk.latency_ms if k != "total"] + ["total"]
    cols = 4
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 2.4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        values = [p.chunk.latency_ms.get(key, np.nan) for p in published]
        ax.hist(values, bins=min(20, max(5, len(values))), color="C1")
        ax.set_title(f"{key}: median {np.nanmedian(values):.2f} ms", fontsize=9)
        ax.set_xlabel("ms", fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle("latency per component")
    fig.tight_layout()
    path = folder / "latency.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
