"""``molmoact2 doctor BUNDLE``: can this machine run the bundle on the HTP? One line per check.

The checks live in ``firstrun/`` (``machine.py``: platform, qai_appbuilder, QNN runtime,
FastRPC, library paths, DSP arch, host kernels; ``doctor.py``: every context file, then in
spawned workers each context's load and contract, golden parity and latency); this module
parses the command line and prints them. Every FAIL says how to fix it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import MolmoActError


def cmd_doctor(args: argparse.Namespace) -> int:
    folder = Path(args.bundle).expanduser()
    if not folder.exists():  # a typo, not a machine problem: bad input, exit 2
        raise MolmoActError(f"bundle path {folder} does not exist; give a variant's bundle "
                            "folder or a root of variant folders (molmoact2 tiny-bundle DIR "
                            "writes tiny ones)")
    from ..firstrun.doctor import run_checks
    from ..firstrun.machine import Check
    from ..firstrun.status import FAIL

    try:
        checks = run_checks(Path(args.bundle), args.variant, dict(args.suffix or []),
                            args.timeout, args.repeats, args.ignore_bundle_libs)
    except Exception as exc:  # doctor must never end in a traceback
        checks = [Check("doctor", FAIL, f"{type(exc).__name__}: {exc}", "report this")]
    for check in checks:
        print(check.format(), flush=True)
    failed = [c for c in checks if c.status == FAIL]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks pass or skip; "
          f"{len(failed)} fail" + (": " + ", ".join(c.name for c in failed) if failed else ""))
    return 1 if failed else 0


def register(subparsers) -> None:
    """Add ``molmoact2 doctor`` to the CLI."""
    from ..bundle.variants import VARIANTS
    from .args import example, float_in, int_in, parse_suffix

    p = subparsers.add_parser(
        "doctor", help="check this machine and a bundle for the HTP runtime",
        description="One PASS/FAIL/SKIP line per check, each FAIL with its fix: platform, "
        "qai_appbuilder and its QNN runtime,\nlibcdsprpc.so and the FastRPC nodes, library "
        "paths, host kernels, every context file, then in spawned\nworkers each context's "
        "load and contract, golden parity and latency. Exit 1 if a check fails,\n2 if the "
        "bundle path does not exist.",
        epilog=example("molmoact2 doctor /data/molmoact2/grid_sampler",
                       "molmoact2 --appbuilder fake doctor .cache/tiny-bundle --variant "
                       "grid_sampler"))
    p.add_argument("bundle", help="a variant's bundle folder, or a root of variant folders "
                   "(every variant found is checked)")
    p.add_argument("--variant", choices=list(VARIANTS),
                   help="check only this variant of a root")
    p.add_argument("--suffix", type=parse_suffix, action="append", metavar="GROUP=SUFFIX",
                   help="context suffix per group (vision, llm, action), e.g. llm=_w4a16")
    p.add_argument("--timeout", type=float_in(0.0, 3600.0, low_open=True), default=60.0,
                   help="deadline per call, seconds")
    p.add_argument("--repeats", type=int_in(1, 1000), default=5,
                   help="chunks timed for the latency line")
    p.add_argument("--ignore-bundle-libs", action="store_true",
                   help="leave a bundle's qnn_libs/ and dsp_libs/ unused (the wheel's own QNN "
                   "runtime serves), e.g. a seed workspace's QAIRT 2.47 folders")
    p.set_defaults(func=cmd_doctor)
