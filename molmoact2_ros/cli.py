"""``molmoact2``: run, check and build MolmoAct2-LIBERO bundles without ROS."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .appbuilder import CHOICES as APPBUILDER_CHOICES
from .appbuilder import ENV as APPBUILDER_ENV
from .appbuilder import use_test_fake
from .bundle import bundle_parameters
from .cli_args import HelpFormatter, Parser, float_in, int_at_least
from .errors import MolmoActError
from .variants import VARIANTS

#: Modules with a ``register(subparsers)`` function, each adding its command(s).
COMMAND_MODULES = ("demo", "parity", "convention_check", "tiny_bundle", "export_host",
                   "bench", "doctor")
#: How ``molmoact2 --help`` groups the commands (any other registered command goes last).
GROUPS = {
    "run": ("demo", "replay", "bench"),
    "check": ("parity", "conventions", "doctor", "device-report"),
    "bundle tools": ("tiny-bundle", "export-host", "trace-to-bag"),
}
EPILOG = f"""\
exit status: 0 ok; 1 a check failed (parity, conventions, doctor, replay --golden) or an
unexpected error; 2 bad input (arguments, missing files, a missing optional dependency).

HTP path off the board: --appbuilder fake (or {APPBUILDER_ENV}=fake) makes the HTP workers
import the test fake of qai_appbuilder from tests/fake_qai_appbuilder (a source checkout),
which runs the tiny bundles' stand-in contexts with ONNX Runtime; outputs then say
"qai_appbuilder: test fake". Example: molmoact2 --appbuilder fake parity .cache/tiny-bundle
--backend htp"""


def _parse_value(default, text: str):
    """Parse ``--set NAME=VALUE`` by the parameter's default type (lists comma-separated)."""
    if isinstance(default, bool):
        return text.lower() in ("1", "true", "yes", "on")
    if isinstance(default, list):
        kind = type(default[0]) if default else str
        return [kind(x) for x in text.split(",") if x]
    return type(default)(text)


def cmd_replay(args: argparse.Namespace) -> int:
    from .golden import compare, format_table, load_npz
    from .params import Settings, validate_changes
    from .replay import ChunkBagWriter, replay

    changes = {"variant": args.variant, "backend": args.backend, "seed": args.seed,
               "flow_steps": args.flow_steps, "instruction": args.instruction,
               "max_observation_age_s": args.max_age}
    changes.update(bundle_parameters(args.bundle_root))
    for item in args.set or []:
        key, _, value = item.partition("=")
        if key not in Settings().values:
            raise MolmoActError(f"--set {item!r}: unknown parameter {key!r}; the parameters "
                                "are listed in config/policy.yaml")
        try:
            changes[key] = _parse_value(Settings().values[key], value)
        except ValueError:
            raise MolmoActError(f"--set {item!r}: {value!r} is not a valid value for "
                                f"{key}") from None
    ok, reason = validate_changes(changes, Settings())
    if not ok:
        raise MolmoActError(reason)
    settings = Settings().with_changes(changes)
    writer = ChunkBagWriter(Path(args.out)) if args.out else None
    try:
        result = replay(Path(args.bag), settings, on_published=writer.write if writer else None)
    finally:
        if writer:
            writer.close()
    print(f"{result.synced} synchronised observations, {len(result.published)} chunks, "
          f"drops {result.drops or 'none'}")
    if args.out:
        print(f"wrote {len(result.published)} chunks to {args.out}")
    if args.golden:
        trace = load_npz(Path(args.golden), ["chunk"])
        if not result.published:
            print("no chunk to compare")
            return 1
        row = compare("replay", "first chunk", result.published[0].actions, trace["chunk"])
        print(format_table([row]))
        return 0 if row.passed else 1
    return 0


def cmd_trace_to_bag(args: argparse.Namespace) -> int:
    from .golden import load_npz
    from .params import Settings
    from .replay import write_observation_bag

    trace = load_npz(Path(args.trace), ["image_primary", "image_wrist", "state"])
    frames = [(10**9 + i * int(args.period_s * 1e9), trace["image_primary"],
               trace["image_wrist"], trace["state"]) for i in range(args.frames)]
    write_observation_bag(Path(args.out), frames, Settings(), mcap=args.mcap)
    print(f"wrote {args.frames} observations to {args.out}")
    return 0


def _register_replay(sub) -> None:
    """replay and trace-to-bag (kept here until they move to their own module)."""
    p = sub.add_parser("replay", help="replay a rosbag2 through the node logic (no ROS)")
    p.add_argument("bag", help="rosbag2 folder (sqlite3 or mcap) with the camera and state topics")
    p.add_argument("--bundle-root", required=True,
                   help="a root with one folder per variant, or one variant's folder")
    p.add_argument("--variant", default="grid_sampler", choices=list(VARIANTS),
                   help="variant to run")
    p.add_argument("--backend", default="onnx", choices=["onnx", "htp"],
                   help="onnx: ONNX Runtime here; htp: resident workers (--appbuilder fake "
                   "for the test fake)")
    p.add_argument("--instruction", required=True, help="task instruction")
    p.add_argument("--seed", type=int, default=-1, help="noise seed; -1 = random")
    p.add_argument("--flow-steps", type=int, default=0,
                   help="flow-matching steps; 0 = the variant default")
    p.add_argument("--max-age", type=float, default=0.5,
                   help="max_observation_age_s: older observations are skipped (bag clock)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="any other node parameter (config/policy.yaml), repeatable")
    p.add_argument("--out", help="write the chunks to this new bag (mcap)")
    p.add_argument("--golden", help="trace npz whose chunk the first chunk must match")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("trace-to-bag", help="turn a golden trace into a replayable bag")
    p.add_argument("trace", help="golden/e2e_trace*.npz of a bundle")
    p.add_argument("out", help="new rosbag2 folder to write")
    p.add_argument("--frames", type=int_at_least(1), default=3, help="observations to write")
    p.add_argument("--period-s", type=float_in(0.0, 3600.0, low_open=True), default=0.5,
                   help="seconds between observations")
    p.add_argument("--mcap", action="store_true", help="write mcap instead of sqlite3")
    p.set_defaults(func=cmd_trace_to_bag)


def _grouped_commands(sub: argparse._SubParsersAction) -> str:
    helps = {a.dest: a.help or "" for a in getattr(sub, "_choices_actions", [])}
    listed, lines = set(), []
    for group, names in {**GROUPS, "other": tuple(sorted(helps))}.items():
        present = [n for n in names if n in helps and n not in listed]
        if present:
            lines.append(f"{group}:")
            lines += [f"  {n:<14} {helps[n]}" for n in present]
            listed.update(present)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="molmoact2",
                    description="Run, check and build MolmoAct2-LIBERO bundles without ROS.",
                    usage="molmoact2 [--appbuilder {installed,fake}] [--debug] COMMAND ...")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an unexpected error")
    parser.add_argument("--appbuilder", choices=list(APPBUILDER_CHOICES),
                        default=os.environ.get(APPBUILDER_ENV, "installed"),
                        help="which qai_appbuilder the HTP workers import (fake: the test fake "
                        f"of a source checkout; env {APPBUILDER_ENV})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, prog="molmoact2",
                                parser_class=Parser, help=argparse.SUPPRESS)
    for name in COMMAND_MODULES:
        module = __import__(f"molmoact2_ros.{name}", fromlist=["register"])
        module.register(sub)
    _register_replay(sub)
    parser.epilog = "commands (molmoact2 COMMAND --help for options):\n" + \
        _grouped_commands(sub) + "\n\n" + EPILOG
    parser.formatter_class = HelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 check failed, 2 bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 0
    if args.appbuilder not in APPBUILDER_CHOICES:  # a bad environment value skips argparse
        print(f"error: {APPBUILDER_ENV}={args.appbuilder!r}: use one of "
              f"{', '.join(APPBUILDER_CHOICES)}", file=sys.stderr)
        return 2
    try:
        if args.appbuilder == "fake":
            print(f"qai_appbuilder: test fake ({use_test_fake()})", file=sys.stderr)
        return int(args.func(args) or 0)
    except MolmoActError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"error: {args.command} interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # unreadable input, an output path that cannot be written, ...
        if args.debug:
            traceback.print_exc()
        print(f"error: {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: one line, the traceback only with --debug
        if args.debug:
            traceback.print_exc()
        print(f"error: {args.command} failed unexpectedly: {type(exc).__name__}: {exc} "
              "(rerun with molmoact2 --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
