"""Build a bundle's ``host/`` assets from the Hugging Face checkpoint it was exported from:
``tokenizer.json``, the embedding table as float16 ``.npy`` (memory-mapped at run time),
``prompt.json`` (host_glue.md §3) and a starting ``conventions.json`` to verify with
``molmoact2 conventions``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from .errors import BundleError
from .host.conventions import Conventions

#: host_glue.md §3.3 — the robot-action prompt, with the bundle's setup/control strings.
TEMPLATE = (
    "Image 1<|image|>Image 2<|image|><|im_start|>user\nThe task is to {task}. The setup is "
    "<setup_start>{setup}<setup_end>. The current state of the robot is {state}. The expected "
    "control mode is <control_start>{control}<control_end>. Given these, what action should "
    "the robot take to complete the task?<|im_end|>\n<|im_start|>assistant\n<action_output>"
)
#: host_glue.md §4: the table is ``wte.embedding`` [vocab, H] then ``wte.new_embedding`` [128, H].
EMBEDDING_SUFFIXES = ("wte.embedding", "wte.new_embedding")


def _safetensors_files(checkpoint: Path) -> list[Path]:
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
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
    try:
        from safetensors import safe_open
    except ImportError:
        raise BundleError("exporting the embedding table needs safetensors: "
                          "pip install 'molmoact2_ros[export]'") from None
    found: dict[str, tuple[Path, str]] = {}
    for path in _safetensors_files(checkpoint):
        with safe_open(str(path), framework="numpy") as f:
            for key in f.keys():
                for suffix in EMBEDDING_SUFFIXES:
                    if key.endswith(suffix):
                        found.setdefault(suffix, (path, key))
    missing = [s for s in EMBEDDING_SUFFIXES if s not in found]
    if missing:
        raise BundleError(f"{checkpoint}: no tensor ending in {missing}; is this a MolmoAct2 "
                          "checkpoint?")
    parts = [_read_tensor(*found[s]) for s in EMBEDDING_SUFFIXES]
    if parts[0].ndim != 2 or parts[1].ndim != 2 or parts[0].shape[1] != parts[1].shape[1]:
        raise BundleError(f"embedding tensors have shapes {[p.shape for p in parts]}")
    return np.concatenate(parts).astype(np.float16)


def export_host(checkpoint: Path, bundle: Path, *, force: bool = False) -> list[Path]:
    """Write ``bundle/host/`` from ``checkpoint``; existing files are kept unless ``force``."""
    checkpoint, bundle = Path(checkpoint), Path(bundle)
    tokenizer = checkpoint / "tokenizer.json"
    if not tokenizer.is_file():
        raise BundleError(f"{checkpoint} has no tokenizer.json (use the fast-tokenizer export)")
    host = bundle / "host"
    host.mkdir(parents=True, exist_ok=True)
    written = []

    def write(name: str, produce) -> None:
        path = host / name
        if path.exists() and not force:
            return
        produce(path)
        written.append(path)

    write("tokenizer.json", lambda p: shutil.copyfile(tokenizer, p))
    write("embeddings.npy", lambda p: np.save(p, embedding_table(checkpoint)))
    norm = checkpoint / "norm_stats.json"
    meta = {}
    if norm.is_file():
        meta = json.loads(norm.read_text()).get("metadata_by_tag", {}).get("libero", {})
        if not (bundle / "norm_stats.json").is_file() and not (
                bundle / "golden" / "norm_stats.json").is_file():
            shutil.copyfile(norm, bundle / "norm_stats.json")
            written.append(bundle / "norm_stats.json")
    prompt = {
        "template": TEMPLATE,
        "setup": meta.get("setup_type", "single franka robotic arm in libero"),
        "control": meta.get("control_mode", "delta end-effector pose"),
    }
    write("prompt.json", lambda p: p.write_text(json.dumps(prompt, indent=2, sort_keys=True)))
    write("conventions.json", lambda p: p.write_text(Conventions().to_json()))
    return written
