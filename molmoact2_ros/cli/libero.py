"""``molmoact2 libero``: closed-loop LIBERO episodes through the node's controller, no ROS.

Results go to ``--out`` (new, empty, or this command's earlier results): the ledger
``episodes.jsonl`` (its settings first; a rerun with the same folder resumes it),
``summary.json``/``summary.md`` next to the variant's published success rates with the protocol
and its deviations, ``success_by_task.png`` and one video per episode under ``videos/``, named
by its outcome.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..bundle.variants import VARIANTS
from ..errors import MolmoActError
from ..replay.run_settings import parse_set
from ..util.signals import SIGNAL_EXIT, StopSignals
from .args import example, float_in, int_at_least, int_in
from .libero_ray import ENV_MEMORY_GB
from .ray_args import add_ray_args

#: ``--set`` names the evaluation sets itself, with the option that sets them
SET_ELSEWHERE = {"instruction": "each task sets its own instruction",
                 "seed": "the episodes' seeds derive from --seed",
                 "variant": "use --variant", "backend": "use --backend",
                 "control_period_s": "LIBERO steps at 20 Hz"}


def check_options(args: argparse.Namespace) -> None:
    """Options that would be ignored or misplaced are refused, each naming itself."""
    if args.latency_ms is not None and args.time_mode != "latency":
        raise MolmoActError(f"--latency-ms applies to --time-mode latency only (this run is "
                            f"{args.time_mode}); drop it or add --time-mode latency")
    if args.ray is not None and not args.ray.strip():
        raise MolmoActError("--ray is empty; leave it out to run here, or give local, auto, "
                            "HOST:PORT or ray://HOST:PORT")
    for item in args.set or []:
        name = item.partition("=")[0].strip()
        why = SET_ELSEWHERE.get(name) or ("use --bundle-root" if name.startswith("bundle.")
                                          else None)
        if why:
            raise MolmoActError(f"--set {name}: molmoact2 libero sets it ({why})")
    if args.time_mode == "realtime":
        raise MolmoActError("--time-mode realtime runs on the wall clock through ROS: ros2 "
                            "launch molmoact2_ros libero.launch.py time_mode:=realtime; here use "
                            "lockstep or latency")


def run_settings(args: argparse.Namespace, suite_steps: int | None = None) -> tuple[Any, dict]:
    """The node settings of the run (the protocol's, bundle, --set) and the run record the
    ledger keeps: every setting, the deviations from the published protocol, whether the
    bundle holds random weights."""
    from ..bundle.bundle import bundle_parameters
    from ..control.params import Settings, validate_changes
    from ..sim.evaluation import synthetic_bundle
    from ..sim.protocol import EXECUTION, RENDER_PX, deviations, execution_changes, max_steps_of

    sets = parse_set(args.set or [])
    changes = {**EXECUTION[args.protocol], "seed": args.seed, "variant": args.variant,
               "backend": args.backend, **bundle_parameters(args.bundle_root), **sets}
    ok, reason = validate_changes(changes, Settings())
    if not ok:
        raise MolmoActError(reason)
    settings = Settings().with_changes(changes)
    steps = suite_steps if suite_steps is not None else max_steps_of(args.suite)
    run = {"suite": args.suite, "variant": args.variant, "backend": args.backend,
           "protocol": args.protocol, "time_mode": args.time_mode,
           "latency_ms": args.latency_ms or 0.0, "max_steps": args.max_steps or steps,
           "render_px": args.render_size or RENDER_PX, "settle_steps": args.settle_steps,
           "image_rotation": args.image_rotation, "seed": args.seed,
           "set": sorted(args.set or [])}
    run["deviations"] = deviations(run, steps, execution_changes(settings))
    run["synthetic_bundle"] = synthetic_bundle(args.bundle_root, args.variant)
    return settings, run


def cmd_libero(args: argparse.Namespace) -> int:
    from ..sim.evaluation import check_out, finish_run, parse_tasks, plan
    from ..sim.ledger import Ledger
    from ..sim.libero_env import LiberoSim, suite_tasks
    from ..sim.prompt_fit import split_promptable
    from ..sim.runner import EpisodeRunner
    from .libero_progress import EpisodeProgress

    check_options(args)
    out = check_out(args.out, {"the bundle": args.bundle_root})
    progress = EpisodeProgress(enabled=not args.no_progress)
    progress.phase("loading LIBERO and the suite's tasks")
    try:
        if args.ray is not None:
            from ..cluster.connect import is_address

            if not is_address(args.ray):
                raise MolmoActError(f"--ray {args.ray}: not an address; use local, auto, "
                                    "HOST:PORT or ray://HOST:PORT")
        infos = suite_tasks(args.suite)  # unknown suite, or no LIBERO: one line, exit 2
        tasks = parse_tasks(args.tasks, len(infos), args.suite)
        settings, run = run_settings(args, infos[0].max_steps)
        # before any env: tasks whose instruction the prompt cannot hold are left out (none:
        # exit 2)
        tasks, not_promptable = split_promptable(settings, args.suite, infos, tasks)
        for skipped in not_promptable:
            progress.note(f"not promptable: {args.suite} task {skipped.task_id}: "
                          f"{skipped.reason}")
        specs = plan(args.suite, tasks, args.episodes, args.first_init, infos)
        ledger = Ledger(out, run)
        todo = [s for s in specs if s.key not in ledger.done()]
        progress.note(
            f"libero: {len(specs)} episodes of {args.suite} tasks {tasks} "
            f"({len(specs) - len(todo)} in the ledger already, {len(todo)} to run), protocol "
            f"{args.protocol}, {args.time_mode}"
            + (f" {args.latency_ms or 'measured'} ms" if args.time_mode == "latency" else "")
            + f", {settings['variant']} on {settings['backend']}; deviations: "
            + ("; ".join(run["deviations"]) or "none"))
        received = None
        if todo and args.ray is not None:
            from .libero_ray import run_with_progress

            progress.close()
            received = run_with_progress(args, settings, todo, ledger, len(specs), run)
        elif todo:
            received = _run_here(args, settings, run, todo, ledger, specs, out, progress,
                                 LiberoSim, EpisodeRunner)
    finally:
        progress.close()
    records = finish_run(ledger, specs, run, out, not_promptable=not_promptable)
    if received is not None:
        print(f"interrupted by signal {received}: {len(records)} of {len(specs)} episodes in "
              f"the ledger; run the same command again to resume", file=sys.stderr)
        return SIGNAL_EXIT.get(received, 1)
    return 0


def _run_here(args, settings, run, todo, ledger, specs, out, progress, sim_cls, runner_cls):
    """The episodes in this process; returns the signal that interrupted them, if one did."""
    progress.start(len(specs), len(specs) - len(todo))
    progress.phase("starting the simulator")
    sim = sim_cls(image_rotation=args.image_rotation, settle_steps=args.settle_steps,
                  camera_size=run["render_px"])
    runner = None
    try:
        progress.phase(f"loading the policy ({settings['variant']} on {settings['backend']})")
        runner = runner_cls(
            sim, settings, time_mode=args.time_mode, latency_ms=args.latency_ms or 0.0,
            max_steps=run["max_steps"], seed=args.seed,
            video_dir=out / "videos" if args.video != "none" else None, videos=args.video)
        runner.on_phase = progress.episode_phase
        runner.on_step = lambda spec, obs: progress.step(spec, obs, runner.current)
        with StopSignals() as signals:
            runner.should_stop = lambda: signals.received is not None
            for spec in todo:
                progress.begin(spec)
                rec = runner.run(spec)
                if rec is None:
                    break
                ledger.append(rec.to_json())
                progress.finished(rec.to_json(), ledger.records)
                if signals.received is not None:
                    break
            return signals.received
    finally:
        progress.close()
        if runner is not None:
            runner.close()
        sim.close()


def register(sub) -> None:
    """Add the libero command to the ``molmoact2`` parser."""
    from ..sim.libero_env import DEFAULT_SETTLE_STEPS, ROTATIONS, STANDARD_SUITES
    from ..sim.protocol import MAX_STEPS, PROTOCOLS, RENDER_PX, RUN_SEED
    from ..sim.runner import TIME_MODES

    p = sub.add_parser(
        "libero", help="evaluate a bundle in closed loop on LIBERO (no ROS); success rates "
        "next to the published ones",
        description="Run LIBERO episodes through the node's own controller and execution code "
        "on a sim clock\n(lockstep, or a chunk latency in sim time), one env on its own thread. "
        "Writes the ledger\nepisodes.jsonl (a rerun resumes it), summary.json/.md with 95% "
        "Wilson intervals beside the\npublished rates, success_by_task.png and one video per "
        "episode. Needs the sim extra and\nMUJOCO_GL=egl or osmesa (docs/libero.md).",
        epilog=example("molmoact2 libero --suite libero_goal --tasks 0,3 --episodes 50 "
                       "--bundle-root /data/molmoact2 --variant grid_sampler --out results/goal",
                       "molmoact2 libero --suite libero_goal --time-mode latency --latency-ms 180 "
                       "--bundle-root /data/molmoact2 --out results/goal_180ms"))
    p.add_argument("--suite", default="libero_spatial",
                   help=f"LIBERO suite: {', '.join(STANDARD_SUITES)} (or a LIBERO-PRO suite)")
    p.add_argument("--protocol", default="published", choices=list(PROTOCOLS),
                   help="published: LeRobot's evaluation, the one the published rates come "
                   "from (every row of a chunk runs before the next observation, the suite's "
                   f"steps, {RENDER_PX} px, per-episode seeds); node: the node's execution "
                   "settings (execution.overlap_s 0.1 replans two rows early)")
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
    p.add_argument("--latency-ms", type=float_in(0.0, 60000.0),
                   help="--time-mode latency only: fixed latency of every chunk in sim time "
                   "(e.g. the board's from device-report); 0 or absent = each chunk's measured "
                   "wall time")
    p.add_argument("--max-steps", type=int_at_least(1, 100_000),
                   help="policy steps per episode (default: the suite's in LeRobot's "
                   "evaluation: " + ", ".join(f"{k.replace('libero_', '')} {v}"
                                             for k, v in MAX_STEPS.items()) + ")")
    p.add_argument("--render-size", type=int_in(16, 2048), metavar="PX",
                   help=f"camera renders, PX x PX (default {RENDER_PX}, LeRobot's LIBERO env; "
                   "smaller renders faster and deviates from the published evaluation)")
    p.add_argument("--settle-steps", type=int_at_least(0), default=DEFAULT_SETTLE_STEPS,
                   help="zero-action steps before the policy starts (LeRobot's published "
                   "evaluation 50, OpenVLA 10)")
    p.add_argument("--image-rotation", default="180", choices=list(ROTATIONS),
                   help="how renders reach the policy: 180 as the training data, vflip, none")
    p.add_argument("--seed", type=int_in(0, 2**31 - 1), default=RUN_SEED,
                   help="run seed: each episode's env seed and flow-noise seed derive from "
                   f"(suite, task, init state, seed), so a rerun repeats it (default {RUN_SEED}"
                   ", as LeRobot's published command)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="any node parameter (config/policy.yaml), e.g. execution.blend=crossfade")
    p.add_argument("--video", default="all", choices=["all", "failures", "none"],
                   help="episode videos under OUT/videos")
    p.add_argument("--out", required=True, help="results folder; an existing ledger resumes")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar or status lines; one line per episode instead")
    add_ray_args(p, what="episodes", memory_gb=ENV_MEMORY_GB,
                 default_timeout="300 s plus 5 s per step of --max-steps")
    p.set_defaults(func=cmd_libero)
