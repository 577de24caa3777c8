"""``molmoact2 parity``: golden parity of a bundle per session and end to end, one table each."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bundle.bundle import resolve_bundles
from ..bundle.variants import COMPONENTS
from ..runtime.appbuilder import describe
from ..util.progress import progress


def cmd_parity(args: argparse.Namespace) -> int:
    from ..bundle.bundle import Suffixes
    from ..bundle.golden import TRACE_FILES, component_parity, format_table
    from ..policy import Policy, e2e_parity

    total, failed_rows, names = 0, 0, []
    from .args import suffixes_from_env

    suffixes = Suffixes.from_mapping(suffixes_from_env(args.suffix))
    for name, path in resolve_bundles(Path(args.bundle), args.variant):
        names.append(name)
        tol = {"min_cosine": args.min_cosine}
        traces = [t for t in TRACE_FILES if (path / "golden" / t).is_file()]
        rows = []
        with Policy.load(path, name, backend=args.backend, suffixes=suffixes) as policy:
            contracts = policy.bundle.variant.contracts(
                euler_in_graph=policy.conventions.euler_in_graph)
            for stage in progress([*COMPONENTS, *traces], f"parity {name}"):
                if stage in COMPONENTS:
                    rows += component_parity(path / "golden", policy.pipeline.run_component,
                                             contracts, components=[stage], **tol)
                else:
                    rows += e2e_parity(policy, path / "golden" / stage, **tol)
        print(f"== {name} ({describe(args.backend)}) {path}")
        print(format_table(rows))
        failed = [r for r in rows if not r.passed]
        print(f"{len(rows) - len(failed)}/{len(rows)} rows pass")
        total += len(rows)
        failed_rows += len(failed)
    verdict = "PASS" if not failed_rows else "FAIL"
    print(f"parity: {verdict}: {total - failed_rows}/{total} rows pass for {', '.join(names)} "
          f"on {describe(args.backend)}, min cosine {args.min_cosine}")
    return 0 if not failed_rows else 1


def register(subparsers) -> None:
    """Add ``molmoact2 parity`` to the CLI."""
    from ..bundle.golden import DEFAULT_MIN_COSINE
    from .args import add_backend_arg, add_bundle_args, example, float_in, parse_suffix

    p = subparsers.add_parser(
        "parity", help="golden parity per session and end to end",
        description="Feed each session its golden inputs and compare its outputs, then run the "
        "end-to-end traces from the\nraw observation and compare every stage. Exit 0 only if "
        "every row passes.",
        epilog=example("molmoact2 parity .cache/tiny-bundle",
                       "molmoact2 parity /data/molmoact2/grid_sampler --backend htp --suffix "
                       "llm=_w4a16"))
    add_bundle_args(p)
    add_backend_arg(p)
    p.add_argument("--min-cosine", type=float_in(0.0, 1.0, low_open=True),
                   default=DEFAULT_MIN_COSINE,
                   help="cosine similarity a row needs to pass, in (0, 1]")
    p.add_argument("--suffix", type=parse_suffix, action="append", metavar="GROUP=SUFFIX",
                   help="context suffix per group, repeatable (vision, llm, action: action_step "
                   "only; e.g. llm=_w4a16); default: fp16 everywhere, or the reference "
                   "runtime's VISION_/LLM_/ACTION_CTX_SUFFIX variables when set (with a notice)")
    p.set_defaults(func=cmd_parity)
