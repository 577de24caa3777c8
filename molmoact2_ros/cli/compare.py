"""``molmoact2 compare A B``: two chunk bags against each other, by observation stamp (two
bundles, fp16 against ``_w4a16``, two boards), with the report of ``replay --golden`` plus the
error distribution per dimension in the action's own units."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import MolmoActError
from .args import check_paths, check_report_dir, float_in


def bag_label(path: Path, settings: dict) -> str:
    """One side of a comparison as the plots name it: the bag, its variant, context suffixes,
    backend and machine (two bundles or two suffixes differ here, not only two boards)."""
    suffixes = ", ".join(f"{k.removeprefix('context_suffix.')}={v}" for k, v in
                         sorted(settings.items()) if k.startswith("context_suffix.") and v)
    backend = settings.get("backend", "?")
    precision = f"{suffixes or 'fp16'}, " if backend == "htp" else ""  # onnx: the onnx/ graphs
    return (f"{path.name} ({settings.get('variant', '?')}, {precision}{backend}, "
            f"{settings.get('machine', '?')})")


def cmd_compare(args: argparse.Namespace) -> int:
    from ..bundle.bundle import resolve_bundles
    from ..replay.chunk_match import check_atol, format_summary, match_chunks
    from ..replay.chunkbag import (
        action_scale,
        noise_stream_problem,
        read_chunk_bag,
        settings_differences,
    )
    from ..replay.run_settings import tolerance_from_args

    # before reading: no output inside an input, nothing replaced that is not ours
    check_paths([("--report", args.report)], [("A", args.a), ("B", args.b),
                                               ("--bundle-root", args.bundle_root)])
    check_report_dir(args.report, args.force, "compare")
    if args.bundle_root:  # a root that is not there (or holds no bundle) is refused, not ignored
        try:
            resolve_bundles(Path(args.bundle_root))
        except MolmoActError as exc:
            raise MolmoActError(f"--bundle-root: {exc}") from None
    a, b = read_chunk_bag(Path(args.a)), read_chunk_bag(Path(args.b))
    if Path(args.a).resolve() == Path(args.b).resolve():
        raise MolmoActError("compare A B: A and B are the same bag; give two chunk bags")
    names = b.action_names or a.action_names or [f"dim {i}" for i in range(7)]
    backend = args.backend or a.settings.get("backend", "onnx")
    tol = tolerance_from_args(args, backend)
    for chunk in list(b.chunks.values())[:1]:
        check_atol(tol, chunk.shape[-1])
    differences = settings_differences(b.settings, a.settings)
    if differences:
        print("settings differ (A, B in brackets): " + "; ".join(differences))
    for label, bag in (("A", a), ("B", b)):
        noise = noise_stream_problem(bag.settings)
        if noise:
            print(f"{label}: {noise}")
    if a.settings.get("noise_fingerprint") and b.settings.get("noise_fingerprint") and \
            a.settings["noise_fingerprint"] != b.settings["noise_fingerprint"] and \
            a.settings.get("seed") == b.settings.get("seed"):
        print(f"noise stream differs between A and B: seed {a.settings.get('seed')} drew "
              f"{a.settings['noise_fingerprint']} (numpy {a.settings.get('numpy_version', '?')})"
              f" and {b.settings['noise_fingerprint']} (numpy "
              f"{b.settings.get('numpy_version', '?')}); no chunk can match")
    scale = action_scale(b.settings, bundle_root=args.bundle_root) or action_scale(
        a.settings, bundle_root=args.bundle_root)
    summary = match_chunks(a.chunks, b.chunks, tol, min_produced=args.min_produced,
                           scale=scale)
    print(f"compare {args.a} (A, {a.settings.get('backend', '?')}) against {args.b} "
          f"(B, {b.settings.get('backend', '?')}): {len(a.chunks)} and {len(b.chunks)} chunks")
    print(format_summary(summary, names))
    if args.report:
        from ..replay.report import ReportData, error_distribution, machine, write_report

        dist = error_distribution(a.chunks, b.chunks, names)
        data = ReportData(
            run=dict(a.chunks), golden=dict(b.chunks), names=list(names),
            period_s=(b.period_ns or a.period_ns) / 1e9, summary=summary,
            run_label=bag_label(Path(args.a), a.settings),
            golden_label=bag_label(Path(args.b), b.settings), short_labels=("A", "B"),
            title=f"compared on {machine()}")
        files = write_report(Path(args.report), data, {
            "a": a.provenance, "b": b.provenance, "differences": differences,
            "match": summary.to_json(), "error_distribution": dist,
            "error_distribution_units": "action units (A - B)"})
        for name, d in dist.items():
            print(f"  {name}: |A - B| p50 {d['p50_abs']:.3g}, p95 {d['p95_abs']:.3g}, "
                  f"max {d['max_abs']:.3g} (action units)")
        print(f"report: {', '.join(str(f) for f in files)}")
    return 0 if summary.ok else 1


def register(sub) -> None:
    """Add ``molmoact2 compare`` to the CLI."""
    from .args import example
    from .replay import add_tolerance_args

    p = sub.add_parser(
        "compare", help="two chunk bags against each other, by observation stamp",
        description="Match every chunk of bag A with the chunk of bag B at the same observation "
        "stamp (B is the reference)\nwith the same rule as replay --golden; exit 0 only if "
        "every chunk of B has a matching chunk in A.",
        epilog=example("molmoact2 compare board_chunks workstation_chunks --report report/",
                       "molmoact2 compare w4a16_chunks fp16_chunks --backend htp "
                       "--min-within 0.9"))
    p.add_argument("a", help="chunk bag to check (e.g. recorded on the board)")
    p.add_argument("b", help="reference chunk bag (e.g. recorded on a workstation)")
    p.add_argument("--backend", choices=["onnx", "htp"],
                   help="whose default limits to use (default: A's recorded backend)")
    add_tolerance_args(p)
    p.add_argument("--min-produced", type=float_in(0.0, 1.0), default=1.0,
                   help="fraction of B's chunks A must have")
    p.add_argument("--bundle-root", help="bundle whose action statistics give the normalised "
                   "units when neither bag recorded them")
    p.add_argument("--report", metavar="DIR", help="write summary.json and PNG plots here")
    p.add_argument("--force", action="store_true", help="overwrite an existing report")
    p.set_defaults(func=cmd_compare)
