"""``molmoact2``: run, check and build MolmoAct2-LIBERO bundles without ROS."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from .. import __version__
from ..errors import MolmoActError
from ..host.jit import switched_off as numba_switched_off
from ..runtime.appbuilder import CHOICES as APPBUILDER_CHOICES
from ..runtime.appbuilder import ENV as APPBUILDER_ENV
from ..runtime.appbuilder import check_installed_for_htp, use_test_fake
from ..util.threads import threads_from_env
from .args import HelpFormatter, Parser

#: Modules with a ``register(subparsers)`` function, each adding its command(s).
COMMAND_MODULES = ("demo", "parity", "conventions", "tiny_bundle", "export_host",
                   "bench", "doctor", "replay", "device_report", "libero", "compare")
#: How ``molmoact2 --help`` groups the commands (any other registered command goes last).
GROUPS = {
    "run": ("demo", "replay", "bench", "libero"),
    "check": ("parity", "compare", "conventions", "doctor", "device-report"),
    "bundle tools": ("tiny-bundle", "export-host", "trace-to-bag"),
}
EPILOG = f"""\
exit status: 0 ok; 1 a check failed (parity, conventions, doctor, replay --golden, compare) or an
unexpected error; 2 bad input (arguments, missing files, a missing optional dependency).

HTP path off the board: --appbuilder fake (or {APPBUILDER_ENV}=fake) makes the HTP workers
import the test fake of qai_appbuilder from tests/fake_qai_appbuilder (a source checkout),
which runs the tiny bundles' stand-in contexts with ONNX Runtime; outputs then say
"qai_appbuilder: test fake". Example: molmoact2 --appbuilder fake parity .cache/tiny-bundle
--backend htp"""


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
        module = __import__(f"molmoact2_ros.cli.{name}", fromlist=["register"])
        module.register(sub)
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
        numba_switched_off()  # MOLMOACT2_NUMBA: on/off words only
        threads_from_env()  # MOLMOACT2_THREADS: a thread count
    except MolmoActError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.appbuilder == "fake":
            print(f"qai_appbuilder: test fake ({use_test_fake()})", file=sys.stderr)
        if getattr(args, "backend", None) == "htp":
            check_installed_for_htp()
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
