"""Tiny model dimensions and deterministic random weights shared by the graphs and the reference."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

Weights = dict[str, np.ndarray]


@dataclass(frozen=True)
class TinyDims:
    """Shrunk geometry: real sequence/patch/action shapes, small widths, heads and depth."""

    vision_width: int = 32
    vision_heads: int = 2
    vision_mlp: int = 64
    projector_mlp: int = 64
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    layers_per_split: int = 2
    num_splits: int = 4
    llm_mlp: int = 128
    rope_theta: float = 10000.0
    action_width: int = 48
    action_heads: int = 4
    action_mlp: int = 96
    time_half: int = 16
    eps: float = 1e-6
    patches: int = 729
    patch_dim: int = 588
    horizon: int = 10
    max_action_dim: int = 32

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def num_layers(self) -> int:
        return self.layers_per_split * self.num_splits

    @property
    def action_head_dim(self) -> int:
        return self.action_width // self.action_heads

    @property
    def vision_head_dim(self) -> int:
        return self.vision_width // self.vision_heads


def _rng(seed: int, name: str) -> np.random.Generator:
    """One generator per tensor name, so a weight never depends on which others exist."""
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (_rng(seed, name).standard_normal(shape) * std).astype(np.float32)


def _linear(seed: int, name: str, fan_in: int, fan_out: int, gain: float = 1.0) -> np.ndarray:
    """[fan_in, fan_out] ~ N(0, gain²/fan_in): activations keep their scale."""
    return _normal(seed, name, (fan_in, fan_out), gain / np.sqrt(fan_in))


def _norm_weight(seed: int, name: str, width: int) -> np.ndarray:
    return (1.0 + _normal(seed, name, (width,), 0.1)).astype(np.float32)


def make_weights(
    dims: TinyDims, vocab_size: int, image_tokens_per_camera: int, seed: int
) -> Weights:
    """All weights of the seven components, keyed by dotted names; float32 except ``embed``.

    ``embed`` is the float16 token table (what the host ships as ``embeddings.npy``).
    """
    d = dims
    w: Weights = {}
    dv, h, kv, da = d.vision_width, d.hidden, d.kv_width, d.action_width

    def lin(name: str, fan_in: int, fan_out: int, gain: float = 1.0) -> None:
        w[name] = _linear(seed, name, fan_in, fan_out, gain)

    def bias(name: str, width: int, std: float = 0.02) -> None:
        w[name] = _normal(seed, name, (width,), std)

    def norm(name: str, width: int) -> None:
        w[name] = _norm_weight(seed, name, width)

    # vision: patch embedding, one pre-norm block, fixed pooling, SwiGLU projector
    lin("vision.patch_w", d.patch_dim, dv, 1.5)
    bias("vision.patch_b", dv)
    w["vision.pos"] = _normal(seed, "vision.pos", (d.patches, dv), 0.5)
    norm("vision.ln1", dv)
    for p in ("wq", "wk", "wv"):
        lin(f"vision.{p}", dv, dv)
    lin("vision.wo", dv, dv, 0.7)
    norm("vision.ln2", dv)
    lin("vision.mlp_gate", dv, d.vision_mlp)
    lin("vision.mlp_up", dv, d.vision_mlp)
    lin("vision.mlp_down", d.vision_mlp, dv, 0.7)
    logits = _normal(seed, f"vision.pool_logits.{image_tokens_per_camera}",
                     (image_tokens_per_camera, d.patches), 4.0).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    pool = np.exp(logits)
    w["vision.pool"] = (pool / pool.sum(axis=1, keepdims=True)).astype(np.float32)
    lin("vision.proj_gate", dv, d.projector_mlp, 1.5)
    lin("vision.proj_up", dv, d.projector_mlp, 1.5)
    lin("vision.proj_down", d.projector_mlp, h, 1.5)

    # token embedding table (float16, as shipped)
    w["embed"] = _normal(seed, "embed", (vocab_size, h), 1.0).astype(np.float16)

    # LLM: Qwen3-style layers
    for layer in range(d.num_layers):
        p = f"llm.{layer}."
        norm(p + "ln1", h)
        lin(p + "wq", h, d.heads * d.head_dim)
        lin(p + "wk", h, kv)
        lin(p + "wv", h, kv)
        norm(p + "q_norm", d.head_dim)
        norm(p + "k_norm", d.head_dim)
        lin(p + "wo", d.heads * d.head_dim, h, 0.5)
        norm(p + "ln2", h)
        lin(p + "mlp_gate", h, d.llm_mlp)
        lin(p + "mlp_up", h, d.llm_mlp)
        lin(p + "mlp_down", d.llm_mlp, h, 0.5)

    # action_context: shared K/V projections
    lin("ctx.wk", kv, da)
    lin("ctx.wv", kv, da)

    # action expert (DiT with adaLN)
    lin("act.t1_w", 2 * d.time_half, da, 1.5)
    bias("act.t1_b", da, 0.1)
    lin("act.t2_w", da, da, 1.5)
    bias("act.t2_b", da, 0.1)
    lin("act.in_w", d.max_action_dim, da, 2.0)
    bias("act.in_b", da, 0.1)
    for layer in range(d.num_layers):
        p = f"act.{layer}."
        lin(p + "mod_w", da, 9 * da, 0.7)
        bias(p + "mod_b", 9 * da, 0.2)
        for name in ("sa_wq", "sa_wk", "sa_wv", "ca_wq"):
            lin(p + name, da, da)
        lin(p + "sa_wo", da, da, 0.7)
        lin(p + "ca_wo", da, da, 0.7)
        lin(p + "mlp_gate", da, d.action_mlp)
        lin(p + "mlp_up", da, d.action_mlp)
        lin(p + "mlp_down", d.action_mlp, da, 0.7)
    lin("act.final_w", da, 2 * da, 0.5)
    bias("act.final_b", 2 * da, 0.1)
    # A denoising prior: the output layer partly inverts the input embedding (v ≈ −x + context
    # terms), so the flow contracts the noise like a trained expert instead of drifting with it.
    inverse = np.linalg.pinv(w["act.in_w"].astype(np.float64)).astype(np.float32)
    w["act.out_w"] = (_linear(seed, "act.out_w", da, d.max_action_dim, 0.5) - inverse)
    bias("act.out_b", d.max_action_dim, 0.1)
    return w
