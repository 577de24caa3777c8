"""``molmoact2 tiny-bundle``: write the tiny synthetic bundles the demo and the tests run on."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..bundle.variants import VARIANTS
from ..control.params import SEED_MAX
from ..errors import BundleError
from ..util.optional import require
from ..util.outputs import check_folder, check_written_folder, replace_folder, seal_folder
from ..util.progress import progress
from .args import example, int_in

#: the marker's folder kind: ``--force`` replaces only a folder sealed as this
KIND = "tiny-bundle"


def cmd_tiny_bundle(args: argparse.Namespace) -> int:
    require("onnx", "tiny-bundle (it builds ONNX graphs)")
    from ..synth import write_tiny_bundles

    out = check_folder(args.out, what="output path")  # not a file, not a symlink
    names = args.variants or list(VARIANTS)
    existing = [n for n in names if os.path.lexists(out / n)]
    if existing and not args.force:
        raise BundleError(f"{out} already holds {', '.join(existing)}; pass --force to overwrite "
                          "them, or give a new folder")
    for name in names:  # --force replaces only a variant folder this command wrote, unchanged
        check_written_folder(out / name, force=args.force, what="tiny-bundle folder",
                             kind=KIND)
    start = time.perf_counter()
    written: dict[str, Path] = {}
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-bundle.", dir=out))
    try:  # each variant is written beside its folder, sealed, then moved into place
        for name in progress(names, "tiny-bundle"):
            write_tiny_bundles(staging, variants=(name,), seed=args.seed)
            seal_folder(staging / name, KIND)
            replace_folder(staging / name, out / name, what="tiny-bundle folder", kind=KIND)
            written[name] = out / name
    finally:
        shutil.rmtree(staging, ignore_errors=True)
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
                   help="replace variant folders this command wrote earlier in OUT (never "
                   "a folder it did not write, or one changed since)")
    p.set_defaults(func=cmd_tiny_bundle)
