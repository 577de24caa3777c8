"""``molmoact2 parity``: golden parity of a bundle per session and end to end, one table each."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bundle.bundle import resolve_bundles
from ..bundle.variants import COMPONENTS
from ..runtime.appbuilder import describe
from ..util.progress import progress


def section_header(name: str, path: Path, backend: str, suffixes) -> str:
    """What one parity table checked: the variant, the backend, the context suffix of each
    group (the HTP's; ONNX Runtime runs the bundle's onnx/ graphs, whatever the suffix) and
    the precision each component is judged at."""
    from ..bundle.comparison import precision_of

    if backend != "htp":
        return (f"== {name} ({describe(backend)}): the onnx/ graphs (context suffixes apply to "
                f"the HTP only), precision {precision_of(backend)}; {path}")
    groups = ", ".join(f"{g}={s or 'fp16'}" for g, s in suffixes.__dict__.items())
    llm = [c for c in COMPONENTS if c.startswith("llm_split")]
    shown = {"vision": "vision", llm[0]: f"{llm[0].removesuffix('0')}0..{len(llm) - 1}"}
    precisions = ", ".join(
        f"{shown.get(c, c)} {precision_of(backend, suffixes.for_component(c))}"
        for c in COMPONENTS if c not in llm[1:])
    return f"== {name} ({describe(backend)}): suffixes {groups}; precision {precisions}; {path}"


def cmd_parity(args: argparse.Namespace) -> int:
    from ..bundle.bundle import Suffixes
    from ..bundle.comparison import load_tolerances
    from ..bundle.golden import TRACE_FILES, component_parity, format_table
    from ..policy import Policy, e2e_parity

    total, failed_rows, names = 0, 0, []
    from .args import suffixes_from_env

    suffixes = Suffixes.from_mapping(suffixes_from_env(args.suffix))
    for name, path in resolve_bundles(Path(args.bundle), args.variant):
        names.append(name)
        table = load_tolerances(path / "golden").override(min_cosine=args.min_cosine,
                                                           min_within=args.min_within)
        traces = [t for t in TRACE_FILES if (path / "golden" / t).is_file()]
        rows = []
        options = {"bundle_libs": False} if args.ignore_bundle_libs and args.backend == "htp" \
            else {}
        with Policy.load(path, name, backend=args.backend, suffixes=suffixes,
                         pipeline_options=options) as policy:
            contracts = policy.bundle.variant.contracts(
                euler_in_graph=policy.conventions.euler_in_graph)
            for stage in progress([*COMPONENTS, *traces], f"parity {name}"):
                if stage in COMPONENTS:
                    rows += component_parity(path / "golden", policy.pipeline.run_component,
                                             contracts, components=[stage], table=table,
                                             precision=policy.precision)
                else:
                    rows += e2e_parity(policy, path / "golden" / stage, table=table)
        print(section_header(name, path, args.backend, suffixes))
        print(format_table(rows))
        failed = [r for r in rows if not r.passed]
        if table.source:
            print(f"limits from {table.source} ({len(table.rows)} rows), else the defaults")
        for r in failed:
            print(f"FAIL {r.stage} {r.tensor}: {r.failed or r.note}")
        print(f"{len(rows) - len(failed)}/{len(rows)} rows pass")
        total += len(rows)
        failed_rows += len(failed)
    verdict = "PASS" if not failed_rows else "FAIL"
    print(f"parity: {verdict}: {total - failed_rows}/{total} rows pass for {', '.join(names)} "
          f"on {describe(args.backend)} (a row needs cosine and the fraction within "
          "atol + rtol*|golden| at its component's limits)")
    return 0 if not failed_rows else 1


def register(subparsers) -> None:
    """Add ``molmoact2 parity`` to the CLI."""
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
                   help="cosine similarity every row needs, in (0, 1] (default: per component "
                   "and precision: fp32 and fp16 0.9999, w4a16 0.999, or "
                   "golden/tolerances.json)")
    p.add_argument("--min-within", type=float_in(0.0, 1.0, low_open=True),
                   help="fraction of elements within atol + rtol*|golden| every row needs "
                   "(default: fp32 1.0, fp16 0.99, w4a16 0.95, or golden/tolerances.json)")
    p.add_argument("--suffix", type=parse_suffix, action="append", metavar="GROUP=SUFFIX",
                   help="context suffix per group, repeatable (vision, llm, action: action_step "
                   "only; e.g. llm=_w4a16); default: fp16 everywhere, or the reference "
                   "runtime's VISION_/LLM_/ACTION_CTX_SUFFIX variables when set (with a notice)")
    p.add_argument("--ignore-bundle-libs", action="store_true",
                   help="htp: leave a bundle's qnn_libs/ and dsp_libs/ unused (the wheel's own "
                   "QNN runtime serves), e.g. a seed workspace's QAIRT 2.47 folders")
    p.set_defaults(func=cmd_parity)
