"""``molmoact2 tiny-bundle``: write the tiny synthetic bundles the demo and the tests run on."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..bundle.variants import VARIANTS
from ..control.params import SEED_MAX
from ..errors import BundleError
from ..util.optional import require
from ..util.progress import progress
from .args import example, int_in


def cmd_tiny_bundle(args: argparse.Namespace) -> int:
    require("onnx", "tiny-bundle (it builds ONNX graphs)")
    from ..synth import write_tiny_bundles

    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise BundleError(f"output path {out} is a file; give a folder")
    names = args.variants or list(VARIANTS)
    existing = [n for n in names if (out / n).exists()]
    if existing and not args.force:
        raise BundleError(f"{out} already holds {', '.join(existing)}; pass --force to overwrite "
                          "them, or give a new folder")
    start = time.perf_counter()
    written: dict[str, Path] = {}
    for name in progress(names, "tiny-bundle"):
        written.update(write_tiny_bundles(out, variants=(name,), seed=args.seed))
    for name, path in written.items():
        print(f"{name:<14} {path}")
    print(f"tiny-bundle: wrote {len(written)} bundles ({', '.join(written)}) to {out} in "
          f"{time.perf_counter() - start:.1f} s (seed {args.seed})")
    return 0


def register(subparsers) -> None:
    """Add ``molmoact2 tiny-bundle`` to the CLI."""
    p = subparsers.add_parser(
        "tiny-bundle", help="write the tiny synthetic bundles (random weights, real interfaces)",
        description="Write one tiny bundle folder per variant: ONNX graphs with the real "
        "pipeline's interfaces and random\nweights, goldens from the independent numpy "
        "reference, host files and stand-in contexts for the test fake.\nNeeds the synth extra "
        "(onnx). Same seed, same bytes. Refuses to overwrite existing variant folders without "
        "--force.",
        epilog=example("molmoact2 tiny-bundle .cache/tiny-bundle --variants grid_sampler"))
    p.add_argument("out", help="output folder (one sub-folder per variant)")
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS),
                   help="variants to write (default: all)")
    p.add_argument("--seed", type=int_in(0, SEED_MAX), default=0, help="weight and golden seed")
    p.add_argument("--force", action="store_true",
                   help="overwrite variant folders that already exist in OUT")
    p.set_defaults(func=cmd_tiny_bundle)
