"""``molmoact2 replay BAGS... --golden-dir DIR`` (or ``--record-dir DIR``): many recordings
checked against their golden chunk bags, in this process or over Ray actors (``--ray``).

One worker (this process, or each actor) loads the policy once and replays bag after bag; a
bag's verdict is plain JSON, appended to ``REPORT/verdicts.jsonl`` as it finishes, so an
interrupted run resumes where it stopped. Both paths run the same ``check_bag``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MolmoActError
from ..replay.fleet import (
    BagItem,
    LentPolicy,
    error_verdict,
    format_merged,
    merge,
    pair_bags,
    verdict,
    verdict_line,
    write_merged,
)
from ..util.ledger import LedgerWriter, read_ledger
from ..util.progress import counter

#: the options a worker needs (everything else is the driver's)
WORKER_OPTIONS = ("bundle_root", "variant", "backend", "instruction", "seed", "flow_steps",
                  "max_age", "namespace", "set", "storage", "bag_version", "min_cosine", "atol",
                  "rtol", "min_within", "min_produced", "appbuilder")
LEDGER = "verdicts.jsonl"
PARTIAL = ".partial"


# -- the worker: one policy load, many bags ------------------------------------------------------

class Worker:
    """Policies loaded once per worker (by the settings that need a reload) and the options
    every bag shares."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = dict(options)
        self.policies: dict[tuple, Any] = {}
        if self.options.get("appbuilder") == "fake":
            from ..runtime.appbuilder import use_test_fake

            use_test_fake()

    def policy(self, settings, fixed_noise: np.ndarray | None):
        from ..control.controller import load_policy

        key = (str(settings.bundle_path()), settings["variant"], settings["backend"],
               tuple(sorted(settings.suffixes().items())),
               repr(settings.runtime_options()) if settings["backend"] == "htp" else "")
        policy = self.policies.get(key)
        if policy is None:
            policy = self.policies[key] = load_policy(settings)
        policy.set_flow_steps(settings.flow_steps() or policy.variant.default_flow_steps)
        if settings["instruction"]:
            policy.set_instruction(settings["instruction"])
        policy.fixed_noise = fixed_noise
        return LentPolicy(policy)

    def close(self) -> None:
        for policy in self.policies.values():
            policy.close()
        self.policies.clear()


def setup_worker(options: dict[str, Any]) -> Worker:
    """An actor's (or this process's) one-time setup: the bundle is checked here, so a node
    that cannot see it fails at once."""
    from ..bundle.bundle import bundle_parameters

    bundle_parameters(options["bundle_root"])
    return Worker(options)


def close_worker(worker: Worker) -> None:
    worker.close()


def check_bag(worker: Worker, item: BagItem) -> dict[str, Any]:
    """Replay one bag and compare it with its golden (or record its golden): its verdict.
    A bag that cannot be checked gets an ``error`` verdict naming why; the others go on."""
    start = time.perf_counter()
    try:
        return _check(worker, item, start)
    except MolmoActError as exc:
        return error_verdict(item, str(exc), time.perf_counter() - start)
    except Exception as exc:  # a library or a bug: this bag's verdict, not the fleet's end
        return error_verdict(item, f"unexpected {type(exc).__name__}: {exc}",
                             time.perf_counter() - start)


def _check(worker: Worker, item: BagItem, start: float) -> dict[str, Any]:
    from ..replay.bagio import check_output
    from ..replay.chunk_match import match_chunks
    from ..replay.chunkbag import ChunkBagWriter, action_scale, run_info, scale_of
    from ..replay.replay import replay
    from .replay import golden_and_settings

    args = argparse.Namespace(**worker.options, bag=item.bag, golden=item.golden or None,
                              record=item.record or None)
    if args.golden and not Path(args.golden).exists():
        raise MolmoActError(f"no golden chunk bag {args.golden}; record one with "
                            "`molmoact2 replay BAGS... --record-dir DIR`")
    golden, trace, golden_settings, settings, tol, differences = golden_and_settings(args)
    noise = np.asarray(trace["noise"], np.float32) if trace is not None else None
    partial = Path(item.record + PARTIAL) if item.record else None
    if partial is not None:  # a killed attempt's leftovers; the golden appears only when done
        check_output(Path(item.record), True, "--record-dir bag")
        shutil.rmtree(partial, ignore_errors=True)
    writer: dict[str, Any] = {"w": None}

    def on_active(controller, bag_topics) -> None:
        if partial is not None:
            steps = getattr(controller.policy, "flow_steps", settings.flow_steps())
            norm = getattr(getattr(controller.policy, "norm_stats", None), "action", None)
            writer["w"] = ChunkBagWriter(
                partial, run_info(settings, flow_steps=steps, source_bag=Path(item.bag).name,
                                  scale=scale_of(norm) if norm is not None else None),
                mcap=args.storage == "mcap", version=args.bag_version)

    try:
        result = replay(Path(item.bag), settings,
                        policy_factory=lambda s: worker.policy(s, noise),
                        on_published=lambda out, ns: writer["w"] and writer["w"].write(out, ns),
                        on_active=on_active, namespace=args.namespace)
    finally:
        if writer["w"] is not None:
            writer["w"].close()
    recorded = -1
    if partial is not None:
        target = Path(item.record)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        partial.rename(target)
        recorded = writer["w"].count
    summary, names = None, list(settings["action_names"])
    if golden is not None:
        produced = {p.chunk.observation_stamp_ns: p.actions for p in result.published}
        if trace is not None:
            chunks = {stamp: np.asarray(trace["chunk"], np.float32) for stamp in produced}
        else:
            chunks, names = golden.chunks, golden.action_names or names
        summary = match_chunks(produced, chunks, tol, min_produced=args.min_produced,
                               scale=action_scale(golden_settings, settings["variant"],
                                                  args.bundle_root))
    steps = result.published[0].chunk.flow_steps if result.published else settings.flow_steps()
    shown = {"variant": settings["variant"], "backend": settings["backend"],
             "instruction": settings["instruction"], "seed": settings["seed"],
             "flow_steps": steps}
    return verdict(item, result, summary, settings=shown, differences=differences,
                   action_names=names, recorded=recorded, seconds=time.perf_counter() - start)


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
    report = Path(args.report)
    if report.exists() and not report.is_dir():
        raise MolmoActError(f"--report {report} is a file; give a folder")
    ledger = report / LEDGER
    if args.force:
        for name in (LEDGER, "summary.json", "summary.md"):
            (report / name).unlink(missing_ok=True)
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
        Path(args.record_dir).mkdir(parents=True, exist_ok=True)
    items = pair_bags(args.bags, golden_dir=args.golden_dir or "", record_dir=args.record_dir or "")
    done, ledger_path = _resume(args, items)
    if args.record_dir and not done:
        from ..replay.bagio import check_output

        for item in items:
            check_output(Path(item.record), args.force, "--record-dir bag")
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

    from .replay import _Signals

    stats = None
    try:
        with _Signals() as signals:
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
        from .replay import SIGNAL_EXIT

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
    from .ray_args import resources

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
                        max_retries=args.ray_retries, should_stop=should_stop)
    for note in stats.notes:
        print(note, file=sys.stderr)
    return stats


def _stats_json(stats) -> dict[str, Any]:
    return {"actors": stats.actors, "actors_started": stats.actors_started,
            "deaths": stats.deaths, "retries": stats.retries, "items": stats.items,
            "setup_s": [round(s, 3) for s in stats.setup_s], "work_s": round(stats.work_s, 3),
            "wall_s": round(stats.wall_s, 3),
            "overhead_fraction": round(stats.overhead_fraction, 5)}


def _stats_line(stats) -> str:
    line = (f"ray: {stats.items} bags on {stats.actors} actors in {stats.wall_s:.1f} s; "
            f"scheduling overhead {stats.overhead_fraction:.2%} of the work per bag")
    if stats.deaths:
        line += (f"; {stats.deaths} actor deaths, re-run: "
                 f"{', '.join(f'{k} x{n}' for k, n in sorted(stats.retries.items()))}")
    return line
