"""Build a bundle's ``host/`` assets from the Hugging Face checkpoint it was exported from.

``tokenizer.json``, the embedding table as float16 ``.npy`` (memory-mapped at run time),
``prompt.json`` (the robot-action template) and ``conventions.json`` read off the bundle's
goldens where they show a choice (defaults elsewhere, listed as still to verify).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..bundle.conventions import Conventions
from ..errors import BundleError, GoldenError
from ..util.optional import require
from ..util.progress import progress

#: The robot-action prompt, with the bundle's setup/control strings.
TEMPLATE = (
    "Image 1<|image|>Image 2<|image|><|im_start|>user\nThe task is to {task}. The setup is "
    "<setup_start>{setup}<setup_end>. The current state of the robot is {state}. The expected "
    "control mode is <control_start>{control}<control_end>. Given these, what action should "
    "the robot take to complete the task?<|im_end|>\n<|im_start|>assistant\n<action_output>"
)
#: The table is ``wte.embedding`` [vocab, H] then ``wte.new_embedding`` [128, H].
EMBEDDING_SUFFIXES = ("wte.embedding", "wte.new_embedding")


def _safetensors_files(checkpoint: Path) -> list[Path]:
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
                AttributeError) as exc:
            raise BundleError(f"{index} is not a safetensors index (needs a 'weight_map' of "
                              f"tensor -> file; {type(exc).__name__}: {exc}); re-download "
                              "it") from None
        missing = [n for n in names if not isinstance(n, str) or not (checkpoint / n).is_file()]
        if missing:
            raise BundleError(f"{index} names {missing[:3]} which {checkpoint} lacks; "
                              "download every shard") from None
        return [checkpoint / n for n in names]
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise BundleError(f"{checkpoint} has no *.safetensors weights")
    return files


def _read_tensor(path: Path, key: str) -> np.ndarray:
    """One tensor as float32; bfloat16 (which numpy lacks) is widened bit-exactly."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        sl = f.get_slice(key)
        if sl.get_dtype() != "BF16":
            return np.asarray(f.get_tensor(key), dtype=np.float32)
        shape = tuple(sl.get_shape())
    # safetensors' numpy backend has no bfloat16: read the raw payload from the header offsets
    with open(path, "rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
        start, end = header[key]["data_offsets"]
        fh.seek(8 + header_len + start)
        raw = np.frombuffer(fh.read(end - start), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)


def embedding_table(checkpoint: Path) -> np.ndarray:
    """The concatenated token embedding table [vocab + new, hidden] as float16."""
    safe_open = require("safetensors", "exporting the embedding table").safe_open
    found: dict[str, tuple[Path, str]] = {}
    for path in _safetensors_files(checkpoint):
        try:
            with safe_open(str(path), framework="numpy") as f:
                keys = list(f.keys())
        except Exception as exc:  # SafetensorError, OSError: a truncated or foreign file
            raise BundleError(f"{path} is not a readable safetensors file ({exc}); "
                              "re-download it") from None
        for key in keys:
            for suffix in EMBEDDING_SUFFIXES:
                if key.endswith(suffix):
                    found.setdefault(suffix, (path, key))
    missing = [s for s in EMBEDDING_SUFFIXES if s not in found]
    if missing:
        raise BundleError(f"{checkpoint}: no tensor ending in {missing}; is this a MolmoAct2 "
                          "checkpoint?")
    try:
        parts = [_read_tensor(*found[s]) for s in EMBEDDING_SUFFIXES]
    except (ValueError, KeyError, OSError) as exc:
        raise BundleError(f"cannot read the embedding tensors from {checkpoint} "
                          f"({type(exc).__name__}: {exc}); re-download the weights") from None
    if parts[0].ndim != 2 or parts[1].ndim != 2 or parts[0].shape[1] != parts[1].shape[1]:
        raise BundleError(f"embedding tensors have shapes {[p.shape for p in parts]}")
    return np.concatenate(parts).astype(np.float16)


@dataclass
class ExportResult:
    """What ``export_host`` wrote, and which conventions are defaults still to verify."""

    written: list[Path] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)


def starting_conventions(bundle: Path, variant: str | None) -> tuple[Conventions, list[str]]:
    """Conventions read off the bundle's goldens (needs the other host files), and the rest."""
    from ..bundle.bundle import Bundle
    from .conventions import conventions_from_goldens, unverified

    opened = Bundle.open(bundle, variant)
    try:
        conv, findings = conventions_from_goldens(opened)
    except GoldenError as exc:  # no goldens to read: every choice is a default
        base = Conventions(euler_baked_steps=opened.variant.default_flow_steps)
        return base, [f"all (no goldens to read them from: {exc})"]
    return conv, unverified(findings)


def export_host(checkpoint: Path, bundle: Path, *, force: bool = False,
                variant: str | None = None) -> ExportResult:
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
    existing = [n for n in names if (host / n).exists()]
    if existing and not force:
        raise BundleError(f"{host} already has {', '.join(existing)}; pass --force to "
                          "overwrite them")
    if variant is None and not (bundle / "bundle.json").is_file():
        raise BundleError(f"{bundle} has no bundle.json naming its variant; add --variant")
    host.mkdir(parents=True, exist_ok=True)
    result = ExportResult()
    norm = checkpoint / "norm_stats.json"
    meta = {}
    if norm.is_file():
        try:
            meta = json.loads(norm.read_text()).get("metadata_by_tag", {}).get("libero", {})
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            raise BundleError(f"{norm} is not norm-stats JSON ({exc})") from None
    prompt = {
        "template": TEMPLATE,
        "setup": meta.get("setup_type", "single franka robotic arm in libero"),
        "control": meta.get("control_mode", "delta end-effector pose"),
    }

    def conventions(path: Path) -> None:
        conv, result.unverified = starting_conventions(bundle, variant)
        path.write_text(conv.to_json() + "\n")

    steps = {
        "tokenizer.json": lambda p: shutil.copyfile(tokenizer, p),
        "embeddings.npy": lambda p: np.save(p, embedding_table(checkpoint), allow_pickle=False),
        "prompt.json": lambda p: p.write_text(json.dumps(prompt, indent=2, sort_keys=True)),
        "conventions.json": conventions,  # last: reading the goldens needs the other three
    }
    name = "tokenizer.json"
    try:
        for name in progress(steps, "export-host"):
            steps[name](host / name)
            result.written.append(host / name)
    except BaseException:
        for path in [*result.written, host / name]:  # a half export would block the re-run
            if path.name not in existing:  # files that were there before are left alone
                path.unlink(missing_ok=True)
        raise
    if norm.is_file() and not (bundle / "norm_stats.json").is_file() and not (
            bundle / "golden" / "norm_stats.json").is_file():
        shutil.copyfile(norm, bundle / "norm_stats.json")
        result.written.append(bundle / "norm_stats.json")
    return result


def cmd_export_host(args: argparse.Namespace) -> int:
    from .args import check_paths

    check_paths([("output", Path(args.bundle) / "host")], [("checkpoint", args.checkpoint)])
    start = time.perf_counter()
    result = export_host(Path(args.checkpoint), Path(args.bundle), force=args.force,
                         variant=args.variant)
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
    p.add_argument("--force", action="store_true", help="overwrite existing host/ files")
    p.set_defaults(func=cmd_export_host)
