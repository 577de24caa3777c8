"""Build a bundle's ``host/`` assets from the Hugging Face checkpoint it was exported from.

``tokenizer.json``, the embedding table as float16 ``.npy`` (memory-mapped at run time),
``prompt.json`` (the robot-action template) and ``conventions.json`` read off the bundle's
goldens where they show a choice (defaults elsewhere, listed as still to verify).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bundle.checkpoint import TEMPLATE, embedding_table, read_settings
from ..bundle.conventions import Conventions
from ..bundle.normstats import NormStats
from ..bundle.schema import read_json_object
from ..errors import BundleError, GoldenError
from ..util.outputs import check_file, remove, writing
from ..util.progress import progress

__all__ = ["TEMPLATE", "embedding_table", "export_host", "starting_conventions"]


@dataclass
class ExportResult:
    """What ``export_host`` wrote, and which conventions are defaults still to verify."""

    written: list[Path] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)


def starting_conventions(bundle: Path, variant: str | None, encoder_mask: str | None = None
                         ) -> tuple[Conventions, list[str]]:
    """Conventions read off the bundle's goldens (needs the other host files), and the rest.

    ``encoder_mask`` (from the checkpoint's ``action_mode``) is the base the goldens may
    overrule: a fine-tuned policy can record another mask than its base config says."""
    from ..bundle.bundle import Bundle
    from ..host.convention_check import conventions_from_goldens, unverified

    opened = Bundle.open(bundle, variant)
    base = Conventions(euler_baked_steps=opened.variant.default_flow_steps)
    if encoder_mask is not None:
        base = Conventions(**{**base.__dict__, "encoder_mask": encoder_mask})
    try:
        conv, findings = conventions_from_goldens(opened, base)
    except GoldenError as exc:  # no goldens to read: every choice is a default
        return base, [f"all but the checkpoint's (no goldens to read them from: {exc})"]
    notes = unverified(findings)
    if encoder_mask is not None and conv.encoder_mask != encoder_mask:
        notes.append(f"encoder_mask (the goldens show {conv.encoder_mask}, config.json's "
                     f"action_mode gives {encoder_mask}; the goldens' is kept)")
    return conv, notes


def export_norm_stats(checkpoint: Path, bundle: Path, meta: dict, *, named: Path | None = None,
                      mode: str | None = None, force: bool = False,
                      variant: str | None = None) -> Path | None:
    """Write ``bundle/norm_stats.json`` with its ``source``: from ``named`` (a norm_stats.json
    or a LeRobot normaliser safetensors), else the checkpoint's LeRobot processor (a fine-tune's
    own statistics: they replace any the bundle ships), else the checkpoint's norm_stats.json
    when the bundle has none. ``mode`` names a mode the source does not. Validated before it
    is kept; None when nothing was written."""
    from ..bundle.bundle import Bundle
    from ..bundle.lerobot_stats import find_processor, stats_from_processor

    target = bundle / "norm_stats.json"
    source = Path(named).expanduser() if named else find_processor(checkpoint)
    plain = checkpoint / "norm_stats.json"
    if source is None:
        has = target.is_file() or (bundle / "golden" / "norm_stats.json").is_file()
        if not plain.is_file() or has:
            return None
        source = plain
    elif target.is_file() and not force:
        raise BundleError(f"{target} exists; pass --force to replace it with the statistics of "
                          f"{source}")
    if not source.is_file():
        raise BundleError(f"--norm-stats {source} does not exist")
    if source.suffix == ".safetensors":
        document = stats_from_processor(source, mode, meta)
    else:
        document = read_json_object(source, "norm_stats.json")
        document.setdefault("source", f"norm_stats.json {source}")
        if mode:
            document["norm_mode"] = mode
    with writing(target, what="export-host output") as tmp:  # validated before it is kept
        tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        v = Bundle.open(bundle, variant).variant
        NormStats.from_json(tmp, action_dim=v.action_dim, state_dim=v.state_dim)
    return target


def export_host(checkpoint: Path, bundle: Path, *, force: bool = False,
                variant: str | None = None, norm_stats: Path | None = None,
                norm_mode: str | None = None) -> ExportResult:
    """Write ``bundle/host/`` from ``checkpoint``; existing files are refused unless ``force``."""
    checkpoint, bundle = Path(checkpoint).expanduser(), Path(bundle).expanduser()
    if not checkpoint.is_dir():
        raise BundleError(f"checkpoint folder {checkpoint} does not exist or is not a folder")
    tokenizer = checkpoint / "tokenizer.json"
    if not tokenizer.is_file():
        raise BundleError(f"{checkpoint} has no tokenizer.json (use the fast-tokenizer export)")
    if bundle.exists() and not bundle.is_dir():
        raise BundleError(f"bundle path {bundle} is a file; give the bundle folder")
    host = bundle / "host"
    names = ("tokenizer.json", "embeddings.npy", "prompt.json", "conventions.json")
    existing = [n for n in names if os.path.lexists(host / n)]
    if existing and not force:
        raise BundleError(f"{host} already has {', '.join(existing)}; pass --force to "
                          "overwrite them")
    for n in existing:  # --force replaces only files this command wrote, unchanged since
        check_file(host / n, force=True, what="export-host output")
    if variant is None and not (bundle / "bundle.json").is_file():
        raise BundleError(f"{bundle} has no bundle.json naming its variant; add --variant")
    from ..bundle.lerobot_stats import find_processor

    stats_from = norm_stats or find_processor(checkpoint)
    target = bundle / "norm_stats.json"
    if stats_from and os.path.lexists(target):
        if not force:
            raise BundleError(f"{target} exists; pass --force to replace it with the "
                              f"statistics of {stats_from}")
        check_file(target, force=True, what="export-host output")
    host.mkdir(parents=True, exist_ok=True)
    result = ExportResult()
    norm = checkpoint / "norm_stats.json"
    meta = {}
    if norm.is_file():
        try:
            meta = json.loads(norm.read_text()).get("metadata_by_tag", {}).get("libero", {})
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            raise BundleError(f"{norm} is not norm-stats JSON ({exc})") from None
    settings = read_settings(checkpoint)
    prompt = {
        "template": TEMPLATE,
        "setup": _unwrap(meta.get("setup_type", "single franka robotic arm in libero"),
                         "<setup_start>", "<setup_end>"),
        "control": _unwrap(meta.get("control_mode", "delta end-effector pose"),
                           "<control_start>", "<control_end>"),
        **settings.prompt,
    }

    def conventions(path: Path) -> None:
        conv, result.unverified = starting_conventions(bundle, variant, settings.encoder_mask)
        result.unverified += [f"{name} (the checkpoint has no file for it)"
                              for name in settings.defaults]
        path.write_text(conv.to_json() + "\n")

    steps = {
        "tokenizer.json": lambda p: shutil.copyfile(tokenizer, p),
        "embeddings.npy": lambda p: np.save(p, embedding_table(checkpoint), allow_pickle=False),
        "prompt.json": lambda p: p.write_text(json.dumps(prompt, indent=2, sort_keys=True)),
        "conventions.json": conventions,  # last: reading the goldens needs the other three
    }
    try:
        for name in progress(steps, "export-host"):
            with writing(host / name, what="export-host output") as tmp:
                steps[name](tmp)
            result.written.append(host / name)
    except BaseException:
        for path in result.written:  # a half export would block the re-run
            if path.name not in existing:  # files that were there before are left alone
                remove(path, what="export-host output")
        raise
    written = export_norm_stats(checkpoint, bundle, meta, named=norm_stats, mode=norm_mode,
                                force=force, variant=variant)
    if written is not None:
        result.written.append(written)
    return result


def _unwrap(text: str, start: str, end: str) -> str:
    """A setup/control string already wrapped in its marker tokens, unwrapped (the template
    wraps it; the model's ``_wrap_setup_text`` does not wrap twice)."""
    if text.startswith(start) and text.endswith(end):
        return text[len(start): len(text) - len(end)]
    return text


def cmd_export_host(args: argparse.Namespace) -> int:
    from .args import check_paths

    check_paths([("output", Path(args.bundle) / "host")], [("checkpoint", args.checkpoint)])
    start = time.perf_counter()
    result = export_host(Path(args.checkpoint), Path(args.bundle), force=args.force,
                         variant=args.variant, norm_stats=args.norm_stats,
                         norm_mode=args.norm_mode)
    for path in result.written:
        print(f"wrote {path}")
    print("conventions.json holds what the goldens show; defaults still to verify: "
          + ", ".join(result.unverified))
    print(f"export-host: wrote {len(result.written)} files to {args.bundle} in "
          f"{time.perf_counter() - start:.1f} s; next: molmoact2 conventions {args.bundle}, "
          f"then molmoact2 parity {args.bundle}")
    return 0


def register(subparsers) -> None:
    """Add ``molmoact2 export-host`` to the CLI."""
    from ..bundle.variants import VARIANTS
    from .args import example

    p = subparsers.add_parser(
        "export-host", help="write a bundle's host/ files from the HF checkpoint",
        description="Copy tokenizer.json, write embeddings.npy (float16) and prompt.json from "
        "the checkpoint, and conventions.json\nread off the bundle's goldens. Needs the export "
        "extra (safetensors).",
        epilog=example("molmoact2 export-host /path/to/MolmoAct2-LIBERO-checkpoint "
                       "/data/molmoact2/grid_sampler"))
    p.add_argument("checkpoint", help="checkpoint folder (tokenizer.json, *.safetensors, "
                   "optionally model.safetensors.index.json and norm_stats.json)")
    p.add_argument("bundle", help="the variant's bundle folder to complete (its host/ is "
                   "written)")
    p.add_argument("--variant", choices=list(VARIANTS),
                   help="the bundle's variant (default: its bundle.json)")
    p.add_argument("--force", action="store_true",
                   help="overwrite existing host/ files and norm_stats.json")
    p.add_argument("--norm-stats", metavar="PATH",
                   help="the statistics to use: a norm_stats.json or a LeRobot normaliser "
                   "safetensors (default: the checkpoint's LeRobot processor, else its "
                   "norm_stats.json)")
    p.add_argument("--norm-mode", choices=("q01_q99", "min_max", "q10_q90"),
                   help="the normalisation mode, when the statistics do not name it")
    p.set_defaults(func=cmd_export_host)
