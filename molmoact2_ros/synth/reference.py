"""Pure-numpy reference of the tiny model (vision, LLM splits, action expert) and the full trace.

It is the only source of golden files. It imports neither onnx/onnxruntime nor the host/policy
code under test; the host-side maths it needs is in ``reference_host``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from . import reference_host as rh
from .weights import TinyDims, Weights

F32 = np.float32


def _rms(x: np.ndarray, eps: float, weight: np.ndarray | None = None) -> np.ndarray:
    """RMSNorm over the last axis, float32: ``x · 1/sqrt(mean(x²)+eps) [· w]``."""
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    y = x * (F32(1.0) / np.sqrt(ms + F32(eps)))
    return (y * weight if weight is not None else y).astype(F32)


def _silu(x: np.ndarray) -> np.ndarray:
    return (x / (F32(1.0) + np.exp(-x))).astype(F32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32)


def _swiglu(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
    return ((_silu(x @ gate) * (x @ up)) @ down).astype(F32)


def rope_tables(positions: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [positions, head_dim] for the half-split (rotate_half) convention."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(F32), np.sin(ang).astype(F32)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``x·cos + rotate_half(x)·sin`` with rotate_half(x) = [−x2, x1]; x is [..., pos, head_dim]."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rot * sin).astype(F32)


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    """[..., T, n·d] → [..., n, T, d]."""
    *lead, t, width = x.shape
    return np.moveaxis(x.reshape(*lead, t, n, width // n), -2, -3)


def _merge(x: np.ndarray) -> np.ndarray:
    """[..., n, T, d] → [..., T, n·d]."""
    x = np.moveaxis(x, -3, -2)
    return x.reshape(*x.shape[:-2], -1)


@dataclass
class ReferenceModel:
    """The tiny MolmoAct2 maths for one variant, in float32 numpy."""

    weights: Weights
    dims: TinyDims
    seq_len: int
    image_tokens_per_camera: int
    patch_token_id: int
    include_patch_embedding: bool
    euler_in_graph: bool
    euler_baked_steps: int

    # -- vision ----------------------------------------------------------------------------------
    def vision(self, pixel_values: np.ndarray) -> np.ndarray:
        """The vision graph: [1, C, 729, 588] → image_embeds [C·K, H]."""
        return self.image_embeds(self.vision_features(pixel_values))

    def vision_features(self, pixel_values: np.ndarray) -> np.ndarray:
        """Projector output [C·K, H]: what the host adds to ``wte(<im_patch>)``."""
        w, d = self.weights, self.dims
        x = pixel_values[0] @ w["vision.patch_w"] + w["vision.patch_b"] + w["vision.pos"]
        h = _rms(x, d.eps, w["vision.ln1"])
        q, k, v = (_heads(h @ w[f"vision.{p}"], d.vision_heads) for p in ("wq", "wk", "wv"))
        att = _softmax(q @ np.swapaxes(k, -1, -2) * F32(1.0 / np.sqrt(d.vision_head_dim)))
        x = x + _merge(att @ v) @ w["vision.wo"]
        h = _rms(x, d.eps, w["vision.ln2"])
        x = x + _swiglu(h, w["vision.mlp_gate"], w["vision.mlp_up"], w["vision.mlp_down"])
        pooled = w["vision.pool"] @ x
        out = _swiglu(pooled, w["vision.proj_gate"], w["vision.proj_up"], w["vision.proj_down"])
        return out.reshape(-1, d.hidden).astype(F32)

    def image_embeds(self, features: np.ndarray) -> np.ndarray:
        """The vision output: features, plus the fp16 ``<im_patch>`` row if the graph adds it."""
        if not self.include_patch_embedding:
            return features
        return (features + self.weights["embed"][self.patch_token_id].astype(F32)[None])

    # -- LLM --------------------------------------------------------------------------------------
    def llm_split(
        self, index: int, hidden: np.ndarray, bias: np.ndarray
    ) -> dict[str, np.ndarray]:
        """One split: its layers over [1, S, H]; keys/values [layers, 1, S, KV] head-major."""
        w, d = self.weights, self.dims
        cos, sin = rope_tables(hidden.shape[1], d.head_dim, d.rope_theta)
        x = hidden.astype(F32)
        keys, values = [], []
        for layer in range(index * d.layers_per_split, (index + 1) * d.layers_per_split):
            p = f"llm.{layer}."
            h = _rms(x, d.eps, w[p + "ln1"])
            q = _rms(_heads(h @ w[p + "wq"], d.heads), d.eps, w[p + "q_norm"])
            k = _rms(_heads(h @ w[p + "wk"], d.kv_heads), d.eps, w[p + "k_norm"])
            v = _heads(h @ w[p + "wv"], d.kv_heads)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            keys.append(_merge(k))
            values.append(_merge(v))
            group = d.heads // d.kv_heads
            k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = q @ np.swapaxes(k_rep, -1, -2) * F32(1.0 / np.sqrt(d.head_dim)) + bias
            x = x + _merge(_softmax(scores) @ v_rep) @ w[p + "wo"]
            h = _rms(x, d.eps, w[p + "ln2"])
            x = (x + _swiglu(h, w[p + "mlp_gate"], w[p + "mlp_up"], w[p + "mlp_down"])).astype(F32)
        return {"hidden_out": x, "keys": np.stack(keys).astype(F32),
                "values": np.stack(values).astype(F32)}

    # -- action expert ---------------------------------------------------------------------------
    def action_context(self, keys: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
        """keys/values [L, 1, S, KV] → k_ctx/v_ctx [L, 1, S, AH, AD]."""
        w, d = self.weights, self.dims
        shape = (*keys.shape[:-1], d.action_heads, d.action_head_dim)
        k = _rms(_rms(keys @ w["ctx.wk"], d.eps).reshape(shape), d.eps)
        v = _rms(values @ w["ctx.wv"], d.eps).reshape(shape)
        return {"k_ctx": k.astype(F32), "v_ctx": v.astype(F32)}

    def velocity(
        self,
        trajectory: np.ndarray,
        timestep: np.ndarray,
        k_ctx: np.ndarray,
        v_ctx: np.ndarray,
        enc_mask: np.ndarray,
        dim_is_pad: np.ndarray,
    ) -> np.ndarray:
        """The expert's velocity [1, T, A] (padded dims zeroed)."""
        w, d = self.weights, self.dims
        da, nh, hd = d.action_width, d.action_heads, d.action_head_dim
        freqs = np.exp(-np.arange(d.time_half, dtype=np.float64) * np.log(10000.0)
                       / (d.time_half - 1)).astype(F32)
        arg = timestep.astype(F32)[:, None] * freqs[None]
        temb = np.concatenate([np.sin(arg), np.cos(arg)], axis=-1).astype(F32)
        c = _silu(temb @ w["act.t1_w"] + w["act.t1_b"]) @ w["act.t2_w"] + w["act.t2_b"]
        sc = _silu(c)[:, None, :]  # [1, 1, Da]
        x = (trajectory.astype(F32) @ w["act.in_w"] + w["act.in_b"]).astype(F32)
        cos, sin = rope_tables(x.shape[1], hd, 10000.0)
        scale = F32(1.0 / np.sqrt(hd))
        cross_bias = ((F32(1.0) - enc_mask.astype(F32)) * F32(-30000.0))[:, None, None, :]
        for layer in range(d.num_layers):
            p = f"act.{layer}."
            mod = sc @ w[p + "mod_w"] + w[p + "mod_b"]
            chunks = [mod[..., i * da:(i + 1) * da] for i in range(9)]
            shift1, scale1, gate1, shift2, scale2, gate2, shift3, scale3, gate3 = chunks
            h = _rms(x, d.eps) * (F32(1.0) + scale1) + shift1
            q = _rope(_heads(h @ w[p + "sa_wq"], nh), cos, sin)
            k = _rope(_heads(h @ w[p + "sa_wk"], nh), cos, sin)
            v = _heads(h @ w[p + "sa_wv"], nh)
            att = _softmax(q @ np.swapaxes(k, -1, -2) * scale)
            x = x + gate1 * (_merge(att @ v) @ w[p + "sa_wo"])
            h = _rms(x, d.eps) * (F32(1.0) + scale2) + shift2
            q = _rms(_heads(h @ w[p + "ca_wq"], nh), d.eps)
            kc = np.moveaxis(k_ctx[layer], -2, -3)  # [1, AH, S, AD]
            vc = np.moveaxis(v_ctx[layer], -2, -3)
            att = _softmax(q @ np.swapaxes(kc, -1, -2) * scale + cross_bias)
            x = x + gate2 * (_merge(att @ vc) @ w[p + "ca_wo"])
            h = _rms(x, d.eps) * (F32(1.0) + scale3) + shift3
            x = (x + gate3 * _swiglu(h, w[p + "mlp_gate"], w[p + "mlp_up"], w[p + "mlp_down"]))
            x = x.astype(F32)
        fm = sc @ w["act.final_w"] + w["act.final_b"]
        shift, scale_f = fm[..., :da], fm[..., da:]
        h = _rms(x, d.eps) * (F32(1.0) + scale_f) + shift
        vel = h @ w["act.out_w"] + w["act.out_b"]
        return (vel * (F32(1.0) - dim_is_pad.astype(F32))[:, None, :]).astype(F32)

    def action_step(self, trajectory: np.ndarray, timestep: np.ndarray, k_ctx: np.ndarray,
                    v_ctx: np.ndarray, encoder_attention_mask: np.ndarray,
                    action_dim_is_pad: np.ndarray) -> dict[str, np.ndarray]:
        """The action_step graph's output: ``next_trajectory`` (baked Euler) or ``velocity``."""
        vel = self.velocity(trajectory, timestep, k_ctx, v_ctx, encoder_attention_mask,
                            action_dim_is_pad)
        if not self.euler_in_graph:
            return {"velocity": vel}
        keep = (F32(1.0) - action_dim_is_pad.astype(F32))[:, None, :]
        dt = F32(1.0 / self.euler_baked_steps)
        return {"next_trajectory": ((trajectory + vel * dt) * keep).astype(F32)}


@dataclass(frozen=True)
class HostSetup:
    """What the reference host needs besides the model: assets and conventions, as plain data."""

    tokenizer: rh.WordLevelTokenizer
    prompt: Mapping
    norm_stats: Mapping  # the "libero" tag
    conventions: Mapping
    action_dim: int = 7


def prompt_ids(model: ReferenceModel, host: HostSetup, instruction: str,
               state: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(input_ids [S], valid [S], number of valid tokens) for one instruction and state."""
    cfg, tok = host.prompt, host.tokenizer
    task = rh.normalize_task(instruction) if cfg["normalize_language"] else instruction
    bins = rh.state_bins(state, host.norm_stats["state_stats"], cfg["num_state_bins"])
    text = rh.prompt_text(cfg, task, bins, model.image_tokens_per_camera)
    ids, valid = rh.frame_ids(
        tok.encode(text), bos_id=tok.token_id(cfg["bos_token"]),
        pad_id=tok.token_id(cfg["pad_token"]), seq_len=model.seq_len,
        padding_side=host.conventions["padding_side"])
    return ids, valid, int(valid.sum())


def run_trace(model: ReferenceModel, host: HostSetup, *, primary: np.ndarray, wrist: np.ndarray,
              state: np.ndarray, instruction: str, seed: int, flow_steps: int
              ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """The whole pipeline; returns (trace arrays, per-component I/O with action_step at step 1)."""
    cfg, conv, tok = host.prompt, host.conventions, host.tokenizer
    pv = rh.pixel_values(primary, wrist)
    ids, valid, _ = prompt_ids(model, host, instruction, state)
    features = model.vision_features(pv)
    image_embeds = model.image_embeds(features)
    img_ids = [tok.token_id(cfg[k]) for k in
               ("image_start_token", "image_patch_token", "image_end_token")]
    is_img = np.isin(ids, img_ids) & valid
    hidden = rh.embed(model.weights["embed"], ids, tok.token_id(cfg["image_patch_token"]),
                      features)
    bias = rh.attention_bias(valid, is_img, bidirectional=conv["bidirectional_image_attention"],
                             mask_value=conv["mask_value"])
    enc = rh.encoder_mask(ids, valid, tok.token_id(cfg["eos_token"]), conv["encoder_mask"])
    io: dict[str, dict[str, np.ndarray]] = {
        "vision": {"pixel_values": pv, "image_embeds": image_embeds}}
    x, keys, values = hidden, [], []
    for i in range(model.dims.num_splits):
        out = model.llm_split(i, x, bias)
        io[f"llm_split{i}"] = {"hidden_states": x, "attention_bias": bias, **out}
        x = out["hidden_out"]
        keys.append(out["keys"])
        values.append(out["values"])
    kv = {"keys": np.concatenate(keys), "values": np.concatenate(values)}
    ctx = model.action_context(kv["keys"], kv["values"])
    io["action_context"] = {**kv, **ctx}
    pad = rh.action_dim_is_pad(host.action_dim, model.dims.max_action_dim)
    keep = (F32(1.0) - pad)[:, None, :]
    noise = rh.initial_noise(seed, model.dims.horizon, pad)
    traj = noise
    for i in range(flow_steps):
        t = np.array([i / flow_steps], dtype=F32)
        feeds = {"trajectory": traj, "timestep": t, **ctx, "encoder_attention_mask": enc,
                 "action_dim_is_pad": pad}
        vel = model.velocity(traj, t, ctx["k_ctx"], ctx["v_ctx"], enc, pad)
        if i == min(1, flow_steps - 1):
            io["action_step"] = {**feeds, **model.action_step(**feeds)}
        # x + v/N: the baked in-graph step when N = euler_baked_steps; otherwise what the host
        # gets by rescaling that step (v = (next − x)/dt0) or applying its own Euler update.
        traj = ((traj + vel * F32(1.0 / flow_steps)) * keep).astype(F32)
    actions = traj[0, :, : host.action_dim].astype(F32)
    trace = {
        "pixel_values": pv, "input_ids": ids, "hidden_states": hidden, "attention_bias": bias,
        "encoder_attention_mask": enc, "action_dim_is_pad": pad, "noise": noise,
        "actions_normalized": actions,
        "chunk": rh.denormalize(actions, host.norm_stats["action_stats"]),
    }
    return trace, io
