"""``molmoact2`` command line: tiny-bundle, parity, demo, bench, doctor, device-report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import MolmoActError
from .variants import VARIANTS


def _variant_dirs(root: Path, variant: str | None) -> list[tuple[str, Path]]:
    """A bundle folder, or a folder of per-variant bundle folders (as tiny-bundle writes)."""
    root = Path(root)
    if (root / "bundle.json").is_file() or variant and not (root / variant).is_dir():
        return [(variant, root)]
    names = [variant] if variant else [v for v in VARIANTS if (root / v).is_dir()]
    if not names:
        raise MolmoActError(f"{root} holds no bundle (no bundle.json, no variant folders)")
    return [(name, root / name) for name in names]


def parse_suffix(text: str) -> tuple[str, str]:
    """``GROUP=SUFFIX`` of ``--suffix`` (groups as in ``context_suffix.*``)."""
    from .variants import SUFFIX_GROUPS

    group, sep, suffix = text.partition("=")
    if not sep or group not in SUFFIX_GROUPS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use GROUP=SUFFIX with GROUP one of {', '.join(SUFFIX_GROUPS)}"
        )
    return group, suffix


def cmd_tiny_bundle(args: argparse.Namespace) -> int:
    from .synth import write_tiny_bundles

    written = write_tiny_bundles(Path(args.out), variants=args.variants or tuple(VARIANTS),
                                 seed=args.seed)
    for name, path in written.items():
        print(f"{name:<14} {path}")
    return 0


def cmd_parity(args: argparse.Namespace) -> int:
    from .bundle import Suffixes
    from .golden import TRACE_FILES, component_parity, e2e_parity, format_table
    from .policy import Policy

    ok = True
    suffixes = Suffixes.from_mapping(dict(args.suffix or []))
    for name, path in _variant_dirs(Path(args.bundle), args.variant):
        policy = Policy.load(path, name, backend=args.backend, suffixes=suffixes)
        with policy:
            contracts = policy.bundle.variant.contracts(
                euler_in_graph=policy.conventions.euler_in_graph
            )
            tol = {"min_cosine": args.min_cosine}
            rows = component_parity(
                path / "golden", policy.pipeline.run_component, contracts, **tol
            )
            for trace in TRACE_FILES:
                if (path / "golden" / trace).is_file():
                    rows += e2e_parity(policy, path / "golden" / trace, **tol)
        print(f"== {policy.bundle.variant.name} ({args.backend}) {path}")
        print(format_table(rows))
        failed = [r for r in rows if not r.passed]
        print(f"{len(rows) - len(failed)}/{len(rows)} rows pass")
        ok &= not failed
    return 0 if ok else 1


def cmd_demo(args: argparse.Namespace) -> int:
    from .golden import load_npz
    from .policy import Observation, Policy

    for name, path in _variant_dirs(Path(args.bundle), args.variant):
        trace = load_npz(path / "golden" / "e2e_trace.npz", ("image_primary", "image_wrist",
                                                              "state", "instruction"))
        with Policy.load(path, name, backend=args.backend, seed=0,
                         instruction=str(trace["instruction"])) as policy:
            obs = Observation(images=(trace["image_primary"], trace["image_wrist"]),
                              state=trace["state"])
            timings: dict[str, list[float]] = {}
            for _ in range(args.chunks):
                chunk = policy.predict(obs)
                for key, value in chunk.latency_ms.items():
                    timings.setdefault(key, []).append(value)
            print(f"== {name}: {args.chunks} chunks, {policy.flow_steps} flow steps, "
                  f"backend {args.backend}")
            print(f"{'stage':<16} {'median ms':>10} {'p95 ms':>10}")
            for key, values in timings.items():
                print(f"{key:<16} {np.median(values):>10.2f} {np.percentile(values, 95):>10.2f}")
            print("last chunk (de-normalised, 10 x 7):")
            print(np.array2string(chunk.actions, precision=4, suppress_small=True))
    return 0


def cmd_conventions(args: argparse.Namespace) -> int:
    from .bundle import Bundle
    from .convention_check import MISMATCH, check_conventions, format_findings

    ok = True
    for name, path in _variant_dirs(Path(args.bundle), args.variant):
        findings = check_conventions(Bundle.open(path, name))
        print(f"== {path}")
        print(format_findings(findings))
        ok &= all(f.verdict != MISMATCH for f in findings)
    return 0 if ok else 1


def cmd_export_host(args: argparse.Namespace) -> int:
    from .export_host import export_host

    for path in export_host(Path(args.checkpoint), Path(args.bundle), force=args.force):
        print(f"wrote {path}")
    print("now check the conventions against the goldens: molmoact2 conventions "
          f"{args.bundle}")
    return 0


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
    for name in VARIANTS:
        if (Path(args.bundle_root) / name).is_dir():
            changes[f"bundle.{name}"] = str(Path(args.bundle_root) / name)
    for item in args.set or []:
        key, _, value = item.partition("=")
        changes[key] = _parse_value(Settings().values.get(key, ""), value)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="molmoact2", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tiny-bundle", help="write the tiny synthetic bundles")
    p.add_argument("out", help="output folder (one sub-folder per variant)")
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_tiny_bundle)

    p = sub.add_parser("parity", help="golden parity per component and end to end")
    p.add_argument("bundle")
    p.add_argument("--variant", choices=list(VARIANTS))
    p.add_argument("--backend", default="onnx", choices=["onnx", "htp"])
    p.add_argument("--min-cosine", type=float, default=0.9999)
    p.add_argument("--suffix", type=parse_suffix, action="append", metavar="GROUP=SUFFIX",
                   help="context suffix per group (vision, llm, action=action_step only)")
    p.set_defaults(func=cmd_parity)

    p = sub.add_parser("conventions",
                       help="read the host-glue conventions off the goldens, compare")
    p.add_argument("bundle")
    p.add_argument("--variant", choices=list(VARIANTS))
    p.set_defaults(func=cmd_conventions)

    p = sub.add_parser("export-host",
                       help="write a bundle's host/ assets from the HF checkpoint")
    p.add_argument("checkpoint", help="checkpoint folder (tokenizer.json, *.safetensors)")
    p.add_argument("bundle", help="bundle folder to complete")
    p.add_argument("--force", action="store_true", help="overwrite existing host files")
    p.set_defaults(func=cmd_export_host)

    p = sub.add_parser("demo", help="run the pipeline on the bundle's sample observation")
    p.add_argument("bundle")
    p.add_argument("--variant", choices=list(VARIANTS))
    p.add_argument("--backend", default="onnx", choices=["onnx", "htp"])
    p.add_argument("--chunks", type=int, default=5)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("replay", help="replay a rosbag2 through the node logic (no ROS)")
    p.add_argument("bag")
    p.add_argument("--bundle-root", required=True, help="folder with one folder per variant")
    p.add_argument("--variant", default="grid_sampler", choices=list(VARIANTS))
    p.add_argument("--backend", default="onnx", choices=["onnx", "htp"])
    p.add_argument("--instruction", required=True)
    p.add_argument("--seed", type=int, default=-1)
    p.add_argument("--flow-steps", type=int, default=0)
    p.add_argument("--max-age", type=float, default=0.5, help="max_observation_age_s")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="any other parameter")
    p.add_argument("--out", help="write the chunks to this new bag (mcap)")
    p.add_argument("--golden", help="trace npz whose chunk the first chunk must match")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("trace-to-bag", help="turn a golden trace into a replayable bag")
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--frames", type=int, default=3)
    p.add_argument("--period-s", type=float, default=0.5)
    p.add_argument("--mcap", action="store_true")
    p.set_defaults(func=cmd_trace_to_bag)

    for extra in ("bench", "doctor", "device_report"):
        try:
            module = __import__(f"molmoact2_ros.{extra}", fromlist=["register"])
        except ImportError:
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MolmoActError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
