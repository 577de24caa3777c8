"""Read a MolmoAct2 Hugging Face checkpoint folder as released: weights, tokenizer and
processor settings, and the model config's choices that decide the host glue.

``export-host`` writes ``host/`` from what this reads (docs/bundle_format.md). Every choice
the host path does not implement is refused naming the file, the key and its value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BundleError
from ..util.optional import require
from .schema import read_json_object
from .variants import checkpoint_hint

#: The table is ``wte.embedding`` [vocab, H] then ``wte.new_embedding`` [128, H].
EMBEDDING_SUFFIXES = ("wte.embedding", "wte.new_embedding")
#: ``action_mode`` → the action expert's mask (LeRobot ``_get_encoder_attention_mask``:
#: "both" drops every token whose id is ``config.eos_token_id``; "continuous" sees all).
ENCODER_MASK_BY_ACTION_MODE = {"both": "exclude_eos", "continuous": "padding_only"}
#: What the host path implements of the image processor (host_glue.md §2).
IMAGE_SIZE, PATCH_SIZE, POOLING = 378, 14, (2, 2)
BILINEAR = 2  # PIL's Resampling.BILINEAR, as the processor config stores it


def robot_template(*, setup_tokens: bool = True, control_tokens: bool = True,
                   num_images: int = 2) -> str:
    """The robot-action prompt as the model's ``_build_robot_text`` writes it, with
    ``{task}``, ``{setup}``, ``{control}`` and ``{state}`` left to fill."""
    setup = "<setup_start>{setup}<setup_end>" if setup_tokens else "{setup}"
    control = "<control_start>{control}<control_end>" if control_tokens else "{control}"
    if num_images == 1:
        prefix = "<|image|>"
    else:
        prefix = "".join(f"Image {i + 1}<|image|>" for i in range(num_images))
    return (f"{prefix}<|im_start|>user\nThe task is to {{task}}. The setup is {setup}. The "
            "current state of the robot is {state}. The expected control mode is "
            f"{control}. Given these, what action should the robot take to complete the "
            "task?<|im_end|>\n<|im_start|>assistant\n<action_output>")


TEMPLATE = robot_template()


@dataclass
class CheckpointSettings:
    """What the checkpoint decides for ``host/``; ``sources`` names the file of each choice,
    ``defaults`` the choices no file of the checkpoint settled."""

    prompt: dict[str, Any] = field(default_factory=dict)
    encoder_mask: str | None = None
    action_mode: str | None = None
    flow_steps: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    defaults: list[str] = field(default_factory=list)


def _token_text(value: Any, path: Path, key: str) -> str | None:
    """A tokenizer_config token: a string, or an AddedToken object with ``content``."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise BundleError(f"{path}: {key} is {value!r}; expected a token string")
    return value


def _token_id(tokenizer: Path, token: str) -> int | None:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise BundleError(f"{tokenizer} cannot be loaded as tokenizer.json ({exc})") from None
    tid = tok.token_to_id(token)
    return None if tid is None else int(tid)


def special_tokens(checkpoint: Path) -> tuple[dict[str, str], list[str]]:
    """BOS, EOS and pad from ``tokenizer_config.json``. BOS is the model processor's
    ``bos_token_id or eos_token_id``: the EOS token when BOS is unset or has id 0."""
    path = checkpoint / "tokenizer_config.json"
    if not path.is_file():
        return {}, ["bos_token", "eos_token", "pad_token"]
    data = read_json_object(path, "the checkpoint's tokenizer_config.json")
    eos = _token_text(data.get("eos_token"), path, "eos_token")
    bos = _token_text(data.get("bos_token"), path, "bos_token")
    pad = _token_text(data.get("pad_token"), path, "pad_token")
    if eos is None:
        raise BundleError(f"{path} has no eos_token; the prompt's BOS falls back to it")
    if bos is None or not _token_id(checkpoint / "tokenizer.json", bos):
        bos = eos
    out = {"bos_token": bos, "eos_token": eos}
    if pad is not None:
        out["pad_token"] = pad
    return out, ([] if pad is not None else ["pad_token"])


def _image_processor(checkpoint: Path) -> tuple[dict, dict, Path | None]:
    """(processor settings, image-processor settings, the file that held the latter)."""
    processor, image, where = {}, {}, None
    path = checkpoint / "processor_config.json"
    if path.is_file():
        processor = read_json_object(path, "the checkpoint's processor_config.json")
        nested = processor.get("image_processor")
        if isinstance(nested, dict):
            image, where = nested, path
    pre = checkpoint / "preprocessor_config.json"
    if not image and pre.is_file():
        image, where = read_json_object(pre, "the checkpoint's preprocessor_config.json"), pre
    return processor, image, where


def check_processor(checkpoint: Path) -> list[str]:
    """Refuse what the host path does not implement; return the settings no file gave."""
    processor, image, where = _image_processor(checkpoint)
    missing = []
    path = checkpoint / "processor_config.json"
    if processor:
        # get_image_tokens, single crop: a column token ends each row unless switched off
        col = processor.get("use_single_crop_col_tokens")
        if col is None:
            col = processor.get("image_use_col_tokens", True)
        if col:
            raise BundleError(
                f"{path}: use_single_crop_col_tokens/image_use_col_tokens puts an <im_col> "
                "token after each row of patches; the host path writes <im_start> + "
                "<im_patch> x N + <im_end> per camera and does not implement column tokens")
    else:
        missing.append("image token layout")
    if not image:
        return [*missing, "image processor (resample, mean/std, crop mode)"]
    checks = {
        "crop_mode": (image.get("crop_mode", "overlap-and-resize-c2"), ("resize",),
                      "the host path resizes each camera to one crop"),
        "resample": (image.get("resample", BILINEAR), (BILINEAR, "bilinear", "BILINEAR"),
                     "the host path implements torchvision's bilinear Resize(antialias=False)"),
        "image_mean": (list(image.get("image_mean", [0.48145466, 0.4578275, 0.40821073])),
                       ([0.5, 0.5, 0.5],), "the host path maps u8 to [-1, 1]: (u/255)*2-1"),
        "image_std": (list(image.get("image_std", [0.26862954, 0.26130258, 0.27577711])),
                      ([0.5, 0.5, 0.5],), "the host path maps u8 to [-1, 1]: (u/255)*2-1"),
        "size": (image.get("size", {"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
                 ({"height": IMAGE_SIZE, "width": IMAGE_SIZE},),
                 f"the host path resizes to {IMAGE_SIZE} x {IMAGE_SIZE}"),
        "patch_size": (image.get("patch_size", PATCH_SIZE), (PATCH_SIZE,),
                       f"the host path cuts {PATCH_SIZE} x {PATCH_SIZE} patches"),
        "pooling_size": (list(image.get("pooling_size", POOLING)), (list(POOLING),),
                         "the vision graph pools 2 x 2 patches per token"),
    }
    for key, (value, allowed, why) in checks.items():
        if value not in allowed:
            raise BundleError(f"{where}: {key} is {value!r}; {why} and refuses any other")
    return missing


def model_config(checkpoint: Path) -> dict:
    path = checkpoint / "config.json"
    return read_json_object(path, "the checkpoint's config.json") if path.is_file() else {}


def read_settings(checkpoint: Path) -> CheckpointSettings:
    """Everything ``export-host`` takes from the checkpoint besides the tensors."""
    checkpoint = Path(checkpoint)
    out = CheckpointSettings()
    tokens, missing = special_tokens(checkpoint)
    out.prompt.update(tokens)
    out.sources.update({k: "tokenizer_config.json" for k in tokens})
    out.defaults += missing
    out.defaults += check_processor(checkpoint)
    config = model_config(checkpoint)
    path = checkpoint / "config.json"
    if not config:
        out.defaults += ["action_mode (encoder mask)", "setup/control tokens"]
        out.prompt["template"] = TEMPLATE
        return out
    mode = config.get("action_mode", "both")
    if mode not in ENCODER_MASK_BY_ACTION_MODE:
        raise BundleError(f"{path}: action_mode is {mode!r}; the host path runs the action "
                          f"expert, which needs one of {sorted(ENCODER_MASK_BY_ACTION_MODE)}")
    out.action_mode = mode
    out.encoder_mask = ENCODER_MASK_BY_ACTION_MODE[mode]
    out.sources["encoder_mask"] = f"config.json action_mode={mode}"
    for key, expected in (("mask_action_dim_padding", True), ("action_expert_depth_gate", False),
                          ("add_action_expert", True)):
        if config.get(key, expected) != expected:
            raise BundleError(f"{path}: {key} is {config[key]!r}; the host path implements "
                              f"only {key}={expected!r}")
    eos_id = config.get("eos_token_id")
    if isinstance(eos_id, list):
        eos_id = eos_id[0] if eos_id else None
    eos = tokens.get("eos_token")
    if eos_id is not None and eos is not None:
        found = _token_id(checkpoint / "tokenizer.json", eos)
        if found != eos_id:
            raise BundleError(
                f"{path}: eos_token_id {eos_id} but tokenizer_config.json's eos_token {eos!r} "
                f"is id {found}; the action expert's mask drops config.eos_token_id, the "
                "prompt uses the tokenizer's: use the files of one checkpoint")
    steps = config.get("flow_matching_num_steps")
    out.flow_steps = int(steps) if isinstance(steps, int) and steps > 0 else None
    out.prompt["template"] = robot_template(
        setup_tokens=bool(config.get("add_setup_tokens", True)),
        control_tokens=bool(config.get("add_control_tokens", True)))
    out.sources["template"] = "config.json add_setup_tokens/add_control_tokens"
    return out


def safetensors_files(checkpoint: Path) -> list[Path]:
    """The weight files: the index's shards, else every ``*.safetensors``."""
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
                AttributeError) as exc:
            raise BundleError(f"{index} is not a safetensors index (needs a 'weight_map' of "
                              f"tensor -> file; {type(exc).__name__}: {exc}); "
                              f"{checkpoint_hint()}") from None
        missing = [n for n in names if not isinstance(n, str) or not (checkpoint / n).is_file()]
        if missing:
            raise BundleError(f"{index} names {missing[:3]} which {checkpoint} lacks; "
                              f"{checkpoint_hint('every shard')}") from None
        return [checkpoint / n for n in names]
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise BundleError(f"{checkpoint} has no *.safetensors weights")
    return files


def read_tensor(path: Path, key: str) -> np.ndarray:
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
    for path in safetensors_files(checkpoint):
        try:
            with safe_open(str(path), framework="numpy") as f:
                keys = list(f.keys())
        except Exception as exc:  # SafetensorError, OSError: a truncated or foreign file
            raise BundleError(f"{path} is not a readable safetensors file ({exc}); "
                              f"{checkpoint_hint()}") from None
        for key in keys:
            for suffix in EMBEDDING_SUFFIXES:
                if key.endswith(suffix):
                    found.setdefault(suffix, (path, key))
    missing = [s for s in EMBEDDING_SUFFIXES if s not in found]
    if missing:
        raise BundleError(f"{checkpoint}: no tensor ending in {missing}; is this a MolmoAct2 "
                          "checkpoint?")
    try:
        parts = [read_tensor(*found[s]) for s in EMBEDDING_SUFFIXES]
    except (ValueError, KeyError, OSError) as exc:
        raise BundleError(f"cannot read the embedding tensors from {checkpoint} "
                          f"({type(exc).__name__}: {exc}); {checkpoint_hint('the weights')}"
                          ) from None
    if parts[0].ndim != 2 or parts[1].ndim != 2 or parts[0].shape[1] != parts[1].shape[1]:
        raise BundleError(f"embedding tensors have shapes {[p.shape for p in parts]}")
    return np.concatenate(parts).astype(np.float16)
