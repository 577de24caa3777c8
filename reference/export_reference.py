"""Export the reference bundle: a tiny MolmoAct2 built by LeRobot's own model code.

The model, its processor and ``predict_action`` are LeRobot's vendored Hugging Face MolmoAct2
(``src/lerobot/policies/molmoact2/molmoact2_hf_model/``) at a pinned commit; nothing here
re-implements the model. This script only composes a tiny config, initialises it with a seed,
splits it into the seven sessions of the package's contract through thin wrappers around the
model's own submodules, exports them to ONNX and records PyTorch goldens. See
docs/reference_bundle.md for the layout and what the bundle proves.

    python reference/export_reference.py --lerobot LEROBOT_CHECKOUT --out OUT_DIR [--archive A]

Runs in its own environment (reference/requirements.txt), never in the package's.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import types
import zipfile
from pathlib import Path

PINNED_COMMIT = "7427f31801f944f5ec9ce53cda02862ce7d1638b"
#: File an archive extraction of LeRobot carries to name its commit (a git checkout needs none).
COMMIT_FILE = "LEROBOT_COMMIT"
HF_MODEL = "lerobot.policies.molmoact2.molmoact2_hf_model"
FORMAT = "molmoact2_reference_bundle.v1"

SEED = 20260527
S = 488                      # the published fused sequence length
FLOW_STEPS = (10, 2)         # the fused default and the 2-step variant
ACTION_MODES = ("both", "continuous")
HORIZON, MAX_ACTION_DIM, ACTION_DIM, STATE_DIM = 10, 32, 7, 8
OPSET = 18

# ---------------------------------------------------------------------------------------------
# Vocabulary: Qwen's BPE (dashscope's qwen.tiktoken) + the special and added tokens.
# ---------------------------------------------------------------------------------------------
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
#: Qwen3's special tokens, ids 151643..151668.
QWEN3_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
#: The robot prompt's tokens, in Qwen3's unused rows from 151669 (this layout is our choice).
ROBOT_TOKENS = ("<action_output>", "<state_start>", "<state_end>", "<setup_start>",
                "<setup_end>", "<control_start>", "<control_end>")
NUM_STATE_TOKENS = 256
#: After the state tokens: <action_start>/<action_end> (151932/151933, as the released config
#: names them), then two reserved rows so that the image tokens land where Molmo2-4B has them.
TAIL_TOKENS = ("<action_start>", "<action_end>", "<|extra_0|>", "<|extra_1|>")
#: Molmo2-4B's image tokens, ids 151936..151945 (the rows of ``wte.new_embedding``).
IMAGE_TOKENS = ("<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<low_res_im_start>",
                "<|image|>", "<im_low>", "<frame_start>", "<frame_end>", "<|video|>")
QWEN_VOCAB = 151643
TEXT_VOCAB = 151936          # rows of wte.embedding (Qwen3's padded vocabulary)
NEW_VOCAB = 128              # rows of wte.new_embedding

# ---------------------------------------------------------------------------------------------
# Inputs of the end-to-end goldens.
# ---------------------------------------------------------------------------------------------
#: LIBERO's task language (the public task names of libero_spatial, _object, _goal and _10).
LIBERO_TASKS = (
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
SHORT_TASK = "turn on the stove"
TOO_LONG_TASK = (
    "Pick up the black bowl that sits between the plate and the ramekin on the left side of "
    "the wooden table, carry it slowly over the cookie box without touching the flowers, then "
    "place it gently in the middle of the plate. After that, open the top drawer of the "
    "wooden cabinet, put the small ketchup bottle inside, close the drawer completely, and "
    "finally push the plate towards the front of the stove until it touches the edge!"
)
SETUP_TYPE = "single franka robotic arm in libero"
CONTROL_MODE = "delta end-effector pose"
NUM_OBSERVATIONS = 3
IMAGE_HW = (256, 256)


# ---------------------------------------------------------------------------------------------
# Small deterministic writers.
# ---------------------------------------------------------------------------------------------
def write_npz(path: Path, arrays: dict) -> None:
    """An uncompressed .npz with fixed member times (np.savez stamps the wall clock)."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            arr = np.asarray(arrays[key])
            if arr.dtype == object:
                raise TypeError(f"{path.name}:{key} is an object array")
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            buf = io.BytesIO()
            if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d arrays 1-d)
                arr = arr.copy(order="C")
            np.lib.format.write_array(buf, arr, allow_pickle=False)
            zf.writestr(info, buf.getvalue())


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# LeRobot import.
# ---------------------------------------------------------------------------------------------
def lerobot_commit(checkout: Path, explicit: str | None) -> str | None:
    """The checkout's commit: ``--lerobot-commit``, else git, else the ``LEROBOT_COMMIT`` file."""
    if explicit:
        return explicit.strip()
    git = shutil.which("git")
    if (checkout / ".git").exists() and git:
        out = subprocess.run([git, "-C", str(checkout), "rev-parse", "HEAD"],  # noqa: S603
                             capture_output=True, text=True, check=False)
        if out.returncode == 0:
            return out.stdout.strip()
    marker = checkout / COMMIT_FILE
    if marker.is_file():
        return marker.read_text().strip()
    return None


def import_hf_model(checkout: Path):
    """Import only the vendored HF model: empty parent packages keep LeRobot itself unloaded."""
    root = checkout / "src" / "lerobot"
    if not (root / "policies" / "molmoact2" / "molmoact2_hf_model").is_dir():
        raise SystemExit(f"{checkout} has no src/lerobot/policies/molmoact2/molmoact2_hf_model")
    # torchvision's PyPI wheel may carry C ops that do not load next to a CPU torch; only the
    # pure-Python transforms.Resize is used, which needs no meta registrations.
    sys.modules.setdefault("torchvision._meta_registrations",
                           types.ModuleType("torchvision._meta_registrations"))
    for name, path in (("lerobot", root), ("lerobot.policies", root / "policies"),
                       ("lerobot.policies.molmoact2", root / "policies" / "molmoact2")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        sys.modules[name] = mod
    modeling = importlib.import_module(f"{HF_MODEL}.modeling_molmoact2")
    config = importlib.import_module(f"{HF_MODEL}.configuration_molmoact2")
    processing = importlib.import_module(f"{HF_MODEL}.processing_molmoact2")
    images = importlib.import_module(f"{HF_MODEL}.image_processing_molmoact2")
    video = importlib.import_module(f"{HF_MODEL}.video_processing_molmoact2")
    return types.SimpleNamespace(modeling=modeling, config=config, processing=processing,
                                 images=images, video=video)


# ---------------------------------------------------------------------------------------------
# Checkpoint: tokenizer, config, weights, processor config, norm stats.
# ---------------------------------------------------------------------------------------------
def special_tokens() -> list[str]:
    states = tuple(f"<state_{i}>" for i in range(NUM_STATE_TOKENS))
    tokens = [*QWEN3_SPECIALS, *ROBOT_TOKENS, *states, *TAIL_TOKENS, *IMAGE_TOKENS]
    assert QWEN_VOCAB + len(tokens) == TEXT_VOCAB + len(IMAGE_TOKENS)
    return tokens


def write_tokenizer(ckpt: Path, work: Path) -> None:
    """tokenizer.json / tokenizer_config.json as transformers' Qwen2Tokenizer saves them."""
    import dashscope
    from tokenizers import normalizers
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tiktoken_file = Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"
    specials = special_tokens()
    tok = TikTokenConverter(vocab_file=str(tiktoken_file), pattern=QWEN_PATTERN,
                            extra_special_tokens=specials).converted()
    tok.normalizer = normalizers.NFC()
    if tok.get_vocab_size() != QWEN_VOCAB + len(specials):
        raise SystemExit(f"unexpected vocabulary size {tok.get_vocab_size()}")
    raw = work / "raw_tokenizer"
    raw.mkdir(parents=True, exist_ok=True)
    tok.save(str(raw / "tokenizer.json"))
    write_json(raw / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 32768,
        "split_special_tokens": False, "errors": "replace",
    })
    hf = Qwen2Tokenizer.from_pretrained(str(raw))
    hf.save_pretrained(str(ckpt))
    for extra in ("special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt",
                  "added_tokens.json"):
        (ckpt / extra).unlink(missing_ok=True)
    # Molmo2-style tokenizer_config: no BOS token, <|im_end|> as EOS, <|endoftext|> as pad.
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    cfg.update(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    write_json(ckpt / "tokenizer_config.json", cfg)


def prompt_tokens(tokenizer, task: str) -> int:
    """Prompt length for ``task`` (tokens of " task" counted as in the template, plus BOS)."""
    text = (f"Image 1{'<im_start>' + '<im_patch>' * 196 + '<im_end>'}Image 2"
            f"{'<im_start>' + '<im_patch>' * 196 + '<im_end>'}<|im_start|>user\nThe task is to"
            f" {task}. The setup is <setup_start>{SETUP_TYPE}<setup_end>. The current state of "
            "the robot is <state_start>" + "<state_0>" * STATE_DIM + "<state_end>. The expected "
            f"control mode is <control_start>{CONTROL_MODE}<control_end>. Given these, what "
            "action should the robot take to complete the task?<|im_end|>\n<|im_start|>"
            "assistant\n<action_output>")
    return 1 + len(tokenizer(text)["input_ids"])


def token_ids(tokenizer) -> dict[str, int]:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in special_tokens()}
    expect = {"<|endoftext|>": 151643, "<|im_end|>": 151645, "<im_start>": 151936,
              "<im_end>": 151937, "<im_patch>": 151938, "<state_0>": 151676,
              "<action_start>": 151932}
    for token, want in expect.items():
        if ids[token] != want:
            raise SystemExit(f"{token} has id {ids[token]}, expected {want}")
    return ids


def build_config(hf, ids: dict[str, int], action_mode: str):
    c = hf.config
    vit = c.MolmoAct2VitConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, image_default_input_size=(378, 378),
        image_patch_size=14, image_num_pos=729, attn_implementation="sdpa")
    adapter = c.MolmoAct2AdapterConfig(
        vit_layers=(-2, -3), pooling_attention_mask=True, hidden_size=32, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, text_hidden_size=64,
        attn_implementation="sdpa")
    text = c.MolmoAct2TextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=TEXT_VOCAB, additional_vocab_size=NEW_VOCAB, qkv_bias=True,
        num_hidden_layers=4, intermediate_size=128, max_position_embeddings=4096,
        rope_theta=5000000.0, use_qk_norm=True, qk_norm_type="qwen3",
        attn_implementation="sdpa")
    expert = c.MolmoAct2ActionExpertConfig(
        max_action_horizon=HORIZON, max_action_dim=MAX_ACTION_DIM, hidden_size=32,
        num_layers=4, num_heads=2, ffn_multiple_of=32, timestep_embed_dim=32)
    return c.MolmoAct2Config(
        vit_config=vit, adapter_config=adapter, text_config=text, action_expert_config=expert,
        image_start_token_id=ids["<im_start>"], image_end_token_id=ids["<im_end>"],
        image_patch_id=ids["<im_patch>"], image_col_id=ids["<im_col>"],
        low_res_image_start_token_id=ids["<low_res_im_start>"],
        image_low_res_id=ids["<im_low>"], frame_start_token_id=ids["<frame_start>"],
        frame_end_token_id=ids["<frame_end>"],
        max_action_dim=MAX_ACTION_DIM, max_action_horizon=HORIZON, n_obs_steps=1,
        action_mode=action_mode, flow_matching_num_steps=FLOW_STEPS[0],
        action_output_token_id=ids["<action_output>"],
        action_start_token_id=ids["<action_start>"], action_end_token_id=ids["<action_end>"],
        state_start_token_id=ids["<state_start>"], state_end_token_id=ids["<state_end>"],
        state_token_start_id=ids["<state_0>"], num_state_tokens=NUM_STATE_TOKENS,
        add_setup_tokens=True, add_control_tokens=True,
        bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False, attn_implementation="sdpa",
        architectures=["MolmoAct2ForConditionalGeneration"],
    )


def seeded_init(model, used_rows) -> None:
    """N(0, 1/fan_in) weights, O(1) embeddings, norms near 1; unused token rows and lm_head zero.

    Token embedding rows are rounded to float16 so the host's float16 table is exact.
    """
    import torch

    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.ndim >= 2:
                fan_in = p.shape[-1]
                std = 1.0 if name.endswith(("wte.embedding", "wte.new_embedding",
                                            "positional_embedding")) else fan_in ** -0.5
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        wte = model.model.transformer.wte
        table = torch.cat([wte.embedding, wte.new_embedding])
        keep = torch.zeros(table.shape[0], dtype=torch.bool)
        keep[torch.as_tensor(sorted(used_rows))] = True
        table = torch.where(keep[:, None], table, torch.zeros(()))
        table = table.to(torch.float16).to(torch.float32)
        wte.embedding.copy_(table[:TEXT_VOCAB])
        wte.new_embedding.copy_(table[TEXT_VOCAB:])
        # The language-model head serves only discrete decoding, which no golden uses: zero.
        model.lm_head.weight.zero_()


def processor_config() -> dict:
    return {
        "processor_class": "MolmoAct2Processor",
        "image_processor": {
            "image_processor_type": "MolmoAct2ImageProcessor", "crop_mode": "resize",
            "size": {"height": 378, "width": 378}, "resample": 2, "do_convert_rgb": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "max_crops": 1,
            "overlap_margins": [4, 4], "patch_size": 14, "pooling_size": [2, 2],
        },
        "video_processor": {"video_processor_type": "MolmoAct2VideoProcessor"},
        "image_use_col_tokens": False, "use_single_crop_col_tokens": False,
        "use_single_crop_start_token": False, "video_use_col_tokens": False,
        "use_frame_special_tokens": True,
    }


def build_processor(hf, ckpt: Path):
    """As LeRobot's ``_load_local_molmoact2_processor`` builds it (that module needs 3.12)."""
    from transformers import Qwen2Tokenizer

    cfg = json.loads((ckpt / "processor_config.json").read_text())
    strip = {"auto_map", "processor_class"}
    image_cfg = {k: v for k, v in cfg.get("image_processor", {}).items()
                 if k not in strip | {"image_processor_type"}}
    video_cfg = {k: v for k, v in cfg.get("video_processor", {}).items()
                 if k not in strip | {"video_processor_type"}}
    tokenizer = Qwen2Tokenizer.from_pretrained(str(ckpt))
    tokenizer.padding_side = "left"
    return hf.processing.MolmoAct2Processor(
        image_processor=hf.images.MolmoAct2ImageProcessor(**image_cfg),
        video_processor=hf.video.MolmoAct2VideoProcessor(**video_cfg),
        tokenizer=tokenizer, chat_template=None,
        image_use_col_tokens=cfg.get("image_use_col_tokens", True),
        use_single_crop_col_tokens=cfg.get("use_single_crop_col_tokens"),
        use_single_crop_start_token=cfg.get("use_single_crop_start_token", True),
        video_use_col_tokens=cfg.get("video_use_col_tokens", False),
        use_frame_special_tokens=cfg.get("use_frame_special_tokens", True),
    )


def norm_stats() -> dict:
    """LIBERO-like statistics of our own choosing (q01_q99, gripper action unnormalised)."""
    def feature(names, q01, q99, mean, std, mask):
        lo = [round(v - 0.1 * abs(v) - 0.05, 4) for v in q01]
        hi = [round(v + 0.1 * abs(v) + 0.05, 4) for v in q99]
        return {"names": names, "q01": q01, "q99": q99, "min": lo, "max": hi, "mean": mean,
                "std": std, "mask": mask, "count": [100000]}
    action = feature(["x", "y", "z", "roll", "pitch", "yaw", "gripper"],
                     [-0.75, -0.8, -0.9, -0.11, -0.16, -0.22, -1.0],
                     [0.94, 0.86, 0.94, 0.13, 0.19, 0.34, 1.0],
                     [0.06, 0.1, -0.09, 0.007, 0.004, -0.0065, -0.05],
                     [0.34, 0.37, 0.44, 0.04, 0.06, 0.09, 1.0],
                     [True, True, True, True, True, True, False])
    state = feature([f"state_{i}" for i in range(STATE_DIM)],
                    [-0.25, -0.3, 0.0, 2.2, -1.1, -0.9, 0.0, -0.04],
                    [0.2, 0.35, 1.3, 3.4, 1.0, 0.6, 0.04, 0.0],
                    [-0.05, 0.03, 0.7, 2.9, -0.05, -0.1, 0.025, -0.025],
                    [0.1, 0.15, 0.3, 0.3, 0.5, 0.3, 0.012, 0.012],
                    [True] * STATE_DIM)
    return {"norm_mode": "q01_q99", "metadata_by_tag": {"libero": {
        "action_horizon": HORIZON, "n_action_steps": HORIZON, "setup_type": SETUP_TYPE,
        "control_mode": CONTROL_MODE, "action_stats": action, "state_stats": state,
        "camera_keys": ["observation.images.image", "observation.images.wrist_image"],
    }}}


def observations():
    """Three observations: smooth seeded images (uint8 HWC RGB) and LIBERO-like 8-D states."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    h, w = IMAGE_HW
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for _ in range(NUM_OBSERVATIONS):
        cams = []
        for _cam in range(2):
            img = np.zeros((h, w, 3), np.float32)
            for c in range(3):
                fx, fy, ph = rng.uniform(0.01, 0.08, 3)
                img[..., c] = 127.5 + 80 * np.sin(fx * xx + 6 * ph) * np.cos(fy * yy - 3 * ph)
            for _blob in range(4):
                cy, cx, r = rng.uniform(20, h - 20), rng.uniform(20, w - 20), rng.uniform(8, 40)
                blob = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
                img[blob] = rng.uniform(0, 255, 3)
            img += rng.normal(0, 6, img.shape)
            cams.append(np.clip(np.rint(img), 0, 255).astype(np.uint8))
        state = np.array([rng.uniform(-0.2, 0.15), rng.uniform(-0.25, 0.3), rng.uniform(0.1, 1.2),
                          rng.uniform(2.4, 3.3), rng.uniform(-0.9, 0.8), rng.uniform(-0.8, 0.5),
                          rng.uniform(0.0, 0.04), rng.uniform(-0.04, 0.0)], dtype=np.float32)
        out.append((cams[0], cams[1], state))
    # one state outside the q01..q99 range: the normaliser's clip shows
    out[2][2][0] = 0.5
    return out


# ---------------------------------------------------------------------------------------------
# Session wrappers around the model's own submodules.
# ---------------------------------------------------------------------------------------------
def wrappers(hf, model, token_pooling, flow_steps: int):
    import torch
    from torch import nn

    mm = model.model
    ctx_cls = hf.modeling.ActionExpertContext

    class Vision(nn.Module):
        """pixel_values [1,C,729,588] -> image_embeds [C*196, H]: MolmoAct2VisionBackbone."""

        def __init__(self):
            super().__init__()
            self.backbone = mm.vision_backbone
            self.register_buffer("pooling", token_pooling.clone(), persistent=False)

        def forward(self, pixel_values):
            return self.backbone(pixel_values, self.pooling)

    class Split(nn.Module):
        """One decoder layer at positions 0..S-1, with the layer's post-RoPE keys/values."""

        def __init__(self, layer: int):
            super().__init__()
            self.block = mm.transformer.blocks[layer]
            self.rotary = mm.transformer.rotary_emb
            self.register_buffer("positions", torch.arange(S)[None], persistent=False)

        def forward(self, hidden_states, attention_bias):
            pos = self.rotary(hidden_states, self.positions)
            out = self.block(hidden_states, position_embeddings=pos,
                             attention_mask=attention_bias, position_ids=self.positions,
                             collect_layer_kv_states=True)
            hidden, k, v = out[0], out[1], out[2]
            k = mm._cache_to_sequence(k)[None]  # [1 layer, 1, S, kv_heads*head_dim]
            v = mm._cache_to_sequence(v)[None]
            return hidden, k, v

    class ActionContext(nn.Module):
        """keys/values [L,1,S,KV] -> k_ctx/v_ctx [L,1,S,AH,AD]: ActionExpert._prepare_kv_context."""

        def __init__(self):
            super().__init__()
            self.expert = mm.action_expert

        def forward(self, keys, values):
            pairs = self.expert._prepare_kv_context(list(zip(keys.unbind(0), values.unbind(0))))
            return (torch.stack([k for k, _ in pairs]), torch.stack([v for _, v in pairs]))

    class ActionStep(nn.Module):
        """One iteration of _run_action_flow_loop with dt = 1/flow_steps baked in."""

        def __init__(self):
            super().__init__()
            self.expert = mm.action_expert
            self.dt = 1.0 / flow_steps

        def forward(self, trajectory, timestep, k_ctx, v_ctx, encoder_attention_mask,
                    action_dim_is_pad):
            ex = self.expert
            rope = None
            if ex.blocks[0].self_attn.rope is not None:
                rope = ex.blocks[0].self_attn.rope.build_cache(
                    seq_len=trajectory.shape[1], device=trajectory.device, dtype=k_ctx.dtype)
            context = ctx_cls(
                kv_contexts=list(zip(k_ctx.unbind(0), v_ctx.unbind(0))),
                cross_mask=ex._build_cross_attention_mask(encoder_attention_mask, 1, k_ctx.dtype),
                self_mask=ex._build_self_attention_mask(None, trajectory.shape[1],
                                                        trajectory.device, k_ctx.dtype),
                valid_action=None, rope_cache=rope)
            velocity = ex.forward_with_context(trajectory, timestep, context=context)
            pad = action_dim_is_pad > 0.5
            velocity = mm._mask_action_dim_tensor(velocity, action_dim_is_pad=pad,
                                                  enabled=model.config.mask_action_dim_padding)
            nxt = trajectory + self.dt * velocity
            return mm._mask_action_dim_tensor(nxt, action_dim_is_pad=pad,
                                              enabled=model.config.mask_action_dim_padding)

    return Vision(), [Split(i) for i in range(4)], ActionContext(), ActionStep()


# ---------------------------------------------------------------------------------------------
# The exporter.
# ---------------------------------------------------------------------------------------------
class Recorder:
    """Records what predict_action hands its processor and action generator."""

    def __init__(self, model, processor):
        self.model, self.processor, self.calls = model, processor, {}

    def __call__(self, **kwargs):
        out = self.processor(**kwargs)
        text = kwargs["text"]
        self.calls["text"] = text[0] if isinstance(text, (list, tuple)) else text
        self.calls["inputs"] = {k: (v.clone() if hasattr(v, "clone") else v)
                                for k, v in out.items()}
        return out

    def install(self):
        mm = self.model.model
        gen, mask_fn = mm.generate_actions_from_inputs, mm._get_encoder_attention_mask
        loop = mm._run_action_flow_loop

        def generate(**kw):
            out = gen(**kw)
            self.calls["trajectory"] = out.detach().clone()
            return out

        def encoder_mask(input_ids, attention_mask):
            out = mask_fn(input_ids, attention_mask)
            self.calls["encoder_attention_mask"] = out.detach().clone()
            return out

        def run_loop(inputs, steps):
            self.calls["initial_trajectory"] = inputs.trajectory.detach().clone()
            return loop(inputs, steps)

        mm.generate_actions_from_inputs = generate
        mm._get_encoder_attention_mask = encoder_mask
        mm._run_action_flow_loop = run_loop


def load_model(hf, ckpt: Path):
    """from_pretrained, then the safetensors reloaded strictly (transformers 5 re-initialises)."""
    import torch
    from safetensors.torch import load_file

    model = hf.modeling.MolmoAct2ForConditionalGeneration.from_pretrained(
        str(ckpt), attn_implementation="sdpa", dtype=torch.float32)
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")), strict=True)
    model.eval()
    if model.config.adapter_config._attn_implementation != "sdpa":
        raise SystemExit("the vision adapter did not get sdpa attention")
    return model


def export_onnx(module, args, path: Path, in_names, out_names) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    program = torch.onnx.export(module, tuple(args), dynamo=True, opset_version=OPSET,
                                input_names=list(in_names), output_names=list(out_names),
                                optimize=True, verify=False, external_data=False)
    program.save(str(path), external_data=False)
    strip_metadata(path)


def strip_metadata(path: Path) -> None:
    """Drop the exporter's per-node provenance (stack traces with this machine's file paths,
    FX node text): the graph's bytes then depend only on the model, not on where it ran."""
    import onnx

    model = onnx.load(str(path))
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        del graph.metadata_props[:]
        graph.doc_string = ""
        for node in graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
            for attr in node.attribute:
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)
    for function in model.functions:
        del function.metadata_props[:]
        for node in function.node:
            del node.metadata_props[:]
            node.doc_string = ""
    del model.metadata_props[:]
    model.doc_string = ""
    onnx.save(model, str(path))


def run_onnx(path: Path, feeds: dict):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lerobot", required=True, type=Path, help="LeRobot checkout or archive")
    p.add_argument("--out", required=True, type=Path, help="output folder (must not exist)")
    p.add_argument("--archive", type=Path, help="also write the deterministic .tar.xz here")
    p.add_argument("--lerobot-commit", help="the checkout's commit, when it is no git checkout "
                   f"and has no {COMMIT_FILE} file")
    p.add_argument("--allow-other-commit", action="store_true",
                   help=f"accept a LeRobot commit other than {PINNED_COMMIT[:12]}")
    a = p.parse_args(argv)

    commit = lerobot_commit(a.lerobot, a.lerobot_commit)
    if commit != PINNED_COMMIT and not a.allow_other_commit:
        raise SystemExit(f"LeRobot at {a.lerobot} is commit {commit or 'unknown'}, not the pinned "
                         f"{PINNED_COMMIT}; write the commit to {a.lerobot}/{COMMIT_FILE}, pass "
                         "--lerobot-commit, or --allow-other-commit")
    if a.out.exists():
        raise SystemExit(f"{a.out} exists; give a new folder")
    t0 = time.perf_counter()

    import numpy as np
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    hf = import_hf_model(a.lerobot)
    out = a.out
    work = out.parent / (out.name + ".work")
    shutil.rmtree(work, ignore_errors=True)
    ckpt = out / "checkpoint"
    ckpt.mkdir(parents=True)
    report: dict = {"lerobot_commit": commit, "versions": {
        "torch": torch.__version__,
        "transformers": importlib.import_module("transformers").__version__,
        "onnx": importlib.import_module("onnx").__version__,
        "onnxruntime": importlib.import_module("onnxruntime").__version__,
        "numpy": np.__version__}}

    # -- tokenizer, processor config, norm stats ------------------------------------------------
    write_tokenizer(ckpt, work)
    write_json(ckpt / "processor_config.json", processor_config())
    write_json(ckpt / "norm_stats.json", norm_stats())
    from transformers import Qwen2Tokenizer

    tokenizer = Qwen2Tokenizer.from_pretrained(str(ckpt))
    ids = token_ids(tokenizer)
    obs = observations()
    # Prompt lengths with the real vocabulary: the longest LIBERO instruction that fits S, and
    # the longest one (which, with 2 x 198 image tokens and the scaffold, does not).
    by_len = sorted(LIBERO_TASKS, key=lambda t: (prompt_tokens(tokenizer, t), t))
    fit = [t for t in by_len if prompt_tokens(tokenizer, t) <= S]
    instructions = {"short": SHORT_TASK, "libero_fit": fit[-1], "libero_longest": by_len[-1],
                    "too_long": TOO_LONG_TASK}

    # -- model: which embedding rows are used, then init, save, reload ------------------------
    config = build_config(hf, ids, "both")
    model = hf.modeling.MolmoAct2ForConditionalGeneration(config).eval()
    used = set(range(QWEN_VOCAB, TEXT_VOCAB + len(IMAGE_TOKENS)))
    processor_probe = None
    seeded_init(model, used)  # provisional: the prompts are tokenised below with the processor
    ckpt_tmp = work / "probe"
    model.save_pretrained(str(ckpt_tmp), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "processor_config.json",
                 "norm_stats.json"):
        shutil.copyfile(ckpt / name, ckpt_tmp / name)
    processor_probe = build_processor(hf, ckpt_tmp)
    probe = load_model(hf, ckpt_tmp)
    rec = Recorder(probe, processor_probe)
    rec.install()
    for prim, wrist, state in obs:
        for text in instructions.values():
            probe.predict_action(processor=rec, images=[prim, wrist], task=text, state=state,
                                 norm_tag="libero", inference_action_mode="continuous",
                                 num_steps=2, generator=torch.Generator().manual_seed(0),
                                 enable_cuda_graph=False)
            used.update(int(i) for i in rec.calls["inputs"]["input_ids"].reshape(-1))
    model = hf.modeling.MolmoAct2ForConditionalGeneration(config).eval()
    seeded_init(model, used)
    model.save_pretrained(str(ckpt), safe_serialization=True)
    (ckpt / "generation_config.json").unlink(missing_ok=True)
    (ckpt / "configuration_molmoact2.py").unlink(missing_ok=True)  # loaded from LeRobot instead
    report["used_embedding_rows"] = len(used)
    report["parameters"] = int(sum(p.numel() for p in model.parameters()))

    # The continuous-mode checkpoint: the same files, config.json's action_mode changed.
    ckpt_c = out / "checkpoint_continuous"
    ckpt_c.mkdir()
    for f in sorted(ckpt.iterdir()):
        os.link(f, ckpt_c / f.name) if f.name != "config.json" else None
    cfg_c = json.loads((ckpt / "config.json").read_text())
    cfg_c["action_mode"] = "continuous"
    (ckpt_c / "config.json").write_text(json.dumps(cfg_c, indent=2, sort_keys=True) + "\n")

    processor = build_processor(hf, ckpt)
    models = {"both": load_model(hf, ckpt), "continuous": load_model(hf, ckpt_c)}
    ref = models["both"]
    for name, tensor in ref.state_dict().items():
        if not torch.equal(tensor, model.state_dict()[name]):
            raise SystemExit(f"reloaded tensor {name} differs from the saved one")
    report["checks"] = {"reload_bit_exact": True}

    # -- end-to-end goldens through predict_action ---------------------------------------------
    e2e = out / "reference"
    improc = processor.image_processor

    def resized(img):
        """The image processor's own resize (torchvision, antialias off), back on the u8 grid."""
        size = [improc.size["height"], improc.size["width"]]
        unit = hf.images.resize_image(img, size, improc.resample)
        return np.rint(unit * 255.0).astype(np.uint8)

    write_npz(e2e / "observations.npz", {
        "image_primary": np.stack([o[0] for o in obs]),
        "image_wrist": np.stack([o[1] for o in obs]),
        "state": np.stack([o[2] for o in obs]),
        "resized_primary": np.stack([resized(o[0]) for o in obs]),
        "resized_wrist": np.stack([resized(o[1]) for o in obs]),
    })
    cases = []
    timings = []
    for mode, mdl in models.items():
        rec = Recorder(mdl, processor)
        rec.install()
        for oi, (prim, wrist, state) in enumerate(obs):
            for iname, text in instructions.items():
                for steps in FLOW_STEPS:
                    seed = 1000 + oi
                    t = time.perf_counter()
                    chunk = mdl.predict_action(
                        processor=rec, images=[prim, wrist], task=text, state=state,
                        norm_tag="libero", inference_action_mode="continuous", num_steps=steps,
                        generator=torch.Generator().manual_seed(seed), enable_cuda_graph=False,
                    ).actions
                    timings.append(time.perf_counter() - t)
                    noise = torch.randn((1, HORIZON, MAX_ACTION_DIM),
                                        generator=torch.Generator().manual_seed(seed))
                    init = rec.calls["initial_trajectory"]
                    pad = torch.zeros(MAX_ACTION_DIM, dtype=torch.bool)
                    pad[ACTION_DIM:] = True
                    if not torch.equal(init, noise.masked_fill(pad, 0)):
                        raise SystemExit("the recorded noise is not the loop's initial trajectory")
                    inputs = rec.calls["inputs"]
                    input_ids = inputs["input_ids"][0].numpy().astype(np.int64)
                    name = f"e2e_o{oi}_{iname}_{mode}_{steps}steps"
                    traj = rec.calls["trajectory"][0].numpy().astype(np.float32)
                    arrays = {
                        "observation": np.int64(oi), "image_primary": prim, "image_wrist": wrist,
                        "state": state, "instruction": np.str_(text),
                        "instruction_kind": np.str_(iname), "action_mode": np.str_(mode),
                        "flow_steps": np.int64(steps), "seed": np.int64(seed),
                        "noise": noise.numpy().astype(np.float32),
                        "prompt_text": np.str_(rec.calls["text"]),
                        "input_ids": input_ids,
                        "token_type_ids": inputs["token_type_ids"][0].numpy().astype(bool),
                        "encoder_attention_mask":
                            rec.calls["encoder_attention_mask"][0].numpy().astype(bool),
                        "action_dim_is_pad": pad.numpy(),
                        "seq_len": np.int64(S), "fits": np.bool_(len(input_ids) <= S),
                        "trajectory": traj,
                        "actions_normalized": traj[:, :ACTION_DIM].copy(),
                        "chunk": chunk[0].numpy().astype(np.float32),
                    }
                    write_npz(e2e / f"{name}.npz", arrays)
                    cases.append({"file": f"reference/{name}.npz", "observation": oi,
                                  "instruction": iname, "action_mode": mode, "flow_steps": steps,
                                  "tokens": int(len(input_ids)),
                                  "fits": bool(len(input_ids) <= S)})
    report["cases"] = cases
    report["predict_action_seconds"] = {"median": float(np.median(timings)),
                                        "max": float(np.max(timings))}

    # -- the seven sessions at S, from observation 0 and the LIBERO instruction ----------------
    prim, wrist, state = obs[0]
    rec = Recorder(ref, processor)
    rec.install()
    seed = 1000
    ref.predict_action(processor=rec, images=[prim, wrist], task=instructions["short"],
                       state=state, norm_tag="libero", inference_action_mode="continuous",
                       num_steps=FLOW_STEPS[0], generator=torch.Generator().manual_seed(seed),
                       enable_cuda_graph=False)
    want_traj = rec.calls["trajectory"]
    inputs = rec.calls["inputs"]
    mm = ref.model
    with torch.no_grad():
        images, pooling = mm.merge_visual_inputs(
            input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"],
            image_token_pooling=inputs["image_token_pooling"], image_grids=inputs["image_grids"],
            image_num_crops=inputs["image_num_crops"])
        n = inputs["input_ids"].shape[1]
        pad_id = ids["<|endoftext|>"]
        ids_s = torch.full((1, S), pad_id, dtype=torch.long)
        ids_s[0, :n] = inputs["input_ids"][0]
        valid = torch.zeros((1, S), dtype=torch.long)
        valid[0, :n] = 1
        tt = torch.zeros((1, S), dtype=torch.bool)
        tt[0, :n] = inputs["token_type_ids"][0]
        hidden, _ = mm.build_input_embeddings(ids_s, images, pooling)
        bias = mm._build_native_attention_bias(inputs_embeds=hidden, attention_mask=valid,
                                               token_type_ids=tt, past_key_values=None)
        enc = mm._get_encoder_attention_mask(ids_s, valid).to(torch.float32)
        pad = torch.zeros((1, MAX_ACTION_DIM), dtype=torch.float32)
        pad[0, ACTION_DIM:] = 1.0

    golden: dict[int, dict] = {}
    sessions = {}
    for steps in FLOW_STEPS:
        vision, splits, action_ctx, action_step = wrappers(hf, ref, pooling, steps)
        io_ = {}
        with torch.no_grad():
            emb = vision(images)
            io_["vision"] = {"pixel_values": images, "image_embeds": emb}
            x, ks, vs = hidden, [], []
            for i, sp in enumerate(splits):
                h2, k, v = sp(x, bias)
                io_[f"llm_split{i}"] = {"hidden_states": x, "attention_bias": bias,
                                        "hidden_out": h2, "keys": k, "values": v}
                x = h2
                ks.append(k)
                vs.append(v)
            keys, values = torch.cat(ks), torch.cat(vs)
            k_ctx, v_ctx = action_ctx(keys, values)
            io_["action_context"] = {"keys": keys, "values": values, "k_ctx": k_ctx,
                                     "v_ctx": v_ctx}
            noise = torch.randn((1, HORIZON, MAX_ACTION_DIM),
                                generator=torch.Generator().manual_seed(seed))
            traj = noise.masked_fill(pad.bool(), 0)
            for i in range(steps):
                tstep = torch.full((1,), i / steps, dtype=torch.float32)
                feeds = {"trajectory": traj, "timestep": tstep, "k_ctx": k_ctx, "v_ctx": v_ctx,
                         "encoder_attention_mask": enc, "action_dim_is_pad": pad}
                nxt = action_step(**feeds)
                if i == 1:
                    io_["action_step"] = {**feeds, "next_trajectory": nxt}
                traj = nxt
        golden[steps] = {c: {k: v.detach().numpy().astype(np.float32) if v.is_floating_point()
                             else v.numpy() for k, v in d.items()} for c, d in io_.items()}
        golden[steps]["_trajectory"] = traj[0].numpy()
        sessions[steps] = (vision, splits, action_ctx, action_step)
        if steps == FLOW_STEPS[0]:
            diff = float((traj - want_traj).abs().max())
            report["checks"]["sessions_at_S_vs_predict_action_traj_max_abs"] = diff
            hid_ref = mm.build_input_embeddings(inputs["input_ids"], images, pooling)[0]
            report["checks"]["hidden_states_valid_rows_max_abs"] = float(
                (hidden[:, :n] - hid_ref).abs().max())

    # -- bundles: ONNX + component goldens + e2e traces ----------------------------------------
    t_onnx = time.perf_counter()
    shared = {}
    ort_diff: dict = {}
    for steps in FLOW_STEPS:
        name = "fused" if steps == FLOW_STEPS[0] else f"fused_{steps}step"
        bdir = out / name
        vision, splits, action_ctx, action_step = sessions[steps]
        g = golden[steps]
        graphs = [("vision", "vision_fused", vision, ["pixel_values"], ["image_embeds"])]
        graphs += [(f"llm_split{i}", f"llm_split{i}", sp, ["hidden_states", "attention_bias"],
                    ["hidden_out", "keys", "values"]) for i, sp in enumerate(splits)]
        graphs += [("action_context", "action_context", action_ctx, ["keys", "values"],
                    ["k_ctx", "v_ctx"]),
                   ("action_step", "action_step_fused", action_step,
                    ["trajectory", "timestep", "k_ctx", "v_ctx", "encoder_attention_mask",
                     "action_dim_is_pad"], ["next_trajectory"])]
        for comp, folder, mod, ins, outs in graphs:
            path = bdir / "onnx" / folder / "model.onnx"
            if comp != "action_step" and comp in shared:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.link(shared[comp], path)
            else:
                export_onnx(mod, [torch.from_numpy(g[comp][k]) for k in ins], path, ins, outs)
                shared.setdefault(comp, path)
                got = run_onnx(path, {k: g[comp][k] for k in ins})
                ort_diff[f"{name}/{comp}"] = {
                    k: float(np.abs(got[k] - g[comp][k]).max()) for k in outs}
            gpath = bdir / "golden" / f"{comp}_io.npz"
            if comp != "action_step" and comp in shared and name != "fused":
                gpath.parent.mkdir(parents=True, exist_ok=True)
                os.link(out / "fused" / "golden" / f"{comp}_io.npz", gpath)
            else:
                write_npz(gpath, g[comp])
        write_json(bdir / "bundle.json", {
            "format": "molmoact2_ros.bundle.v1", "variant": "fused", "synthetic": False,
            "seed": SEED})
        # end-to-end through the sessions, from ONNX Runtime, for the record
        report.setdefault("onnx_vs_torch_chain", {})
        x = g["llm_split0"]["hidden_states"]
        ks, vs = [], []
        for i in range(4):
            r = run_onnx(bdir / "onnx" / f"llm_split{i}" / "model.onnx",
                         {"hidden_states": x, "attention_bias": g["llm_split0"]["attention_bias"]})
            x = r["hidden_out"]
            ks.append(r["keys"])
            vs.append(r["values"])
        r = run_onnx(bdir / "onnx" / "action_context" / "model.onnx",
                     {"keys": np.concatenate(ks), "values": np.concatenate(vs)})
        traj = noise.masked_fill(pad.bool(), 0).numpy()
        for i in range(steps):
            traj = run_onnx(bdir / "onnx" / "action_step_fused" / "model.onnx", {
                "trajectory": traj, "timestep": np.array([i / steps], np.float32),
                "k_ctx": r["k_ctx"], "v_ctx": r["v_ctx"],
                "encoder_attention_mask": g["action_step"]["encoder_attention_mask"],
                "action_dim_is_pad": g["action_step"]["action_dim_is_pad"]})["next_trajectory"]
        report["onnx_vs_torch_chain"][name] = float(np.abs(traj[0] - g["_trajectory"]).max())
        # the package's e2e trace format (golden/e2e_trace*.npz) for `parity` end to end
        for fname, oi, iname in (("e2e_trace", 0, "libero_fit"), ("e2e_trace_alt", 1, "short")):
            src = np.load(out / "reference" / f"e2e_o{oi}_{iname}_both_{steps}steps.npz",
                          allow_pickle=False)
            trace = trace_for(ref, processor, src, ids, oi)
            write_npz(bdir / "golden" / f"{fname}.npz", trace)
    report["onnx_vs_torch_max_abs"] = ort_diff
    report["onnx_export_seconds"] = time.perf_counter() - t_onnx

    # -- manifest ----------------------------------------------------------------------------
    report["total_seconds"] = time.perf_counter() - t0
    report["token_ids"] = {k: v for k, v in ids.items() if not k.startswith("<state_")}
    report["instructions"] = instructions
    write_json(work / "report.json", report)
    files = sorted(f for f in out.rglob("*") if f.is_file())
    write_json(out / "MANIFEST.json", {
        "format": FORMAT, "lerobot_commit": commit, "seq_len": S, "flow_steps": list(FLOW_STEPS),
        "instructions": instructions, "cases": cases,
        "files": {str(f.relative_to(out)): sha256(f) for f in files},
    })
    if a.archive:
        write_archive(out, a.archive)
    shutil.rmtree(work / "probe", ignore_errors=True)
    shutil.rmtree(work / "raw_tokenizer", ignore_errors=True)
    print(json.dumps(report, indent=2, sort_keys=True, default=str))
    return 0


def trace_for(model, processor, src, ids, oi):
    """golden/e2e_trace.npz for one case: raw inputs and every host intermediate at S."""
    import numpy as np
    import torch

    inputs = processor(text=str(src["prompt_text"]),
                       images=[src["image_primary"], src["image_wrist"]], return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    mm = model.model
    with torch.no_grad():
        images, pooling = mm.merge_visual_inputs(
            input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"],
            image_token_pooling=inputs["image_token_pooling"], image_grids=inputs["image_grids"],
            image_num_crops=inputs["image_num_crops"])
        ids_s = torch.full((1, S), ids["<|endoftext|>"], dtype=torch.long)
        ids_s[0, :n] = inputs["input_ids"][0]
        valid = torch.zeros((1, S), dtype=torch.long)
        valid[0, :n] = 1
        tt = torch.zeros((1, S), dtype=torch.bool)
        tt[0, :n] = inputs["token_type_ids"][0]
        hidden, _ = mm.build_input_embeddings(ids_s, images, pooling)
        bias = mm._build_native_attention_bias(inputs_embeds=hidden, attention_mask=valid,
                                               token_type_ids=tt, past_key_values=None)
        enc = mm._get_encoder_attention_mask(ids_s, valid).to(torch.float32)
    pad = np.zeros((1, MAX_ACTION_DIM), np.float32)
    pad[0, ACTION_DIM:] = 1
    return {
        "image_primary": src["image_primary"], "image_wrist": src["image_wrist"],
        "image_encoding": np.str_("rgb8"), "state": src["state"],
        "instruction": src["instruction"], "seed": src["seed"], "flow_steps": src["flow_steps"],
        "pixel_values": images.numpy().astype(np.float32), "input_ids": ids_s[0].numpy(),
        "hidden_states": hidden.numpy().astype(np.float32),
        "attention_bias": bias.numpy().astype(np.float32),
        "encoder_attention_mask": enc.numpy(), "action_dim_is_pad": pad,
        "noise": src["noise"], "actions_normalized": src["actions_normalized"],
        "trajectory": src["trajectory"], "chunk": src["chunk"],
    }


def write_archive(root: Path, archive: Path) -> None:
    """One deterministic .tar.xz: sorted members, mtime 0, root-owned, no names; hard links kept."""
    import lzma

    archive.parent.mkdir(parents=True, exist_ok=True)
    entries = sorted(p for p in root.rglob("*"))
    seen: dict[tuple[int, int], str] = {}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in entries:
            rel = "reference_bundle/" + str(path.relative_to(root))
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            st = path.stat()
            key = (st.st_dev, st.st_ino)
            info.mode = 0o644
            if key in seen:
                info.type, info.linkname = tarfile.LNKTYPE, seen[key]
                tar.addfile(info)
                continue
            seen[key] = rel
            data = path.read_bytes()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive.write_bytes(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))


if __name__ == "__main__":
    sys.exit(main())
