"""``molmoact2 device-report BUNDLE_ROOT``: one Markdown + JSON report of a first run on the board.

For whoever first has the IQ-9075: platform facts (OS, glibc, kernel, QNN and qai_appbuilder
versions), doctor's machine checks, then for every variant under BUNDLE_ROOT and every suffix
choice it ships (fp16; each quantised suffix for vision, the LLM and action_step alone; all
together): the load (time and peak RSS per worker, fixed-point tensors, NPU sessions opened),
per-component golden parity on the HTP against per-component limits, the seed workspace's own
end-to-end check (``trace.json`` + ``step0_boundary.npz``), end-to-end parity over the traces
when ``host/`` is there, and latency per component (the library's NPU execute time apart from
the copies and float conversions around it), then one A/B table per variant with the fastest
choice that passes parity marked.

The report is written before the first section and rewritten after every section, so a crash
leaves every finished section on disk; every section and step is guarded and a failure is
recorded with why. What cannot run here is marked "not run" with why. The report itself is
built in ``firstrun/`` (``report.py`` and the modules it names); this module parses the command
line and prints where the report went.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import BundleError


def cmd_device_report(args: argparse.Namespace) -> int:
    from ..bundle.bundle import resolve_bundles
    from ..firstrun.report import ReportFiles, build_report, failed
    from ..firstrun.seed import SEED_TRACE, read_seed_trace
    from .args import SUFFIX_ENV

    if (args.bag is None) != (args.golden is None):
        raise BundleError("give --bag and --golden together: the bag recorded on the robot and "
                          "the golden chunk bag made from it with 'replay --record'")
    # everything that can be wrong with the command line is found before the first section
    from .args import check_paths

    check_paths([("--out", args.out), ("--out JSON", Path(args.out).with_suffix(".json"))],
                [("bundle root", args.bundle_root), ("--bag", args.bag),
                 ("--golden", args.golden)])
    root = Path(args.bundle_root).expanduser()
    for _, folder in resolve_bundles(root, args.variant):  # a seed's trace.json: its numbers
        if (folder / "golden" / SEED_TRACE).is_file():
            read_seed_trace(folder / "golden" / SEED_TRACE)
    files = ReportFiles(Path(args.out).expanduser(), args.force)
    bag = golden = None
    if args.bag is not None:
        from ..firstrun.report import golden_changes

        bag, golden = Path(args.bag).expanduser(), Path(args.golden).expanduser()
        if not bag.exists():
            raise BundleError(f"--bag {bag} does not exist")
        golden_changes(root, golden)  # a golden this root cannot replay: refused now, not last
    env = {v: os.environ[v] for v in SUFFIX_ENV if v in os.environ}
    if env:
        print("notice: " + ", ".join(f"{k}={v!r}" for k, v in env.items()) + " (the reference "
              "runtime's switches) are not needed here: the report runs every suffix choice "
              "(fp16, each group's quantised suffix alone, all together) and marks the fastest "
              "that passes; set it on the node with context_suffix.vision|llm|action",
              file=sys.stderr)

    def say(line: str) -> None:
        print(f"device-report {line}", file=sys.stderr, flush=True)

    report = build_report(root, args.chunks, args.timeout, bag=bag, golden=golden,
                          variant=args.variant, ignore_bundle_libs=args.ignore_bundle_libs,
                          choices=args.choices, perf_profile=args.perf_profile,
                          load_order=args.load_order, files=files, progress=say)
    bad = failed(report)
    print(f"wrote {files.markdown} and {files.json}: {len(report['sections'])} sections, "
          + (f"{len(bad)} failed: {', '.join(bad)}" if bad else "nothing failed"))
    return 1 if bad else 0


def register(subparsers) -> None:
    """Add ``molmoact2 device-report`` to the CLI."""
    from ..bundle.variants import VARIANTS
    from ..firstrun.report import MIN_CHUNKS
    from ..runtime.supervisor import LOAD_ORDERS
    from .args import example, float_in, int_at_least

    p = subparsers.add_parser(
        "device-report", help="one Markdown + JSON report of this machine and the bundles",
        description="For a first run on the board: platform facts, doctor's machine checks, "
        "then for every variant and\nsuffix choice under BUNDLE_ROOT (fp16, each group's "
        "quantised suffix alone, all together) the load,\ncomponent parity, the seed's and the "
        "traces' end-to-end checks and the latency table, and a\nsuffix A/B table; with "
        "--bag/--golden also a replay against a golden chunk bag. The report is\nwritten "
        "before the first section and after each; one status line per section on stderr.\n"
        "Exit 1 if anything that ran failed.",
        epilog=example("molmoact2 device-report /data/molmoact2 --out report.md",
                       "molmoact2 device-report SEED_WS --variant grid_sampler "
                       "--ignore-bundle-libs",
                       "molmoact2 --appbuilder fake device-report .cache/tiny-bundle"))
    p.add_argument("bundle_root", help="folder with one bundle per variant, or one bundle "
                   "(a seed workspace without bundle.json needs --variant)")
    p.add_argument("--variant", choices=list(VARIANTS), default=None,
                   help="the variant of a bundle folder without bundle.json, or the one variant "
                   "of a root to report on (default: every variant found)")
    p.add_argument("--out", default="device-report.md",
                   help="Markdown file; the JSON twin is OUT.json next to it")
    p.add_argument("--force", action="store_true",
                   help="replace OUT and OUT.json when they exist")
    p.add_argument("--ignore-bundle-libs", action="store_true",
                   help="leave a bundle's qnn_libs/ and dsp_libs/ unused (the wheel's own QNN "
                   "runtime serves), e.g. a seed workspace's QAIRT 2.47 folders under the "
                   "2.51.40 wheel")
    p.add_argument("--choices", choices=("all", "sets"), default="all",
                   help="suffix choices per variant: all (fp16, each group's quantised suffix "
                   "alone, all together) or sets (fp16 and whole quantised sets only)")
    p.add_argument("--chunks", type=int_at_least(MIN_CHUNKS), default=MIN_CHUNKS,
                   help="chunks timed per section (at least 20, for a p95)")
    p.add_argument("--timeout", type=float_in(0.0, 3600.0, low_open=True), default=60.0,
                   help="deadline per worker call, s")
    p.add_argument("--perf-profile", choices=("BURST", "HIGH_PERFORMANCE", "DEFAULT"),
                   default="BURST", help="the HTP performance vote of every worker")
    p.add_argument("--load-order", choices=list(LOAD_ORDERS), default="parallel",
                   help="how the workers load their contexts (sequential: largest first)")
    p.add_argument("--bag", help="a bag recorded on the robot, replayed on the HTP (with --golden)")
    p.add_argument("--golden", help="the golden chunk bag made from --bag on a workstation "
                   "('molmoact2 replay BAG --backend onnx --record GOLDEN')")
    p.set_defaults(func=cmd_device_report)
