"""``molmoact2 replay`` and ``molmoact2 trace-to-bag``: golden chunk bags across machines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle.variants import VARIANTS
from ..control.params import MAX_FLOW_STEPS, SEED_MAX
from ..errors import MolmoActError
from ..replay.run_settings import golden_and_settings
from ..runtime.appbuilder import describe
from ..util.progress import counter
from ..util.signals import SIGNAL_EXIT, StopSignals
from .args import check_paths, check_report_dir, example, float_in, int_in
from .ray_args import add_ray_args


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse outputs that are, hold or lie inside an input, and existing outputs (unless
    --force), before anything runs."""
    from ..replay.bagio import check_output

    check_paths([("--record bag", args.record), ("--report", args.report)],
                [("bag", args.bag), ("--golden", args.golden),
                 ("--bundle-root", args.bundle_root)])
    if args.record:
        check_output(Path(args.record), args.force, "--record bag")
    check_report_dir(args.report, args.force, "replay")


def cmd_replay(args: argparse.Namespace) -> int:
    from .ray_args import fix_ray_address
    from .replay_many import cmd_replay_many, is_many

    fix_ray_address(args, "bags")
    if not args.bags:
        raise MolmoActError("replay needs a bag: molmoact2 replay BAG --bundle-root ROOT ...")
    # one bag or many: no output may be, hold or lie inside an input (before anything runs)
    check_paths([("--record-dir", args.record_dir), ("--record bag", args.record),
                 ("--report", args.report)],
                [*(("bag", bag) for bag in args.bags), ("--golden", args.golden),
                 ("--golden-dir", args.golden_dir), ("--bundle-root", args.bundle_root)])
    if is_many(args):
        return cmd_replay_many(args)
    args.bag = args.bags[0]
    return _replay_one(args)


def _replay_one(args: argparse.Namespace) -> int:
    from ..control.controller import load_policy
    from ..replay.bagio import prepare_output
    from ..replay.chunk_match import format_summary, match_chunks
    from ..replay.chunkbag import (
        ChunkBagWriter,
        action_scale,
        noise_stream_problem,
        run_info,
        scale_of,
    )
    from ..replay.replay import replay

    check_outputs(args)  # before reading anything: outputs never replace inputs
    golden, trace, golden_settings, settings, tol, differences = golden_and_settings(args)
    if differences:
        print("settings differ from the golden's: " + "; ".join(differences))
    noise = noise_stream_problem(golden_settings) if trace is None else ""
    if noise:
        print(noise)

    factory = load_policy
    if trace is not None:
        def factory(s):  # a trace fixes its noise: every chunk uses it
            policy = load_policy(s)
            policy.fixed_noise = np.asarray(trace["noise"], np.float32)
            return policy

    state: dict[str, Any] = {"writer": None, "bar": None}

    def on_active(controller, bag_topics) -> None:
        state["bar"] = counter(bag_topics.total, "replay", unit="msg",
                               enabled=not args.no_progress,
                               every=max(1, -(-bag_topics.total // 10)))
        if args.record:
            prepare_output(Path(args.record), force=args.force, what="--record bag")
            steps = getattr(controller.policy, "flow_steps", settings.flow_steps())
            norm = getattr(getattr(controller.policy, "norm_stats", None), "action", None)
            state["writer"] = ChunkBagWriter(
                Path(args.record), run_info(settings, flow_steps=steps,
                                            source_bag=Path(args.bag).name,
                                            scale=scale_of(norm) if norm is not None else None),
                mcap=args.storage == "mcap", version=args.bag_version)

    def on_published(out, log_ns: int) -> None:
        if state["writer"] is not None:
            state["writer"].write(out, log_ns)
            if state["writer"].count == 1:  # the run is producing: say so once, right away
                print(f"recording to {args.record}: first chunk written", flush=True)

    with StopSignals() as signals:
        try:
            result = replay(
                Path(args.bag), settings, policy_factory=factory, on_published=on_published,
                on_active=on_active, namespace=args.namespace,
                on_message=lambda: state["bar"] and state["bar"].update(1),
                should_stop=lambda: signals.received is not None)
        finally:
            if state["bar"] is not None:
                state["bar"].close()
            if state["writer"] is not None:
                state["writer"].close()
    steps = result.published[0].chunk.flow_steps if result.published else settings.flow_steps()
    print(f"replayed {args.bag}: {result.messages} messages, {result.synced} synchronised "
          f"observations, {len(result.published)} chunks ({settings['variant']}, "
          f"{describe(settings['backend'])}, {steps} flow steps, seed {settings['seed']})")
    for key, count in sorted(result.drops.items()):
        print(f"dropped {count} x {key}: {result.reasons.get(key, key)}")
    summary = None
    if golden is not None:
        produced = {p.chunk.observation_stamp_ns: p.actions for p in result.published}
        if trace is not None:
            chunks = {stamp: np.asarray(trace["chunk"], np.float32) for stamp in produced}
            names = list(settings["action_names"])
        else:
            chunks, names = golden.chunks, golden.action_names or list(settings["action_names"])
        scale = action_scale(golden_settings, settings["variant"], args.bundle_root)
        summary = match_chunks(produced, chunks, tol, min_produced=args.min_produced,
                               scale=scale)
        print(format_summary(summary, names))
    if args.report:
        from ..replay.report import report_from_replay

        files = report_from_replay(Path(args.report), result, settings, summary,
                                   golden=None if golden is None or trace is not None
                                   else golden, differences=differences,
                                   noise_problem=noise)
        print(f"report: {', '.join(str(f) for f in files)}")
    if state["writer"] is not None:
        print(f"chunk bag: {args.record} ({state['writer'].count} chunks)")
    if result.interrupted:
        print(f"interrupted by signal {signals.received}; the output bag was closed",
              file=sys.stderr)
        return SIGNAL_EXIT.get(signals.received, 1)
    if summary is not None:
        return 0 if summary.ok else 1
    return 0


def parse_atol(text: str):
    """``--atol``: one value, or one per action dimension separated by commas."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number or comma-separated numbers "
                                         "(one per action dimension)") from None
    if not values or any(not np.isfinite(v) or v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: tolerances are finite and >= 0")
    return values[0] if len(values) == 1 else tuple(values)


def add_tolerance_args(p) -> None:
    """The chunk limits ``replay --golden`` and ``compare`` share (normalised action units)."""
    p.add_argument("--min-cosine", type=float_in(-1.0, 1.0),
                   help="per chunk (default 0.9999, htp 0.999)")
    p.add_argument("--atol", type=parse_atol,
                   help="normalised units, one value or one per action dimension "
                   "(default 1e-3; htp: twice the measured fp16 spread per dimension, "
                   "docs/host_glue.md §13)")
    p.add_argument("--rtol", type=float_in(0.0, 1e9), help="times |golden| (default 0)")
    p.add_argument("--min-within", type=float_in(0.0, 1.0),
                   help="fraction within atol + rtol*|golden| per chunk (default 1.0, htp 0.95)")


def cmd_trace_to_bag(args: argparse.Namespace) -> int:
    from ..bundle.golden import load_npz
    from ..control.params import Settings
    from ..replay.bagio import check_output, prepare_output
    from ..replay.replay import write_observation_bag

    check_paths([("output bag", args.out)], [("trace", args.trace)])
    trace = load_npz(Path(args.trace), ["image_primary", "image_wrist", "state"],
                     what="trace-to-bag")
    out = check_output(Path(args.out), args.force)
    prepare_output(out, args.force)
    primary, wrist = trace["image_primary"], trace["image_wrist"]
    if args.swap_cameras:
        primary, wrist = wrist, primary
    frames = [(10**9 + i * int(args.period_s * 1e9), primary, wrist, trace["state"])
              for i in range(args.frames)]
    write_observation_bag(out, frames, Settings(), mcap=args.mcap, compressed=args.compressed,
                          version=args.bag_version, namespace=args.namespace)
    print(f"wrote {args.frames} observations to {out}")
    return 0


def register(sub) -> None:
    """Add the replay and trace-to-bag commands to the ``molmoact2`` parser."""
    p = sub.add_parser(
        "replay", help="replay a rosbag2 through the node logic (no ROS); record golden chunks "
        "or check against them",
        description="Run a rosbag2 (sqlite3 or mcap) through the node's own synchroniser and "
        "controller on the bag's\nclock, one inference per synchronised observation. --record "
        "writes every chunk and the run's\nsettings to a new bag; --golden matches every chunk "
        "with the golden's chunk of the same stamp\n(exit 1 on a mismatch). Progress: a bar on "
        "a terminal, else about ten status lines on stderr.\nSeveral bags (--golden-dir, "
        "--record-dir) run one after another here, or on Ray actors with --ray\n"
        "(docs/scale_out.md).",
        epilog=example("molmoact2 replay robot_bag --bundle-root /data/molmoact2 --variant "
                       "grid_sampler --instruction 'put the bowl on the plate' --record golden_bag",
                       "molmoact2 replay robot_bag --bundle-root /data/molmoact2 --backend htp "
                       "--golden golden_bag --report report/"))
    p.add_argument("bags", nargs="*", metavar="BAG",
                   help="rosbag2 folder (or .mcap) with the camera and joint topics; several "
                   "with --golden-dir or --record-dir (one golden per bag name)")
    p.add_argument("--bundle-root", required=True,
                   help="a root with one folder per variant, or one variant's folder")
    p.add_argument("--variant", choices=list(VARIANTS), help="default: the golden's, else "
                   "grid_sampler")
    p.add_argument("--backend", default="onnx", choices=["onnx", "htp"],
                   help="onnx: ONNX Runtime here; htp: resident workers (--appbuilder fake "
                   "for the test fake)")
    p.add_argument("--instruction", help="default: the golden's")
    p.add_argument("--seed", type=int_in(-1, SEED_MAX),
                   help="noise seed, -1 random (default: the golden's, else 0)")
    p.add_argument("--flow-steps", type=int_in(0, MAX_FLOW_STEPS),
                   help="0: the variant's (default: the golden's, else the variant's)")
    p.add_argument("--max-age", type=float_in(0.0, 1e6, low_open=True), default=0.5,
                   help="max_observation_age_s: older observations are skipped (bag clock)")
    p.add_argument("--namespace", default="", help="node namespace the bag's topics are under")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="any other node parameter (config/policy.yaml), repeatable")
    p.add_argument("--record", "--out", dest="record", metavar="GOLDEN",
                   help="write every chunk (+ settings) to this new bag")
    p.add_argument("--storage", default="mcap", choices=["mcap", "sqlite3"],
                   help="storage plugin of the bags written")
    p.add_argument("--bag-version", type=int, default=8, choices=[8, 9],
                   help="8: read by Humble and Jazzy (default); 9: Jazzy only")
    p.add_argument("--golden", help="chunk bag from --record (or a trace npz) to match "
                   "every chunk against, by observation stamp")
    add_tolerance_args(p)
    p.add_argument("--min-produced", type=float_in(0.0, 1.0), default=1.0,
                   help="fraction of golden chunks the run must produce")
    p.add_argument("--golden-dir", metavar="DIR", help="check each BAG against DIR/NAME, the "
                   "golden chunk bag of its name (a bag folder's name, an .mcap file's stem)")
    p.add_argument("--record-dir", metavar="DIR", help="record each BAG's golden to DIR/NAME")
    p.add_argument("--report", metavar="DIR", help="write summary.json and PNG plots here "
                   "(several bags: the merged summary.json and summary.md, and the "
                   "verdicts.jsonl ledger an interrupted run resumes from)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar or status lines")
    add_ray_args(p, what="bags", default_timeout="300 s plus 60 s per MiB of the bag")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser(
        "trace-to-bag", help="turn a golden trace into a replayable bag",
        description="Write a rosbag2 holding a golden trace's observation (both cameras and the "
        "joint state) repeated\n--frames times, raw or compressed, for replay --golden TRACE.npz "
        "or a first replay without a robot.",
        epilog=example("molmoact2 trace-to-bag .cache/tiny-bundle/grid_sampler/golden/"
                       "e2e_trace.npz obs_bag --frames 6 --compressed jpeg"))
    p.add_argument("trace", help="golden/e2e_trace*.npz of a bundle")
    p.add_argument("out", help="new rosbag2 folder to write")
    p.add_argument("--frames", type=int_in(1, 100_000), default=3, help="observations to write")
    p.add_argument("--period-s", type=float_in(0.0, 3600.0, low_open=True), default=0.5,
                   help="seconds between observations")
    p.add_argument("--mcap", action="store_true", help="write mcap instead of sqlite3")
    p.add_argument("--compressed", default="", choices=["", "jpeg", "png"],
                   help="CompressedImage on <topic>/compressed instead of raw rgb8")
    p.add_argument("--bag-version", type=int, default=8, choices=[8, 9],
                   help="8: read by Humble and Jazzy; 9: Jazzy only")
    p.add_argument("--namespace", default="", help="node namespace of the topics written")
    p.add_argument("--swap-cameras", action="store_true", help="primary and wrist swapped")
    p.add_argument("--force", action="store_true", help="overwrite an existing output bag")
    p.set_defaults(func=cmd_trace_to_bag)
