"""``molmoact2 bench``: the host's critical path and the runtime designs, and ``--closed-loop``.

The measurements live in ``bench/``; this module parses the options, runs them and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..bench.closed_loop import ROBOTS, STRATEGIES, format_table, run_closed_loop, write_plot
from ..bench.closed_loop_scene import DELTA_UNIT_M, SCENES, TargetTrackingPolicy, make_scene
from ..bench.runtime import HOST_REPEATS, bench_variant, format_record
from ..bundle.bundle import resolve_bundles
from ..bundle.variants import VARIANTS
from ..control.execution import START_MODES
from ..control.params import MAX_FLOW_STEPS, PARAMS_BY_NAME, SEED_MAX
from ..util.optional import require
from ..util.outputs import check_file, write_file, writing
from ..util.progress import counter, progress
from .args import check_paths, example, float_in, int_at_least, int_in


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cmd_bench(args: argparse.Namespace) -> int:
    check_paths([("--json", args.json), ("--plot", args.plot)],
                [("--bundle-root", args.bundle_root)])
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:  # before the run: only a file of an earlier bench, and only with --force
            check_file(path, force=args.force, what=flag)
    if getattr(args, "closed_loop", False):
        return cmd_closed_loop(args)
    if getattr(args, "scale_out", False):
        return cmd_scale_out(args)
    from ..bench.host import bench_host, format_host
    from ..bench.verdicts import format_verdicts, verdicts

    names = args.variants or list(VARIANTS)
    started = time.perf_counter()
    load_start = _load()
    print(f"molmoact2 bench on {platform.machine()} ({os.cpu_count()} CPUs), "
          f"python {platform.python_version()}, numpy {np.__version__}; "
          f"load average {load_start}", flush=True)
    bar = counter(len(names) + 5, "bench")
    records = []
    try:
        host = bench_host(names[0] if "lp_vtp_sd" not in names else "lp_vtp_sd",
                          min(args.chunks, HOST_REPEATS), args.chunks,
                          progress=lambda label: (bar.set_description(label), bar.update()))
        print(format_host(host), flush=True)
        for name in names:
            bar.set_description(f"runtime {name}")
            record = bench_variant(VARIANTS[name], args.chunks, args.naive_chunks, args.steps)
            records.append(record)
            bar.update()
            print(format_record(record), flush=True)
    finally:
        bar.close()
    results = verdicts(host, records)
    load_end = _load()
    print(format_verdicts(results))
    print(f"load average at the end {load_end}")
    wrote = ""
    if args.json:
        payload = {
            "machine": {"arch": platform.machine(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "numpy": np.__version__,
                        "load_start": load_start, "load_end": load_end},
            "host": host,
            "variants": records,
            "verdicts": results,
        }
        write_file(args.json, json.dumps(payload, indent=2), what="--json")
        wrote = f"; wrote {args.json}"
    print(summary_line(results, names, time.perf_counter() - started) + wrote)
    return 0


def summary_line(results: list[dict], names: list[str], seconds: float) -> str:
    """The closing line: how many targets were met, which were missed, what ran, how long."""
    met = [r for r in results if r["verdict"] == "meets"]
    missed = [r["target"] for r in results if r["verdict"] == "misses"]
    skipped = [r for r in results if r["verdict"] == "skipped"]
    return (f"bench: {len(met)}/{len(results)} targets met, {len(missed)} missed"
            + (f" ({'; '.join(missed)})" if missed else "")
            + f", {len(skipped)} skipped; variants {', '.join(names)}; {seconds:.0f} s")


def register(subparsers) -> None:
    """Add ``molmoact2 bench`` to the CLI."""
    p = subparsers.add_parser(
        "bench", help="the host's critical path: preprocessing, embedding, controller, replay, "
        "runtime overhead vs its memory floor and a naive design (null sessions)",
        description="Time everything the host does per chunk around the NPU, on null sessions "
        "with the real tensor sizes,\neach comparison in the same loop, and end with one "
        "verdict per target and a summary line.\n--closed-loop instead simulates a robot "
        "executing chunks and compares the execution.blend strategies.",
        epilog=example("molmoact2 bench --variants lp_vtp_sd --chunks 20 --json bench.json",
                       "molmoact2 bench --closed-loop --bundle-root .cache/tiny-bundle"))
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS),
                   help="variants to bench (default: all)")
    p.add_argument("--chunks", type=int_in(1, 100_000), default=50,
                   help="chunks through design (a) and replay; use e.g. 10000 to watch RSS over "
                   "a long run")
    p.add_argument("--naive-chunks", type=int_in(1, 1000), default=3,
                   help="chunks through design (b)")
    p.add_argument("--steps", type=int_in(1, MAX_FLOW_STEPS),
                   help="flow steps (default: the variant's)")
    p.add_argument("--json", help="write every figure to this JSON file")
    p.add_argument("--force", action="store_true",
                   help="replace the --json and --plot files of an earlier bench (never a "
                   "file this package did not write)")
    add_arguments(p)
    g = p.add_argument_group("scale-out on Ray (--scale-out; pip install -e '.[cluster]')")
    g.add_argument("--scale-out", action="store_true",
                   help="replay the same bags on null sessions in one process and on Ray "
                   "actors side by side; scheduling overhead and the curve for N machines")
    g.add_argument("--scale-out-bags", type=int_at_least(1), default=20, help="bags to replay")
    g.add_argument("--scale-out-frames", type=int_at_least(1), default=40,
                   help="observations per bag")
    g.add_argument("--scale-out-actors", type=int_at_least(1), default=2,
                   help="Ray actors (one CPU each) on the local cluster")
    g.add_argument("--scale-out-libero", metavar="BUNDLE_ROOT",
                   help="also run LIBERO lockstep episodes with this bundle (e.g. the tiny one)")
    g.add_argument("--scale-out-episodes", type=int_at_least(1), default=4,
                   help="LIBERO episodes (libero_spatial task 0, init states 0..)")
    g.add_argument("--scale-out-max-steps", type=int_at_least(1), default=60,
                   help="policy steps per LIBERO episode")
    p.set_defaults(func=cmd_bench)


def cmd_scale_out(args: argparse.Namespace) -> int:
    """One process against Ray actors on the same replay work, then the paper curve."""
    import tempfile

    from ..bench.scale_out import bench_scale_out, format_scale_out

    load_start = _load()
    print(f"molmoact2 bench --scale-out on {platform.machine()} ({os.cpu_count()} CPUs), "
          f"python {platform.python_version()}; load average {load_start}", flush=True)
    with tempfile.TemporaryDirectory(prefix="molmoact2-scale-out-") as tmp:
        result = bench_scale_out(Path(tmp), bags=args.scale_out_bags,
                                 frames=args.scale_out_frames, actors=args.scale_out_actors,
                                 libero_root=args.scale_out_libero or "",
                                 episodes=args.scale_out_episodes,
                                 max_steps=args.scale_out_max_steps)
    result["load_average"] = {"start": load_start, "end": _load()}
    print(format_scale_out(result))
    print(f"load average at the end {result['load_average']['end']}")
    if args.json:
        write_file(args.json, json.dumps(result, indent=2), what="--json")
        print(f"wrote {args.json}")
    return 0


def make_policy(kind: str, args: argparse.Namespace, seed: int, horizon: int,
                folder: Path | None = None, robot: str = "tracking"):
    if kind == "synthetic":
        # on LIBERO's arm the rows are in its units: the motion execution.delta_scale gives
        unit_m, unit_rad = (PARAMS_BY_NAME["execution.delta_scale"].default
                            if robot == "libero" else (DELTA_UNIT_M, None))
        return TargetTrackingPolicy(horizon, args.period_ms / 1e3, seed=seed,
                                    action_type=args.action_type, delta_unit_m=unit_m,
                                    delta_unit_rad=unit_rad)
    from ..policy import Policy

    return Policy.load(folder, kind, backend="onnx", instruction="track the target", seed=seed)


def cmd_closed_loop(args: argparse.Namespace) -> int:
    # refuse bad input before a run of minutes: the bundle path and the plot's matplotlib
    bundles = dict(resolve_bundles(Path(args.bundle_root), args.variant)) if args.bundle_root \
        else {}
    if args.plot:
        require("matplotlib", "bench --closed-loop --plot")
    robots = [r for r in args.robots if r == "tracking" or args.action_type == "delta"]
    arm = None
    if "libero" in robots:
        from ..sim.libero_env import LiberoSim

        arm = LiberoSim(settle_steps=10, cameras=False)  # refuses without the sim extra
    try:
        return _closed_loop_runs(args, bundles, robots, arm)
    finally:
        if arm is not None:
            arm.close()


def _closed_loop_runs(args: argparse.Namespace, bundles: dict, robots: list[str], arm) -> int:
    started = time.perf_counter()
    results, plots = [], {}
    kinds = ["synthetic", *bundles]
    runs = [(kind, scene, robot, horizon, start, latency, blend, seed)
            for kind in kinds for scene in args.scenes for robot in robots
            for horizon in (args.horizons if kind == "synthetic" else [0])
            for start in args.start for latency in args.latencies_ms for blend in args.blends
            for seed in range(args.seed, args.seed + args.seeds)]
    for kind, scene, robot, horizon, start, latency, blend, seed in progress(
            runs, "closed loop", label=lambda r: f"{r[1]} {r[2]} {r[5]:g} ms {r[6]} seed {r[7]}"):
        policy = make_policy(kind, args, seed, horizon, bundles.get(kind), robot)
        try:
            result, trace = run_closed_loop(
                policy, blend=blend, start=start, latency_ms=latency, jitter_ms=args.jitter_ms,
                duration_s=args.duration_s, period_s=args.period_ms / 1e3, seed=seed,
                name=kind, overlap_s=args.overlap_ms / 1e3, robot=robot,
                scene=make_scene(scene, seed), arm=arm)
        finally:
            policy.close()
        results.append(result)
        if seed == args.seed:
            plots.setdefault((kind, scene, robot, horizon, start, latency), {})[blend] = trace
    print(f"closed loop: {args.duration_s:g} s per run, control period {args.period_ms:g} ms, "
          f"latency jitter ±{args.jitter_ms:g} ms, trigger chunk_consumed with "
          f"execution.overlap_s={args.overlap_ms / 1e3:g}; {args.action_type} chunks of "
          f"{', '.join(str(h) for h in args.horizons)} rows; mean ± sd over {args.seeds} seeds, "
          "whole run from t = 0; max step: largest tick-to-tick change of the command "
          "(tracking: target position, integrating and libero: its commanded step), jerk of the "
          "executed path, "
          "intent against the unguided sample from the same noise (inpainting) or the rows "
          "before blending")
    print(format_table(results), flush=True)
    if args.plot:
        first = ("synthetic", args.scenes[0], robots[0], args.horizons[0], args.start[0])
        key = first + (args.plot_latency_ms,)
        if key not in plots:
            key = first + (args.latencies_ms[0],)
        with writing(args.plot, what="--plot") as tmp:
            write_plot(plots[key], tmp, f"synthetic policy, {key[1]} scene, {key[2]} "
                       f"robot, H={key[3]}, start={key[4]}, latency {key[5]:g} ms ± "
                       f"{args.jitter_ms:g}",
                       (3.0, 6.0))
        print(f"wrote {args.plot}")
    if args.json:
        write_file(args.json, json.dumps([asdict(r) for r in results], indent=2),
                   what="--json")
        print(f"wrote {args.json}")
    print(f"bench --closed-loop: {len(results)} runs ({', '.join(kinds)}; strategies "
          f"{', '.join(args.blends)}; start {', '.join(args.start)}; latencies "
          f"{', '.join(f'{x:g}' for x in args.latencies_ms)} ms) in "
          f"{time.perf_counter() - started:.0f} s")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--closed-loop`` options of ``molmoact2 bench``."""
    g = p.add_argument_group("closed loop (--closed-loop)")
    g.add_argument("--closed-loop", action="store_true",
                   help="simulate a robot executing chunks: blend strategies vs latency")
    g.add_argument("--latencies-ms", type=float_in(0.0, 60_000.0), nargs="+",
                   default=[100, 300, 600, 900], help="inference latencies to simulate")
    g.add_argument("--jitter-ms", type=float_in(0.0, 60_000.0), default=30.0,
                   help="uniform latency jitter, plus or minus")
    g.add_argument("--blends", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                   help="strategies: execution.blend values, pigdm (inpaint with ΠGDM "
                   "guidance), hold (keep the old chunk over the overlap: a baseline)")
    g.add_argument("--scenes", nargs="+", choices=SCENES, default=list(SCENES),
                   help="waypoints (still targets that jump to the next point every 2.5 s, as "
                   "a LIBERO task's phases) and/or lissajous (a target that keeps moving)")
    g.add_argument("--start", nargs="+", choices=START_MODES, default=["auto"],
                   help="execution.start modes to compare")
    g.add_argument("--robots", nargs="+", choices=ROBOTS, default=["tracking", "integrating"],
                   help="tracking (follows the JointTrajectory), integrating (applies delta "
                   "rows), libero (LIBERO's arm under its OSC_POSE controller, physics only; "
                   "the sim extra; a run costs far more than on the simulated robots)")
    g.add_argument("--action-type", choices=("delta", "absolute"), default="delta",
                   help="what the synthetic policy's rows are (LIBERO: delta)")
    g.add_argument("--duration-s", type=float_in(0.0, 3600.0, low_open=True), default=20.0,
                   help="simulated seconds per run")
    g.add_argument("--period-ms", type=float_in(0.0, 10_000.0, low_open=True), default=50.0,
                   help="control period of the simulated robot")
    g.add_argument("--overlap-ms", type=float_in(0.0, 10_000.0), default=100.0,
                   help="execution.overlap_s: chunk left when the next one arrives")
    g.add_argument("--horizons", type=int_in(1, 1000), nargs="+", default=[10, 20],
                   help="synthetic policy chunk rows (LIBERO: 10)")
    g.add_argument("--seed", type=int_in(0, SEED_MAX), default=0,
                   help="first seed: each strategy runs seeds SEED..SEED+SEEDS-1, each "
                   "seeding the scene and the policy's noise")
    g.add_argument("--seeds", type=int_in(1, 1000), default=3,
                   help="seeds per strategy; the table gives mean ± sd over them")
    g.add_argument("--bundle-root", help="also run a bundle: a variant's folder, or a root with "
                   "one folder per variant (resolved as every command resolves BUNDLE)")
    g.add_argument("--variant", choices=list(VARIANTS),
                   help="the variant of --bundle-root to run (default: every variant found)")
    g.add_argument("--plot", help="write the actions-around-switches plot (PNG; matplotlib)")
    g.add_argument("--plot-latency-ms", type=float_in(0.0, 60_000.0), default=300.0,
                   help="the latency whose run the plot shows")
