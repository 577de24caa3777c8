"""The seven tiny ONNX graphs (opset 17, float32 I/O), built with ``onnx.helper`` from weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from .onnx_builder import GraphBuilder
from .weights import TinyDims, Weights


@dataclass(frozen=True)
class GraphOptions:
    """The variant facts and conventions the graphs bake in."""

    seq_len: int
    image_tokens_per_camera: int
    num_cameras: int = 2
    patch_token_id: int | None = None  # set: vision adds the fp16 <im_patch> embedding row
    euler_in_graph: bool = True
    euler_baked_steps: int = 10
    mask_value_cross: float = -30000.0


def _rope_cos_sin(positions: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """[positions, head_dim] tables, frequencies repeated over both halves (rotate_half)."""
    half = head_dim // 2
    freq = np.power(float(theta), -2.0 * np.arange(half) / head_dim)
    angle = np.outer(np.arange(positions, dtype=np.float64), freq)
    angle = np.tile(angle, (1, 2))
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def _split_heads(b: GraphBuilder, x: str, lead: list[int], heads: int, head_dim: int) -> str:
    """[*lead, T, heads·hd] → [*lead, heads, T, hd] (lead has the batch dims, then T)."""
    n = len(lead)
    y = b.reshape(x, [*lead, heads, head_dim])
    return b.transpose(y, [*range(n - 1), n, n - 1, n + 1])


def _merge_heads(b: GraphBuilder, x: str, lead: list[int], width: int) -> str:
    """[*lead[:-1], heads, T, hd] → [*lead, heads·hd]."""
    n = len(lead)
    y = b.transpose(x, [*range(n - 1), n, n - 1, n + 1])
    return b.reshape(y, [*lead, width])


def vision_graph(w: Weights, d: TinyDims, opt: GraphOptions) -> onnx.ModelProto:
    """pixel_values [1, C, 729, 588] → image_embeds [C·K, H]."""
    b = GraphBuilder("vision", d.eps)
    c, p, k = opt.num_cameras, d.patches, opt.image_tokens_per_camera
    dv, nh, hd = d.vision_width, d.vision_heads, d.vision_head_dim
    x = b.reshape("pixel_values", [c, p, d.patch_dim])
    x = b.matmul(x, w["vision.patch_w"], "vision.patch_w", w["vision.patch_b"])
    x = b.op("Add", x, b.const(w["vision.pos"], "vision.pos"))
    h = b.rms(x, w["vision.ln1"], "vision.ln1")
    q, kk, v = (_split_heads(b, b.matmul(h, w[f"vision.{n}"], f"vision.{n}"), [c, p], nh, hd)
                for n in ("wq", "wk", "wv"))
    att = b.attention(q, kk, v, float(np.float32(1.0 / np.sqrt(hd))))
    x = b.op("Add", x, b.matmul(_merge_heads(b, att, [c, p], dv), w["vision.wo"], "vision.wo"))
    h = b.rms(x, w["vision.ln2"], "vision.ln2")
    x = b.op("Add", x, b.swiglu(h, w["vision.mlp_gate"], w["vision.mlp_up"],
                                w["vision.mlp_down"], "vision.mlp"))
    pooled = b.op("MatMul", b.const(w["vision.pool"], "vision.pool"), x)
    out = b.swiglu(pooled, w["vision.proj_gate"], w["vision.proj_up"], w["vision.proj_down"],
                   "vision.proj")
    out = b.reshape(out, [c * k, d.hidden])
    if opt.patch_token_id is not None:
        row = w["embed"][opt.patch_token_id].astype(np.float32)[None]
        b.output("Add", "image_embeds", out, b.const(row, "im_patch_embedding"))
    else:
        b.output("Identity", "image_embeds", out)
    return b.model([("pixel_values", [1, c, p, d.patch_dim])],
                   [("image_embeds", [c * k, d.hidden])])


def llm_split_graph(w: Weights, d: TinyDims, opt: GraphOptions, index: int) -> onnx.ModelProto:
    """hidden_states [1,S,H], attention_bias [1,1,S,S] → hidden_out, keys, values [l,1,S,KV]."""
    name = f"llm_split{index}"
    b = GraphBuilder(name, d.eps)
    s, hd, nh, nkv = opt.seq_len, d.head_dim, d.heads, d.kv_heads
    group = nh // nkv
    cos_np, sin_np = _rope_cos_sin(s, hd, d.rope_theta)
    cos, sin = b.const(cos_np, "rope_cos"), b.const(sin_np, "rope_sin")
    scale = float(np.float32(1.0 / np.sqrt(hd)))
    x = "hidden_states"
    keys, values = [], []
    for layer in range(index * d.layers_per_split, (index + 1) * d.layers_per_split):
        p = f"llm.{layer}."
        h = b.rms(x, w[p + "ln1"], p + "ln1")
        q = b.reshape(b.matmul(h, w[p + "wq"], p + "wq"), [1, s, nh, hd])
        q = b.transpose(b.rms(q, w[p + "q_norm"], p + "q_norm"), [0, 2, 1, 3])
        k = b.reshape(b.matmul(h, w[p + "wk"], p + "wk"), [1, s, nkv, hd])
        k = b.transpose(b.rms(k, w[p + "k_norm"], p + "k_norm"), [0, 2, 1, 3])
        v = _split_heads(b, b.matmul(h, w[p + "wv"], p + "wv"), [1, s], nkv, hd)
        q, k = b.rope(q, cos, sin, hd), b.rope(k, cos, sin, hd)
        keys.append(b.reshape(b.transpose(k, [0, 2, 1, 3]), [1, 1, s, d.kv_width]))
        values.append(b.reshape(b.transpose(v, [0, 2, 1, 3]), [1, 1, s, d.kv_width]))
        att = b.attention(b.reshape(q, [1, nkv, group, s, hd]),
                          b.reshape(k, [1, nkv, 1, s, hd]),
                          b.reshape(v, [1, nkv, 1, s, hd]),
                          scale, "attention_bias", rank=5)
        merged = _merge_heads(b, b.reshape(att, [1, nh, s, hd]), [1, s], nh * hd)
        x = b.op("Add", x, b.matmul(merged, w[p + "wo"], p + "wo"))
        h = b.rms(x, w[p + "ln2"], p + "ln2")
        x = b.op("Add", x, b.swiglu(h, w[p + "mlp_gate"], w[p + "mlp_up"], w[p + "mlp_down"],
                                    p + "mlp"))
    b.output("Identity", "hidden_out", x)
    b.output("Concat", "keys", *keys, axis=0)
    b.output("Concat", "values", *values, axis=0)
    kv = [d.layers_per_split, 1, s, d.kv_width]
    return b.model(
        [("hidden_states", [1, s, d.hidden]), ("attention_bias", [1, 1, s, s])],
        [("hidden_out", [1, s, d.hidden]), ("keys", kv), ("values", kv)],
    )


def action_context_graph(w: Weights, d: TinyDims, opt: GraphOptions) -> onnx.ModelProto:
    """keys/values [L,1,S,KV] → k_ctx/v_ctx [L,1,S,AH,AD]: shared projections, plain norms."""
    b = GraphBuilder("action_context", d.eps)
    s, n = opt.seq_len, d.num_layers
    ctx_shape = [n, 1, s, d.action_heads, d.action_head_dim]
    k = b.reshape(b.rms(b.matmul("keys", w["ctx.wk"], "ctx.wk")), ctx_shape)
    b.output("Identity", "k_ctx", b.rms(k))
    v = b.reshape(b.rms(b.matmul("values", w["ctx.wv"], "ctx.wv")), ctx_shape)
    b.output("Identity", "v_ctx", v)
    kv = [n, 1, s, d.kv_width]
    return b.model([("keys", kv), ("values", kv)], [("k_ctx", ctx_shape), ("v_ctx", ctx_shape)])


def _adaln(b: GraphBuilder, x: str, shift: str, scale: str) -> str:
    """``RMSNorm(x)·(1+scale) + shift`` (weight-less norm)."""
    return b.op("Add", b.op("Mul", b.rms(x), b.op("Add", b.const(1.0), scale)), shift)


def action_step_graph(w: Weights, d: TinyDims, opt: GraphOptions) -> onnx.ModelProto:
    """One flow step of the DiT action expert; baked Euler → next_trajectory, else velocity."""
    b = GraphBuilder("action_step", d.eps)
    s, t_len, a = opt.seq_len, d.horizon, d.max_action_dim
    da, nh, hd = d.action_width, d.action_heads, d.action_head_dim
    scale = float(np.float32(1.0 / np.sqrt(hd)))
    freqs = np.exp(-np.arange(d.time_half) * np.log(10000.0) / (d.time_half - 1))
    arg = b.op("Mul", b.op("Unsqueeze", "timestep", b.ints([1])),
               b.const(freqs.astype(np.float32), "time_freqs"))
    temb = b.op("Concat", b.op("Sin", arg), b.op("Cos", arg), axis=-1)
    c = b.silu(b.matmul(temb, w["act.t1_w"], "act.t1_w", w["act.t1_b"]))
    c = b.matmul(c, w["act.t2_w"], "act.t2_w", w["act.t2_b"])
    sc = b.reshape(b.silu(c), [1, 1, da])
    x = b.matmul("trajectory", w["act.in_w"], "act.in_w", w["act.in_b"])
    cos_np, sin_np = _rope_cos_sin(t_len, hd, 10000.0)
    cos, sin = b.const(cos_np, "rope_cos"), b.const(sin_np, "rope_sin")
    one = b.const(1.0)
    cross_bias = b.reshape(
        b.op("Mul", b.op("Sub", one, "encoder_attention_mask"), b.const(opt.mask_value_cross)),
        [1, 1, 1, s])
    for layer in range(d.num_layers):
        p = f"act.{layer}."
        mod = b.matmul(sc, w[p + "mod_w"], p + "mod_w", w[p + "mod_b"])
        shift1, scale1, gate1, shift2, scale2, gate2, shift3, scale3, gate3 = b.ops(
            "Split", mod, b.ints([da] * 9), axis=-1, n_out=9)
        h = _adaln(b, x, shift1, scale1)
        q, k, v = (_split_heads(b, b.matmul(h, w[p + n], p + n), [1, t_len], nh, hd)
                   for n in ("sa_wq", "sa_wk", "sa_wv"))
        att = b.attention(b.rope(q, cos, sin, hd), b.rope(k, cos, sin, hd), v, scale)
        out = b.matmul(_merge_heads(b, att, [1, t_len], da), w[p + "sa_wo"], p + "sa_wo")
        x = b.op("Add", x, b.op("Mul", gate1, out))
        h = _adaln(b, x, shift2, scale2)
        q = b.reshape(b.matmul(h, w[p + "ca_wq"], p + "ca_wq"), [1, t_len, nh, hd])
        q = b.transpose(b.rms(q), [0, 2, 1, 3])
        idx = b.const(np.int64(layer), dtype=np.int64)
        kc = b.transpose(b.op("Gather", "k_ctx", idx, axis=0), [0, 2, 1, 3])
        vc = b.transpose(b.op("Gather", "v_ctx", idx, axis=0), [0, 2, 1, 3])
        att = b.attention(q, kc, vc, scale, cross_bias)
        out = b.matmul(_merge_heads(b, att, [1, t_len], da), w[p + "ca_wo"], p + "ca_wo")
        x = b.op("Add", x, b.op("Mul", gate2, out))
        h = _adaln(b, x, shift3, scale3)
        out = b.swiglu(h, w[p + "mlp_gate"], w[p + "mlp_up"], w[p + "mlp_down"], p + "mlp")
        x = b.op("Add", x, b.op("Mul", gate3, out))
    fm = b.matmul(sc, w["act.final_w"], "act.final_w", w["act.final_b"])
    shift, scale_f = b.ops("Split", fm, b.ints([da, da]), axis=-1, n_out=2)
    vel = b.matmul(_adaln(b, x, shift, scale_f), w["act.out_w"], "act.out_w", w["act.out_b"])
    keep = b.reshape(b.op("Sub", one, "action_dim_is_pad"), [1, 1, a])
    vel = b.op("Mul", vel, keep)
    if opt.euler_in_graph:
        dt = b.const(np.float32(1.0 / opt.euler_baked_steps))
        step = b.op("Add", "trajectory", b.op("Mul", vel, dt))
        b.output("Mul", "next_trajectory", step, keep)
        out_name = "next_trajectory"
    else:
        out_name = b.output("Identity", "velocity", vel)
    ctx_shape = [d.num_layers, 1, s, nh, hd]
    return b.model(
        [("trajectory", [1, t_len, a]), ("timestep", [1]), ("k_ctx", ctx_shape),
         ("v_ctx", ctx_shape), ("encoder_attention_mask", [1, s]), ("action_dim_is_pad", [1, a])],
        [(out_name, [1, t_len, a])],
    )


def build_graphs(w: Weights, d: TinyDims, opt: GraphOptions) -> dict[str, onnx.ModelProto]:
    """All seven graphs keyed by component name."""
    graphs = {"vision": vision_graph(w, d, opt)}
    for i in range(d.num_splits):
        graphs[f"llm_split{i}"] = llm_split_graph(w, d, opt, i)
    graphs["action_context"] = action_context_graph(w, d, opt)
    graphs["action_step"] = action_step_graph(w, d, opt)
    return graphs
