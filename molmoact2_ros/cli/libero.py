"""``molmoact2 libero``: closed-loop LIBERO episodes through the node's controller, no ROS.

Results go to ``--out``: the ledger ``episodes.jsonl`` (a rerun with the same folder resumes it),
``summary.json``/``summary.md`` next to the published success rates, ``success_by_task.png`` and
one video per episode under ``videos/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..bundle.variants import VARIANTS
from ..errors import MolmoActError
from ..replay.run_settings import parse_set
from ..util.signals import SIGNAL_EXIT, StopSignals
from .args import example, float_in, int_at_least, int_in
from .libero_ray import ENV_MEMORY_GB
from .ray_args import add_ray_args


def run_settings(args: argparse.Namespace) -> tuple[Any, dict]:
    """The node settings of the run (evaluation defaults, bundle, --set) and the run record."""
    from ..bundle.bundle import bundle_parameters
    from ..control.params import Settings, validate_changes
    from ..sim.runner import EVAL_DEFAULTS

    sets = parse_set(args.set or [])
    changes = {**EVAL_DEFAULTS, "variant": args.variant, "backend": args.backend,
               **bundle_parameters(args.bundle_root), **sets}
    if args.seed is not None:
        changes["seed"] = args.seed
    ok, reason = validate_changes(changes, Settings())
    if not ok:
        raise MolmoActError(reason)
    settings = Settings().with_changes(changes)
    run = {"suite": args.suite, "variant": args.variant, "backend": args.backend,
           "time_mode": args.time_mode, "latency_ms": args.latency_ms,
           "max_steps": args.max_steps, "settle_steps": args.settle_steps,
           "image_rotation": args.image_rotation, "seed": settings["seed"],
           "set": sorted(args.set or [])}
    return settings, run


def cmd_libero(args: argparse.Namespace) -> int:
    from ..sim.evaluation import finish_run, parse_tasks, plan
    from ..sim.ledger import Ledger
    from ..sim.libero_env import LiberoSim, suite_tasks
    from ..sim.prompt_fit import split_promptable
    from ..sim.runner import EpisodeRunner
    from ..util.progress import counter

    if args.ray:
        from ..cluster.connect import is_address

        if not is_address(args.ray):
            raise MolmoActError(f"--ray {args.ray}: not an address; use local, auto, HOST:PORT "
                                "or ray://HOST:PORT")
    settings, run = run_settings(args)
    infos = suite_tasks(args.suite)  # unknown suite, or no LIBERO: one line, exit 2
    tasks = parse_tasks(args.tasks, len(infos), args.suite)
    # before any env: tasks whose instruction the prompt cannot hold are left out (none: exit 2)
    tasks, not_promptable = split_promptable(settings, args.suite, infos, tasks)
    for skipped in not_promptable:
        print(f"not promptable: {args.suite} task {skipped.task_id}: {skipped.reason}",
              file=sys.stderr)
    specs = plan(args.suite, tasks, args.episodes, args.first_init, infos)
    if args.time_mode == "realtime":
        raise MolmoActError("--time-mode realtime runs on the wall clock through ROS: ros2 "
                            "launch molmoact2_ros libero.launch.py time_mode:=realtime; here use "
                            "lockstep or latency")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise MolmoActError(f"--out {out} is a file; give a folder")
    ledger = Ledger(out, run)
    todo = [s for s in specs if s.key not in ledger.done()]
    print(f"libero: {len(specs)} episodes of {args.suite} tasks {tasks} "
          f"({len(specs) - len(todo)} in the ledger already, {len(todo)} to run), "
          f"{args.time_mode}" + (f" {args.latency_ms} ms" if args.time_mode == "latency" else "")
          + f", {settings['variant']} on {settings['backend']}", file=sys.stderr)
    received = None
    if todo and args.ray:
        from .libero_ray import run_with_progress

        received = run_with_progress(args, settings, todo, ledger, len(specs))
    elif todo:
        sim = LiberoSim(image_rotation=args.image_rotation, settle_steps=args.settle_steps)
        runner = None
        bar = counter(len(specs), "libero", unit="ep", enabled=not args.no_progress)
        bar.update(len(specs) - len(todo))
        try:
            runner = EpisodeRunner(
                sim, settings, time_mode=args.time_mode, latency_ms=args.latency_ms,
                max_steps=args.max_steps, seed=args.seed if args.seed is not None else 0,
                video_dir=out / "videos" if args.video != "none" else None, videos=args.video)
            with StopSignals() as signals:
                runner.should_stop = lambda: signals.received is not None
                for spec in todo:
                    rec = runner.run(spec)
                    if rec is None:
                        break
                    ledger.append(rec.to_json())
                    done = [r for r in ledger.records]
                    wins = sum(1 for r in done if r["success"])
                    text = (f"libero {wins}/{len(done)} success "
                            f"({100 * wins / len(done):.0f}%)")
                    bar.set_description(text)
                    bar.update(1)
                    if args.no_progress or not sys.stderr.isatty():
                        status = "success" if rec.success else (
                            f"refused: {rec.reason}" if rec.status == "refused" else "failure")
                        print(f"{spec.key}: {status} in {rec.steps} steps "
                              f"({rec.timing.wall_s:.0f} s); {text}", file=sys.stderr,
                              flush=True)
                    if signals.received is not None:
                        break
                received = signals.received
        finally:
            bar.close()
            if runner is not None:
                runner.close()
            sim.close()
    records = finish_run(ledger, specs, run, out, not_promptable=not_promptable)
    if received is not None:
        print(f"interrupted by signal {received}: {len(records)} of {len(specs)} episodes in "
              f"the ledger; run the same command again to resume", file=sys.stderr)
        return SIGNAL_EXIT.get(received, 1)
    return 0


def register(sub) -> None:
    """Add the libero command to the ``molmoact2`` parser."""
    from ..sim.libero_env import DEFAULT_SETTLE_STEPS, ROTATIONS, STANDARD_SUITES
    from ..sim.runner import TIME_MODES

    p = sub.add_parser(
        "libero", help="evaluate a bundle in closed loop on LIBERO (no ROS); success rates "
        "next to the published ones",
        description="Run LIBERO episodes through the node's own controller and execution code "
        "on a sim clock\n(lockstep, or a chunk latency in sim time), one env on its own thread. "
        "Writes the ledger\nepisodes.jsonl (a rerun resumes it), summary.json/.md with 95% "
        "Wilson intervals beside the\npublished rates, success_by_task.png and one video per "
        "episode. Needs the sim extra and\nMUJOCO_GL=egl or osmesa (docs/libero.md).",
        epilog=example("molmoact2 libero --suite libero_spatial --tasks 0,3 --episodes 50 "
                       "--bundle-root /data/molmoact2 --variant grid_sampler --out results/spatial",
                       "molmoact2 libero --suite libero_goal --time-mode latency --latency-ms 180 "
                       "--bundle-root /data/molmoact2 --out results/goal_180ms"))
    p.add_argument("--suite", default="libero_spatial",
                   help=f"LIBERO suite: {', '.join(STANDARD_SUITES)} (or a LIBERO-PRO suite)")
    p.add_argument("--tasks", help="task numbers, e.g. 0,3 or 0-4 (default: every task)")
    p.add_argument("--episodes", type=int_at_least(1), default=50,
                   help="episodes per task, one per fixed init state")
    p.add_argument("--first-init", type=int_at_least(0), default=0,
                   help="first init state (episodes use first-init .. first-init+episodes-1)")
    p.add_argument("--bundle-root", required=True,
                   help="a root with one folder per variant, or one variant's folder")
    p.add_argument("--variant", default="grid_sampler", choices=list(VARIANTS))
    p.add_argument("--backend", default="onnx", choices=["onnx", "htp"],
                   help="onnx: ONNX Runtime here; htp: resident workers (the board, or "
                   "--appbuilder fake)")
    p.add_argument("--time-mode", default="lockstep", choices=list(TIME_MODES),
                   help="lockstep: sim time stops while the policy computes; latency: the sim "
                   "runs on for the chunk's latency (--latency-ms, or measured); realtime: "
                   "through ROS only")
    p.add_argument("--latency-ms", type=float_in(0.0, 60000.0), default=0.0,
                   help="latency mode: fixed latency of every chunk in sim time (e.g. the "
                   "board's from device-report); 0 = each chunk's measured wall time")
    p.add_argument("--max-steps", type=int_at_least(1),
                   help="policy steps per episode (default: the suite's: spatial 220, object "
                   "280, goal 300, libero_10 520, libero_90 400)")
    p.add_argument("--settle-steps", type=int_at_least(0), default=DEFAULT_SETTLE_STEPS,
                   help="zero-action steps before the policy starts (LeRobot's published "
                   "evaluation 50, OpenVLA 10)")
    p.add_argument("--image-rotation", default="180", choices=list(ROTATIONS),
                   help="how renders reach the policy: 180 as the training data, vflip, none")
    p.add_argument("--seed", type=int_in(0, 2**31 - 1),
                   help="noise seed of the policy and the env seed base "
                   "(default 7 for the policy, 0 for the env)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="any node parameter (config/policy.yaml), e.g. execution.blend=crossfade")
    p.add_argument("--video", default="all", choices=["all", "failures", "none"],
                   help="episode videos under OUT/videos")
    p.add_argument("--out", required=True, help="results folder; an existing ledger resumes")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar; one line per episode instead")
    add_ray_args(p, what="episodes", memory_gb=ENV_MEMORY_GB)
    p.set_defaults(func=cmd_libero)
