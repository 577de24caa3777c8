"""What an evaluation runs and reports, shared by ``molmoact2 libero`` and the ROS sim node:
the episode plan from task and init choices, and the summary lines printed at the end."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MolmoActError


def parse_tasks(text: str | None, n_tasks: int, suite: str, option: str = "--tasks"
                ) -> list[int]:
    """``0,3`` or ``0-4`` (every task when not given), each checked against the suite; a
    selection that is blank, reversed or selects nothing is refused."""
    if text is None:
        return list(range(n_tasks))
    fix = f"write task numbers of {suite} (0..{n_tasks - 1}) like 0,3 or 0-4, or leave {option} out"
    shown = text if len(text) <= 40 else text[:40] + "..."
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                a, b = (int(x) for x in part.split("-", 1))
                if a > b:
                    raise MolmoActError(f"{option} {shown!r}: {a}-{b} is reversed; {fix}")
                if a < 0 or b >= n_tasks:
                    raise MolmoActError(f"{option} {shown!r}: {suite} has tasks 0..{n_tasks - 1}; "
                                        f"{a}-{b} goes beyond them")
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise MolmoActError(f"{option} {shown!r}: {fix}") from None
    if not out:
        raise MolmoActError(f"{option} {shown!r} selects no task; {fix}")
    bad = [t for t in out if not 0 <= t < n_tasks][:5]
    if bad:
        raise MolmoActError(f"{option}: {suite} has tasks 0..{n_tasks - 1}; {bad} do not exist")
    return list(dict.fromkeys(out))


def check_out(text: str | Path, inputs: dict[str, str | Path], option: str = "--out") -> Path:
    """The results folder, refused (naming ``option``) when it is blank, a file, inside an
    input (``inputs``: what it is -> its path), or a folder holding files this command did not
    write: it is new, empty, or holds this command's ledger."""
    from ..util.outputs import MARKER
    from .ledger import LEDGER
    from .summary import check_summary_files

    if not str(text).strip():
        raise MolmoActError(f"{option} is empty; give a results folder, e.g. {option} "
                            "results/spatial")
    out = Path(text).expanduser()
    if out.is_symlink() and not out.is_dir():
        raise MolmoActError(f"{option} {out} is a link to no folder; give a folder")
    if out.exists() and not out.is_dir():
        raise MolmoActError(f"{option} {out} is a file; give a folder")
    real = out.resolve()
    for what, path in inputs.items():
        if not str(path).strip():
            continue
        p = Path(path).expanduser().resolve()
        if real == p or p in real.parents:
            raise MolmoActError(f"{option} {out} is inside {what} {p}, an input; results never "
                                "go into an input: choose a folder outside it")
    if not out.is_dir():
        return out
    names = sorted(n for n in os.listdir(out) if n not in (f".{LEDGER}.new", MARKER))
    if names and LEDGER not in names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise MolmoActError(f"{option} {out} holds files this command did not write ({shown}) "
                            "and no ledger of it; choose a new or empty folder")
    check_summary_files(out, option)
    videos = out / "videos"
    if videos.is_symlink() or (videos.exists() and not videos.is_dir()):
        raise MolmoActError(f"{option}: {videos} is not a folder of this command's videos; "
                            "move it or choose a new folder")
    return out


def synthetic_bundle(bundle_root: str | Path, variant: str) -> bool:
    """Whether the variant's bundle says it holds random weights (``bundle.json``
    ``synthetic``: a test bundle, whose success rate is 0% by design)."""
    from ..bundle.bundle import resolve_bundle
    from ..bundle.schema import check_manifest, read_json_object
    from ..bundle.variants import VARIANTS

    _, folder = resolve_bundle(bundle_root, variant)
    manifest = folder / "bundle.json"
    if not manifest.is_file():
        return False
    data = check_manifest(manifest, read_json_object(manifest, "bundle.json"), tuple(VARIANTS))
    return bool(data.get("synthetic"))


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
    """The lines printed after a run: the protocol and its deviations, per suite success with
    its interval beside the variant's published rate, the totals, and the refused
    instructions."""
    from .summary import protocol_lines

    pub = summary["published"]
    lines = protocol_lines(summary)
    for suite, s in summary["suites"].items():
        lo, hi = s["ci95"]
        rate = s["published_rate"]
        lines.append(f"{suite}: {s['successes']}/{s['episodes']} success "
                     f"{100 * s['success_rate']:.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}%)"
                     + (f"; published ({pub['model']}) {100 * rate:.1f}%" if rate is not None
                        else ""))
    lines.append(f"published average {pub['average']}% ({pub['source']}); steps "
                 f"{summary['steps']['total']}, chunks {summary['chunks']}, rows executed "
                 f"{summary['rows_executed']}, skipped {summary['rows_skipped']}, drops "
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
    summary = summarize(records, ledger.run or run)
    if not_promptable:
        summary["not_promptable"] = [n.to_json() for n in not_promptable]
    files = write(out, summary)
    print("\n".join(summary_lines(summary, records)))
    print(f"results: {', '.join(str(f) for f in [ledger.path, *files])}")
    return records
