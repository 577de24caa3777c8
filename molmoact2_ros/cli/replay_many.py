"""``molmoact2 replay BAGS... --golden-dir DIR`` (or ``--record-dir DIR``): many recordings
checked against their golden chunk bags, in this process or over Ray actors (``--ray``).

One worker (this process, or each actor) loads the policy once and replays bag after bag; a
bag's verdict is plain JSON, appended to ``REPORT/verdicts.jsonl`` as it finishes, so an
interrupted run resumes where it stopped. Both paths run the same ``check_bag``
(``replay/fleet_worker.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import MolmoActError
from ..replay.fleet import (
    BagItem,
    error_verdict,
    format_merged,
    merge,
    pair_bags,
    verdict_line,
    write_merged,
)
from ..replay.fleet_worker import PARTIAL, check_bag, close_worker, setup_worker
from ..util.ledger import LedgerWriter, read_ledger
from ..util.progress import counter

#: the options a worker needs (everything else is the driver's)
WORKER_OPTIONS = ("bundle_root", "variant", "backend", "instruction", "seed", "flow_steps",
                  "max_age", "namespace", "set", "storage", "bag_version", "min_cosine", "atol",
                  "rtol", "min_within", "min_produced", "appbuilder", "force")
LEDGER = "verdicts.jsonl"


# -- the driver ------------------------------------------------------------------------------------
def is_many(args: argparse.Namespace) -> bool:
    """Whether ``replay`` runs the many-bag path (several bags, a golden or record folder,
    or --ray)."""
    return len(args.bags) > 1 or bool(args.golden_dir or args.record_dir or args.ray)


def _refuse_mixed(args: argparse.Namespace) -> None:
    if args.golden or args.record:
        raise MolmoActError("--golden and --record take one bag; with several bags (or --ray) "
                            "use --golden-dir DIR and --record-dir DIR, one golden per bag name")
    if args.golden_dir and args.record_dir:
        raise MolmoActError("--golden-dir and --record-dir in one run: record the goldens "
                            "first, then check against them")
    if args.golden_dir and not Path(args.golden_dir).is_dir():
        raise MolmoActError(f"--golden-dir {args.golden_dir} is not a folder")


def _resume(args: argparse.Namespace, items: list[BagItem]) -> tuple[list[dict], Path | None]:
    """The verdicts already in ``--report DIR`` (resume), after checking they are this run's."""
    if not args.report:
        return [], None
    from ..util.outputs import check_file, check_folder, remove

    report = check_folder(args.report, what="--report")
    ledger = report / LEDGER
    for name in (LEDGER, "summary.json", "summary.md"):  # only files this package wrote
        if os.path.lexists(report / name):
            check_file(report / name, force=True, what="--report file")
    if args.force:
        for name in (LEDGER, "summary.json", "summary.md"):
            remove(report / name, what="--report file")
    elif (report / "summary.json").exists():
        raise MolmoActError(f"--report {report} holds a finished report; choose a new folder "
                            "or pass --force to start over")
    done = read_ledger(ledger, "bag")
    wanted = {i.name: i for i in items}
    for v in done:
        item = wanted.get(v["bag"])
        if item is None or (v.get("path"), v.get("golden"), v.get("record")) != (
                item.bag, item.golden, item.record):
            raise MolmoActError(f"{ledger} holds bag {v['bag']!r} of another run; choose a new "
                                "--report folder or pass --force to start over")
    return done, ledger


def cmd_replay_many(args: argparse.Namespace) -> int:
    """Check (or record) every bag; one line per bag as it finishes, then the merged report.
    Exit 0 when every bag passed, 1 when one failed, 2 when one could not be checked."""
    _refuse_mixed(args)
    for bag in args.bags:
        if not Path(bag).exists():
            raise MolmoActError(f"bag {bag} does not exist")
    if args.record_dir:
        from ..util.outputs import check_folder

        check_folder(args.record_dir, what="--record-dir").mkdir(parents=True, exist_ok=True)
    items = pair_bags(args.bags, golden_dir=args.golden_dir or "", record_dir=args.record_dir or "")
    done, ledger_path = _resume(args, items)
    if args.record_dir:  # a resumed run as well: an earlier run's golden needs --force
        from ..replay.bagio import check_output

        finished = {v["bag"] for v in done}
        for item in items:
            if item.name not in finished:
                check_output(Path(item.record), args.force, "--record-dir bag")
                check_output(Path(item.record + PARTIAL), True, "--record-dir bag")
    if done:
        print(f"resuming: {len(done)} of {len(items)} bags already in {ledger_path}")
    options = {k: getattr(args, k) for k in WORKER_OPTIONS}
    by_name: dict[str, dict] = {v["bag"]: v for v in done}
    todo = [i for i in items if i.name not in by_name]
    bar = counter(len(items), "replay", unit="bag", enabled=not args.no_progress)
    bar.update(len(done))
    writer = LedgerWriter(ledger_path, "bag") if ledger_path is not None else None

    def record(v: dict[str, Any]) -> None:
        if v["bag"] in by_name:
            return
        by_name[v["bag"]] = v
        if writer is not None:
            writer.append(v)
        bar.update(1)
        print(verdict_line(v), flush=True)

    from ..util.signals import StopSignals

    stats = None
    try:
        with StopSignals() as signals:
            if args.ray:
                stats = _run_on_ray(args, todo, options, record,
                                    lambda: signals.received is not None)
            else:
                worker = setup_worker(options) if todo else None
                try:
                    for item in todo:
                        if signals.received is not None:
                            break
                        record(check_bag(worker, item))
                finally:
                    if worker is not None:
                        worker.close()
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    verdicts = [by_name[i.name] for i in items if i.name in by_name]
    if signals.received is not None:
        print(f"interrupted by signal {signals.received}: {len(verdicts)} of {len(items)} bags "
              f"checked{f', in {ledger_path} (run again to resume)' if ledger_path else ''}",
              file=sys.stderr)
        from ..util.signals import SIGNAL_EXIT

        return SIGNAL_EXIT.get(signals.received, 1)
    report = merge(verdicts)
    if stats is not None:
        report["ray"] = _stats_json(stats)
    print(format_merged(report))
    if stats is not None:
        print(_stats_line(stats))
    if args.report:
        files = write_merged(Path(args.report), report)
        print(f"report: {', '.join(str(f) for f in files)}")
    if report["error"]:
        return 2
    return 1 if report["fail"] else 0


def _run_on_ray(args, todo: list[BagItem], options: dict, record, should_stop):
    from ..cluster.connect import cluster
    from ..cluster.fanout import Job, fan_out
    from .ray_args import item_timeouts, resources

    job = Job(setup=setup_worker, work=check_bag, setup_arg=options, teardown=close_worker)
    items = {i.name: i for i in todo}

    def on_result(outcome) -> None:
        if outcome.error:  # the actor died more often than allowed, or the work raised
            record(error_verdict(items[outcome.key], outcome.error, outcome.work_s))
        else:
            record(outcome.value)

    with cluster(args.ray):
        stats = fan_out([(i.name, i) for i in todo], job, on_result,
                        resources=resources(args), actors=args.ray_actors,
                        max_retries=args.ray_retries, should_stop=should_stop,
                        item_timeout_s=item_timeouts(
                            args, {i.name: _mib(i.bag) for i in todo}, 300.0, 60.0))
    for note in stats.notes:
        print(note, file=sys.stderr)
    return stats


def _mib(path: str) -> float:
    """A bag's size in MiB (a folder: its files; what cannot be read counts as nothing)."""
    p = Path(path)
    try:
        files = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
        return sum(f.stat().st_size for f in files) / 2**20
    except OSError:
        return 0.0


def _stats_json(stats) -> dict[str, Any]:
    return {"actors": stats.actors, "actors_started": stats.actors_started,
            "deaths": stats.deaths, "retries": stats.retries, "timeouts": stats.timeouts,
            "items": stats.items,
            "setup_s": [round(s, 3) for s in stats.setup_s], "work_s": round(stats.work_s, 3),
            "wall_s": round(stats.wall_s, 3),
            "overhead_fraction": round(stats.overhead_fraction, 5)}


def _stats_line(stats) -> str:
    line = (f"ray: {stats.items} bags on {stats.actors} actors in {stats.wall_s:.1f} s; "
            f"scheduling overhead {stats.overhead_fraction:.2%} of the work per bag")
    if stats.deaths:
        line += (f"; {stats.deaths} actor deaths, re-run: "
                 f"{', '.join(f'{k} x{n}' for k, n in sorted(stats.retries.items()))}")
    if stats.timeouts:
        line += ("; past their deadline: "
                 f"{', '.join(f'{k} x{n}' for k, n in sorted(stats.timeouts.items()))}")
    return line
