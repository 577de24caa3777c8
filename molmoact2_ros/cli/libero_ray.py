"""``molmoact2 libero ... --ray [ADDRESS]``: the evaluation's episodes over Ray actors.

Each actor builds one LIBERO env (on its own thread, inside ``LiberoSim``) and one policy behind
the node's controller (``EpisodeRunner``) once, then runs episode after episode. Records stream
back into the same ``episodes.jsonl`` as they finish; what the ledger holds is not run again.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: memory each actor declares by default: one LIBERO env holds about 2 GB
ENV_MEMORY_GB = 2.0
#: an episode's default deadline: 300 s plus 5 s per step of its --max-steps
EPISODE_TIMEOUT = (300.0, 5.0)


def run_with_progress(args, settings, todo: list, ledger, total: int, run: dict) -> int | None:
    """The Ray run of ``molmoact2 libero``: one progress bar over the whole evaluation with the
    running success rate; returns the signal that interrupted it, if one did."""
    from ..util.progress import counter
    from ..util.signals import StopSignals

    bar = counter(total, "libero", unit="ep", enabled=not args.no_progress)
    bar.update(total - len(todo))

    def on_record(rec: dict[str, Any]) -> None:
        wins = sum(1 for r in ledger.records if r["success"])
        text = f"libero {wins}/{len(ledger.records)} success " \
               f"({100 * wins / len(ledger.records):.0f}%)"
        bar.set_description(text)
        bar.update(1)
        if args.no_progress or not sys.stderr.isatty():
            status = "success" if rec["success"] else (
                f"refused: {rec['reason']}" if rec["status"] == "refused" else "failure")
            print(f"{rec['key']}: {status} in {rec['steps']} steps "
                  f"({rec['timing']['wall_s']:.0f} s); {text}", file=sys.stderr, flush=True)

    try:
        with StopSignals() as signals:
            run_on_ray(args, settings, todo, ledger, total,
                       lambda: signals.received is not None, on_record, run)
    finally:
        bar.close()
    return signals.received


def run_on_ray(args, settings, specs_todo: list, ledger, total: int, should_stop,
               on_record, run: dict) -> Any:
    """Fan ``specs_todo`` out; every finished episode goes to ``ledger`` and ``on_record``.
    Returns the fan-out's statistics."""
    from ..cluster.connect import cluster
    from ..cluster.fanout import Job, fan_out
    from ..cluster.libero_jobs import close_episode_worker, run_episode, setup_episode_worker
    from ..errors import MolmoActError
    from .ray_args import item_timeouts, resources

    out = Path(args.out).resolve()
    options = {
        "image_rotation": args.image_rotation, "settle_steps": args.settle_steps,
        "camera_size": run["render_px"],
        "settings": settings, "appbuilder": getattr(args, "appbuilder", "installed"),
        "runner": {"time_mode": args.time_mode, "latency_ms": args.latency_ms or 0.0,
                   "max_steps": run["max_steps"], "seed": args.seed,
                   "video_dir": out / "videos" if args.video != "none" else None,
                   "videos": args.video},
    }
    job = Job(setup_episode_worker, run_episode, options, close_episode_worker)
    errors: list[str] = []

    def on_result(outcome) -> None:
        if outcome.error:  # not recorded: the episode runs again on the next resume
            errors.append(f"{outcome.key}: {outcome.error}")
            print(f"{outcome.key}: not recorded: {outcome.error}", file=sys.stderr, flush=True)
            return
        ledger.append(outcome.value)
        on_record(outcome.value)

    with cluster(args.ray):
        stats = fan_out([(s.key, s) for s in specs_todo], job, on_result,
                        resources=resources(args), actors=args.ray_actors,
                        max_retries=args.ray_retries, should_stop=should_stop,
                        item_timeout_s=item_timeouts(
                            args, {s.key: run["max_steps"] for s in specs_todo},
                            *EPISODE_TIMEOUT))
    for note in stats.notes:
        print(note, file=sys.stderr)
    print(f"ray: {stats.items} episodes on {stats.actors} actors in {stats.wall_s:.1f} s "
          f"(setup {max(stats.setup_s, default=0.0):.1f} s per actor); scheduling overhead "
          f"{stats.overhead_fraction:.2%} of an episode"
          + (f"; {stats.deaths} actor deaths, re-run: "
             + ", ".join(f"{k} x{n}" for k, n in sorted(stats.retries.items()))
             if stats.deaths else "")
          + ("; past their deadline: "
             + ", ".join(f"{k} x{n}" for k, n in sorted(stats.timeouts.items()))
             if stats.timeouts else ""), file=sys.stderr)
    if errors and not stats.interrupted:
        raise MolmoActError(f"{len(errors)} of {total} episodes could not be run (first: "
                            f"{errors[0]}); the others are in {ledger.path}: run again to retry")
    return stats
