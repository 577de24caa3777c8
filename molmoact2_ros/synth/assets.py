"""Tiny-bundle host assets: vocabulary, tokenizer.json, prompt, norm stats, conventions, traces."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TEMPLATE = (
    "Image 1<|image|>Image 2<|image|><|im_start|>user\nThe task is to {task}. The setup is "
    "<setup_start>{setup}<setup_end>. The current state of the robot is {state}. The expected "
    "control mode is <control_start>{control}<control_end>. Given these, what action should the "
    "robot take to complete the task?<|im_end|>\n<|im_start|>assistant\n<action_output>"
)
SETUP = "single franka robotic arm in libero"
CONTROL = "delta end-effector pose"
NUM_STATE_BINS = 256

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image|>", "<im_start>", "<im_end>",
    "<im_patch>", "<setup_start>", "<setup_end>", "<control_start>", "<control_end>",
    "<action_output>", "<state_start>", "<state_end>",
    *(f"<state_{i}>" for i in range(NUM_STATE_BINS)),
)

#: The standard task strings of libero_spatial, libero_object, libero_goal and libero_10.
LIBERO_TASKS: tuple[str, ...] = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "pick up the black bowl from table center and place it on the plate",
    "pick up the black bowl on the cookie box and place it on the plate",
    "pick up the black bowl in the top drawer of the wooden cabinet and place it on the plate",
    "pick up the black bowl on the ramekin and place it on the plate",
    "pick up the black bowl next to the cookie box and place it on the plate",
    "pick up the black bowl on the stove and place it on the plate",
    "pick up the black bowl next to the plate and place it on the plate",
    "pick up the black bowl on the wooden cabinet and place it on the plate",
    "pick up the alphabet soup and place it in the basket",
    "pick up the cream cheese and place it in the basket",
    "pick up the salad dressing and place it in the basket",
    "pick up the bbq sauce and place it in the basket",
    "pick up the ketchup and place it in the basket",
    "pick up the tomato sauce and place it in the basket",
    "pick up the butter and place it in the basket",
    "pick up the milk and place it in the basket",
    "pick up the chocolate pudding and place it in the basket",
    "pick up the orange juice and place it in the basket",
    "open the middle drawer of the cabinet",
    "put the bowl on the stove",
    "put the wine bottle on top of the cabinet",
    "open the top drawer and put the bowl inside",
    "put the bowl on top of the cabinet",
    "push the plate to the front of the stove",
    "put the cream cheese in the bowl",
    "turn on the stove",
    "put the bowl on the plate",
    "put the wine bottle on the rack",
    "put both the alphabet soup and the tomato sauce in the basket",
    "put both the cream cheese box and the butter in the basket",
    "turn on the stove and put the moka pot on it",
    "put the black bowl in the bottom drawer of the cabinet and close it",
    "put the white mug on the left plate and put the yellow and white mug on the right plate",
    "pick up the book and place it in the back compartment of the caddy",
    "put the white mug on the plate and put the chocolate pudding to the right of the plate",
    "put both the alphabet soup and the cream cheese box in the basket",
    "put both moka pots on the stove",
    "put the yellow and white mug in the microwave and close it",
)

WORD_PATTERN = r"\w+|[^\w\s]+"

#: Host-glue choices per variant (the fields of ``host.conventions.Conventions``).
CONVENTIONS: dict[str, dict] = {
    "grid_sampler": {
        "padding_side": "right", "mask_value": -30000.0, "bidirectional_image_attention": True,
        "encoder_mask": "exclude_eos", "euler_in_graph": True, "euler_baked_steps": 10,
        "image_embeds_include_patch_embedding": False, "flip_images_180": False,
    },
    "lp_vtp_sd": {
        "padding_side": "left", "mask_value": -10000.0, "bidirectional_image_attention": True,
        "encoder_mask": "padding_only", "euler_in_graph": True, "euler_baked_steps": 2,
        "image_embeds_include_patch_embedding": True, "flip_images_180": False,
    },
    "fused": {
        "padding_side": "right", "mask_value": -30000.0, "bidirectional_image_attention": True,
        "encoder_mask": "exclude_eos", "euler_in_graph": False, "euler_baked_steps": 10,
        "image_embeds_include_patch_embedding": False, "flip_images_180": False,
    },
}


def prompt_config() -> dict:
    """Contents of ``host/prompt.json``."""
    return {
        "template": TEMPLATE,
        "setup": SETUP,
        "control": CONTROL,
        "image_placeholder": "<|image|>",
        "image_start_token": "<im_start>",
        "image_patch_token": "<im_patch>",
        "image_end_token": "<im_end>",
        "state_start_token": "<state_start>",
        "state_end_token": "<state_end>",
        "state_token_format": "<state_{}>",
        "num_state_bins": NUM_STATE_BINS,
        "bos_token": "<|im_end|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "normalize_language": True,
    }


@lru_cache(maxsize=1)
def _special_pattern() -> re.Pattern:
    return re.compile("|".join(re.escape(t) for t in sorted(SPECIAL_TOKENS, key=len, reverse=True)))


def _words(text: str) -> list[str]:
    out: list[str] = []
    for chunk in _special_pattern().split(text):
        out.extend(re.findall(WORD_PATTERN, chunk))
    return out


@lru_cache(maxsize=1)
def _vocabulary() -> tuple[str, ...]:
    texts = [TEMPLATE.format(task="", setup=SETUP, control=CONTROL, state=""), *LIBERO_TASKS]
    words: list[str] = ["[UNK]"]
    seen = set(words)
    for word in [w for t in texts for w in _words(t)] + [str(i) for i in range(10)]:
        if word not in seen:
            seen.add(word)
            words.append(word)
    return (*words, *SPECIAL_TOKENS)


def vocabulary() -> list[str]:
    """Token strings by id: ``[UNK]``, template/task words in first-seen order, digits, specials."""
    return list(_vocabulary())


def tokenizer_json(vocab: list[str]) -> str:
    """A ``tokenizers`` WordLevel tokenizer with Whitespace pre-tokenisation and added specials."""
    specials = set(SPECIAL_TOKENS)
    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, tok in enumerate(vocab) if tok in specials
    ]
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(vocab)},
                  "unk_token": "[UNK]"},
    }
    return json.dumps(data, indent=2, ensure_ascii=False)


def norm_stats() -> dict:
    """A LIBERO-like ``molmoact2_norm_stats.v1`` file (host_glue §10)."""
    action = {
        "names": ["x", "y", "z", "roll", "pitch", "yaw", "gripper"],
        "q01": [-0.7366, -0.7875, -0.9375, -0.1125, -0.1605, -0.2164, -1.0],
        "q99": [0.9375, 0.8625, 0.9375, 0.1307, 0.1886, 0.3354, 1.0],
        "min": [-0.9375, -0.9375, -0.9375, -0.2582, -0.375, -0.3675, -1.0],
        "max": [0.9375, 0.9375, 0.9375, 0.3557, 0.375, 0.375, 1.0],
        "mean": [0.0633, 0.1063, -0.0934, 0.0067, 0.0040, -0.0065, -0.0460],
        "std": [0.3388, 0.3750, 0.4428, 0.0392, 0.0618, 0.0865, 0.9989],
        "mask": [True] * 6 + [False],
        "count": [273465],
    }
    state = {
        "names": ["x", "y", "z", "rx", "ry", "rz", "rw", "gripper"],
        "q01": [-0.4214, -0.2861, 0.0089, 2.1424, -1.0547, -0.5011, 0.0016, -0.0401],
        "q99": [0.1487, 0.2806, 1.2658, 3.3179, 0.9372, 0.4357, 0.0401, -0.0016],
        "min": [-0.4828, -0.3255, -0.0084, 0.3573, -3.6431, -1.8425, -0.0019, -0.0420],
        "max": [0.2107, 0.3901, 1.3379, 3.8689, 2.3637, 1.0998, 0.0421, 0.0013],
        "mean": [-0.0998, 0.0300, 0.8156, 2.9763, -0.0474, -0.0862, 0.0268, -0.0272],
        "std": [0.1067, 0.1537, 0.3788, 0.3298, 0.4021, 0.2026, 0.0139, 0.0139],
        "mask": [True] * 7 + [False],
        "count": [273465],
    }
    libero = {
        "action_key": "action",
        "state_key": "observation.state",
        "camera_keys": ["observation.images.image", "observation.images.wrist_image"],
        "normalize_gripper": False,
        "action_horizon": 10,
        "n_action_steps": 10,
        "setup_type": SETUP,
        "control_mode": CONTROL,
        "action_stats": action,
        "state_stats": state,
    }
    return {"format": "molmoact2_norm_stats.v1", "norm_mode": "q01_q99",
            "metadata_by_tag": {"libero": libero}}


def synthetic_image(seed: int, size: int = 256) -> np.ndarray:
    """A smooth, deterministic, random-ish RGB picture (uint8 [size, size, 3])."""
    return _synthetic_image(seed, size).copy()


@lru_cache(maxsize=16)
def _synthetic_image(seed: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    img = np.empty((size, size, 3), dtype=np.float64)
    img[...] = rng.uniform(70.0, 180.0, 3)
    for _ in range(4):
        fx, fy = rng.uniform(-3.0, 3.0, 2)
        phase = rng.uniform(0.0, 2 * np.pi, 3)
        amp = rng.uniform(10.0, 35.0, 3)
        img += amp * np.sin(2 * np.pi * (fx * xx + fy * yy)[..., None] + phase)
    for _ in range(5):
        cx, cy = rng.uniform(0.1, 0.9, 2)
        radius = rng.uniform(0.04, 0.15)
        colour = rng.uniform(-90.0, 90.0, 3)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * radius**2))
        img += blob[..., None] * colour
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class TraceInputs:
    """One observation + instruction + noise seed for a golden end-to-end trace."""

    name: str
    instruction: str
    state: tuple[float, ...]
    image_seeds: tuple[int, int]
    seed: int
    flow_steps: int | None  # None: the variant's default


MAIN_TRACE = TraceInputs(
    name="e2e_trace",
    instruction="put both the alphabet soup and the tomato sauce in the basket",
    state=(-0.0523, 0.0184, 1.0931, 3.0913, 0.0121, -0.0842, 0.0312, -0.0309),
    image_seeds=(101, 102),
    seed=7,
    flow_steps=None,
)


def alt_trace(default_flow_steps: int) -> TraceInputs:
    """Another observation whose step count differs from the default (5, or 1 when that is 2).

    The instruction is deliberately unnormalised (case, spaces, final period).
    """
    return TraceInputs(
        name="e2e_trace_alt",
        instruction=("  Pick up the black bowl between the plate and the ramekin "
                     "and place it on the plate. "),
        state=(-0.1874, 0.2213, 0.9517, 2.8876, -0.3308, 0.1577, 0.0127, -0.0131),
        image_seeds=(201, 202),
        seed=11,
        flow_steps=1 if default_flow_steps == 2 else 5,
    )
