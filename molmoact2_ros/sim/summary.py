"""An evaluation's summary from its ledger: success per task and suite with a 95% Wilson
interval next to the published rates, steps, latency percentiles, chunks, drops, clips and
sim speed; written as ``summary.json``, ``summary.md`` and a success-by-task plot."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .policy_status import summarize_statuses
from .protocol import LEROBOT_COMMIT, RATES, published_rates

#: MolmoAct2-LIBERO's published success rates (%) of the LeRobot fine-tune per suite (the
#: rates of grid_sampler and lp_vtp_sd; fused reads the original's, ``protocol.RATES``)
PUBLISHED = RATES["lerobot_finetune"]["rates"]
PUBLISHED_AVERAGE = RATES["lerobot_finetune"]["average"]
ORIGINAL_AVERAGE = RATES["original"]["average"]
Z95 = 1.959963984540054
#: ``summary.json``'s ``format`` (which files a later run may rewrite is ``util/outputs``'
#: marker's to say)
SUMMARY_FORMAT = "molmoact2-libero-summary/1"
SYNTHETIC_NOTE = ("a random-weight test bundle: 0% success is expected; the run still proves "
                  "the loop (observation, chunk, rows, simulator), the timing and the videos, "
                  "not the model")


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a success rate (fractions; (0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _rate(records: list[dict]) -> dict[str, Any]:
    n = len(records)
    k = sum(1 for r in records if r.get("success"))
    lo, hi = wilson(k, n)
    return {"episodes": n, "successes": k, "success_rate": k / n if n else 0.0,
            "ci95": [round(lo, 4), round(hi, 4)]}


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    a = np.asarray(values, np.float64)
    return {f"p{q}": round(float(np.percentile(a, q)), 3) for q in (50, 90, 99)} | {
        "max": round(float(a.max()), 3), "mean": round(float(a.mean()), 3)}


def summarize(records: list[dict[str, Any]], run: dict[str, Any] | None = None) -> dict:
    """Plain-data summary of ledger records (any order; several suites allowed) against the
    published rates of the run's variant, with the run's protocol and deviations."""
    run = run or {}
    rates = published_rates(run.get("variant", "grid_sampler"))
    by_suite: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_suite[r["suite"]].append(r)
    suites = {}
    for suite, recs in sorted(by_suite.items()):
        tasks = {}
        by_task: dict[int, list[dict]] = defaultdict(list)
        for r in recs:
            by_task[int(r["task_id"])].append(r)
        for task_id, trs in sorted(by_task.items()):
            refused = [r["reason"] for r in trs if r.get("status") == "refused"]
            tasks[str(task_id)] = {
                "instruction": trs[0].get("instruction", ""),
                **_rate(trs),
                "mean_steps": round(float(np.mean([r["steps"] for r in trs])), 2),
                "refused": len(refused),
                **({"refused_reason": refused[0]} if refused else {}),
            }
        pub = rates["rates"].get(suite)
        suites[suite] = {**_rate(recs), "published_rate": pub / 100 if pub else None,
                         "tasks": tasks}
    done = [r for r in records if r.get("status") == "ok"]
    drops: Counter = Counter()
    for r in records:
        drops.update(r.get("drops", {}))
    timing = [r.get("timing", {}) for r in done]
    steps = sum(r["steps"] for r in done)
    loop_s = sum(r["steps"] / t["sim_steps_per_s"] for r, t in zip(done, timing)
                 if t.get("sim_steps_per_s"))
    env_ms = [t.get("env_step_ms", 0.0) for t in timing if t]
    over_ms = [t.get("overhead_ms", 0.0) for t in timing if t]
    wsteps = [max(r["steps"], 1) for r in done]
    mean_env = float(np.average(env_ms, weights=wsteps)) if env_ms else 0.0
    mean_over = float(np.average(over_ms, weights=wsteps)) if over_ms else 0.0
    return {
        "format": SUMMARY_FORMAT,
        "run": run,
        "protocol": {"name": run.get("protocol", "published"),
                     "reference": f"LeRobot lerobot-eval, huggingface/lerobot "
                                  f"{LEROBOT_COMMIT[:8]}",
                     "deviations": list(run.get("deviations", []))},
        "synthetic_bundle": bool(run.get("synthetic_bundle")),
        "total": _rate(records),
        "suites": suites,
        "published": {"model": rates["model"], "rates": rates["rates"],
                      "average": rates["average"], "source": rates["source"]},
        "steps": {"total": steps, "mean": round(steps / len(done), 2) if done else 0.0},
        "chunk_latency_sim_ms": _percentiles([x for r in done for x in r["chunk_latency_ms"]]),
        "inference_wall_ms": _percentiles([x for t in timing for x in t.get("inference_ms", [])]),
        "chunks": sum(r["chunks"] for r in done),
        "rows_executed": sum(r["rows_executed"] for r in done),
        "rows_skipped": sum(r["rows_skipped"] for r in done),
        "idle_steps": sum(r["idle_steps"] for r in done),
        # the largest jump of the executed command in any episode (older ledgers lack it)
        "largest_command_change": round(max((r.get("largest_command_change", 0.0)
                                             for r in done), default=0.0), 6),
        "drops": dict(sorted(drops.items())),
        "clipped_steps": sum(r["clipped_steps"] for r in done),
        "clipped_values": sum(r["clipped_values"] for r in done),
        "refused": sum(1 for r in records if r.get("status") == "refused"),
        "policy_diagnostics": summarize_statuses(records),
        "sim_steps_per_s": round(steps / loop_s, 3) if loop_s else 0.0,
        "env_step_ms": round(mean_env, 3),
        "loop_overhead_ms": round(mean_over, 3),
        "loop_overhead_pct_of_step": round(100 * mean_over / mean_env, 2) if mean_env else 0.0,
    }


def protocol_lines(summary: dict) -> list[str]:
    """Which protocol ran, every deviation from the published one, and the test-bundle note."""
    p = summary["protocol"]
    devs = p["deviations"]
    lines = [f"protocol: {p['name']} (the published evaluation: {p['reference']}); "
             + ("deviations: none" if not devs else f"{len(devs)} deviations: "
                + "; ".join(devs))]
    if summary.get("synthetic_bundle"):
        lines.append(f"bundle: {SYNTHETIC_NOTE}")
    return lines


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _status(summary: dict) -> str:
    d = summary.get("policy_diagnostics")
    if not d:
        return "not recorded"
    text = f"{d['worst']} ({d['statuses']} statuses, {d['stalls']} stalled)"
    return text if d["worst"] == "OK" else f"{text} in {d['episode']}: {d['message']}"


def markdown(summary: dict) -> str:
    """``summary.md``: the tables a person reads against the published rates."""
    run = summary.get("run", {})
    pub = summary["published"]
    lines = ["# LIBERO evaluation", ""]
    lines += protocol_lines(summary) + [""]
    if run:
        lines += ["Run: " + ", ".join(f"{k}={run[k]}" for k in sorted(run)
                                      if k != "deviations"), ""]
    lines += [f"| suite | episodes | success | 95% CI (Wilson) | published ({pub['model']}) |",
              "|---|---|---|---|---|"]
    for suite, s in summary["suites"].items():
        lo, hi = s["ci95"]
        lines.append(f"| {suite} | {s['episodes']} | {_pct(s['success_rate'])} | "
                     f"{_pct(lo)} - {_pct(hi)} | {_pct(s['published_rate'])} |")
    t = summary["total"]
    lines.append(f"| all | {t['episodes']} | {_pct(t['success_rate'])} | {_pct(t['ci95'][0])} - "
                 f"{_pct(t['ci95'][1])} | average {pub['average']}% |")
    lines += ["", f"Published rates: {pub['source']}."]
    lines += ["", "A published rate inside the interval: no evidence the deployment differs. "
              "Above it: the deployment loses success; look at the failing tasks' videos.", ""]
    lines += ["| suite | task | episodes | success | 95% CI | mean steps | instruction |",
              "|---|---|---|---|---|---|---|"]
    for suite, s in summary["suites"].items():
        for task_id, ts in s["tasks"].items():
            note = f" (refused: {ts['refused_reason']})" if ts.get("refused") else ""
            lines.append(f"| {suite} | {task_id} | {ts['episodes']} | {_pct(ts['success_rate'])} "
                         f"| {_pct(ts['ci95'][0])} - {_pct(ts['ci95'][1])} | {ts['mean_steps']} "
                         f"| {ts['instruction']}{note} |")
    skipped = summary.get("not_promptable", [])
    if skipped:
        lines += ["", "Not promptable (not run, not counted in the rates): the instruction does "
                  "not fit the contexts' prompt budget.", "",
                  "| suite | task | tokens | instruction |", "|---|---|---|---|"]
        lines += [f"| {n['suite']} | {n['task_id']} | {n['tokens']} | {n['instruction']} |"
                  for n in skipped]
    lat, inf = summary["chunk_latency_sim_ms"], summary["inference_wall_ms"]
    lines += ["", "| measure | value |", "|---|---|",
              f"| policy steps (mean per episode) | {summary['steps']['total']} "
              f"({summary['steps']['mean']}) |",
              f"| chunks / rows executed / rows skipped / zero-command steps | "
              f"{summary['chunks']} / {summary['rows_executed']} / {summary['rows_skipped']} / "
              f"{summary['idle_steps']} |",
              f"| chunk latency in sim time p50/p90/p99 ms | {lat.get('p50', '-')} / "
              f"{lat.get('p90', '-')} / {lat.get('p99', '-')} |",
              f"| inference wall time p50/p90/p99 ms | {inf.get('p50', '-')} / "
              f"{inf.get('p90', '-')} / {inf.get('p99', '-')} |",
              f"| largest step-to-step change of the pose command (action units) | "
              f"{summary.get('largest_command_change', '-')} |",
              f"| drops | {summary['drops'] or 'none'} |",
              f"| clipped steps (values) | {summary['clipped_steps']} "
              f"({summary['clipped_values']}) |",
              f"| refused instructions (episodes) | {summary['refused']} |",
              f"| policy status, worst over episodes | {_status(summary)} |",
              f"| sim steps/s | {summary['sim_steps_per_s']} |",
              f"| env.step ms / loop overhead ms (% of a step) | {summary['env_step_ms']} / "
              f"{summary['loop_overhead_ms']} ({summary['loop_overhead_pct_of_step']}%) |", ""]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> bool:
    """Success by task with Wilson intervals and the published suite rate; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels, rates, lows, highs, pubs = [], [], [], [], []
    for suite, s in summary["suites"].items():
        for task_id, ts in s["tasks"].items():
            labels.append(f"{suite.replace('libero_', '')}/{task_id}")
            rates.append(100 * ts["success_rate"])
            lows.append(100 * (ts["success_rate"] - ts["ci95"][0]))
            highs.append(100 * (ts["ci95"][1] - ts["success_rate"]))
            pubs.append(None if s["published_rate"] is None else 100 * s["published_rate"])
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(labels) + 2), 3.5))
    x = np.arange(len(labels))
    ax.bar(x, rates, color="#4c72b0", yerr=[lows, highs], capsize=3, label="success (95% CI)")
    for i, p in enumerate(pubs):
        if p is not None:
            ax.hlines(p, i - 0.4, i + 0.4, colors="#c44e52",
                      label="published suite rate" if i == 0 else None)
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("success %")
    ax.set_title("LIBERO success by task")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return True


SUMMARY_FILES = ("summary.json", "summary.md", "success_by_task.png")


def check_summary_files(folder: Path, option: str = "--out") -> None:
    """Before any work: each summary file in ``folder`` is absent or one this package wrote
    and nobody changed since (``util/outputs``); anything else is refused, naming it."""
    from ..util.outputs import check_file

    for name in SUMMARY_FILES:
        check_file(Path(folder) / name, force=True, what=option)


def _matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write(folder: Path, summary: dict) -> list[Path]:
    """``summary.json``, ``summary.md`` and ``success_by_task.png`` (when matplotlib is there),
    each written whole and recorded as this package's (``util/outputs``); a file of that name
    this package did not write, or one changed since, is refused, not replaced."""
    from ..util.outputs import write_file, writing

    folder = Path(folder)
    check_summary_files(folder, "summary")
    out = [write_file(folder / "summary.json", json.dumps(summary, indent=2, sort_keys=True)
                      + "\n", what="summary"),
           write_file(folder / "summary.md", markdown(summary), what="summary")]
    png = folder / "success_by_task.png"
    if _matplotlib():
        with writing(png, what="plot") as tmp:
            plot(summary, tmp)
        out.append(png)
    return out
