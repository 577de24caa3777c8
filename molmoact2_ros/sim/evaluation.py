"""What an evaluation runs and reports, shared by ``molmoact2 libero`` and the ROS sim node:
the episode plan from task and init choices, and the summary lines printed at the end."""

from __future__ import annotations

from pathlib import Path

from ..errors import MolmoActError


def parse_tasks(text: str | None, n_tasks: int, suite: str) -> list[int]:
    """``0,3`` or ``0-4`` (or all when empty), each checked against the suite."""
    if not text:
        return list(range(n_tasks))
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                out.extend(range(a, b + 1))
            elif part:
                out.append(int(part))
        except ValueError:
            raise MolmoActError(f"--tasks {text!r}: write task numbers like 0,3 or 0-4") from None
    bad = [t for t in out if not 0 <= t < n_tasks]
    if bad:
        raise MolmoActError(f"--tasks: {suite} has tasks 0..{n_tasks - 1}; {bad} do not exist")
    return list(dict.fromkeys(out))


def plan(suite: str, tasks: list[int], episodes: int, first_init: int, infos) -> list:
    """Episodes task by task (the env of a task is built once), init states in order."""
    from .runner import EpisodeSpec

    specs = []
    for t in tasks:
        n = infos[t].num_inits
        if first_init + episodes > n:
            raise MolmoActError(
                f"{suite} task {t} has init states 0..{n - 1}; --first-init {first_init} with "
                f"--episodes {episodes} asks for up to init {first_init + episodes - 1}")
        specs += [EpisodeSpec(suite, t, first_init + e) for e in range(episodes)]
    return specs


def summary_lines(summary: dict, records: list[dict]) -> list[str]:
    """The lines printed after a run: per suite success with its interval beside the published
    rate, the totals, and the refused instructions."""
    lines = []
    for suite, s in summary["suites"].items():
        lo, hi = s["ci95"]
        pub = s["published_rate"]
        lines.append(f"{suite}: {s['successes']}/{s['episodes']} success "
                     f"{100 * s['success_rate']:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}%)"
                     + (f"; published (LeRobot fine-tune) {100 * pub:.1f}%" if pub is not None
                        else ""))
    lines.append(f"published average {summary['published']['lerobot_average']}% (original "
                 f"{summary['published']['original_average']}%); steps "
                 f"{summary['steps']['total']}, chunks {summary['chunks']}, drops "
                 f"{summary['drops'] or 0}, clipped steps {summary['clipped_steps']}, "
                 f"{summary['sim_steps_per_s']} sim steps/s, loop overhead "
                 f"{summary['loop_overhead_pct_of_step']}% of a step")
    lines += [f"refused: {r['key']}: {r['reason']}" for r in records
              if r.get("status") == "refused"]
    lines += [f"not promptable (not run, not counted): {n['suite']} task {n['task_id']} "
              f"{n['instruction']!r}: {n['reason']}" for n in summary.get("not_promptable", [])]
    return lines


def finish_run(ledger, specs, run: dict, out: Path, not_promptable=()) -> list[dict]:
    """After a run (in-process or the ROS sim node): summarise this run's episodes from the
    ledger, write the summary files, print the closing lines; returns the run's records.
    ``not_promptable``: tasks left out because their instruction does not fit the prompt,
    listed apart from the success rate."""
    from .summary import summarize, write

    keys = {s.key for s in specs}
    records = [r for r in ledger.records if r["key"] in keys]
    summary = summarize(records, run)
    if not_promptable:
        summary["not_promptable"] = [n.to_json() for n in not_promptable]
    files = write(out, summary)
    print("\n".join(summary_lines(summary, records)))
    print(f"results: {', '.join(str(f) for f in [ledger.path, *files])}")
    return records
