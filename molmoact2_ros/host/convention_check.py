"""Read the host-glue conventions off a bundle's goldens (what ``molmoact2 conventions``
prints and ``export-host`` writes).

The goldens show the mask value, padding side, bidirectional image attention, encoder-mask
policy, Euler placement, whether vision already adds the ``<im_patch>`` embedding, and (with
Euler in the graph) the step count through the primary trace; ``flip_images_180`` cannot be
read off them (a default to verify).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..bundle.bundle import Bundle
from ..bundle.conventions import Conventions
from ..bundle.golden import load_npz

MATCH, MISMATCH, UNKNOWN = "match", "MISMATCH", "unknown"


@dataclass(frozen=True)
class Finding:
    """One convention: what the goldens show, what the bundle says, and how that was read."""

    name: str
    observed: Any
    configured: Any
    evidence: str

    @property
    def verdict(self) -> str:
        if self.observed is None:
            return UNKNOWN
        return MATCH if self.observed == self.configured else MISMATCH


#: Fills below fp16's range (the model's ``finfo(float32).min``) mean "masked": the package
#: writes its own fp16-safe value there, which float32 and fp16 softmax zero alike.
FP16_LOWEST = -65504.0


def infer_from_bias(bias: np.ndarray) -> dict[str, Any]:
    """Mask value, valid columns, padding side and image bidirectionality from a bias
    (``mask_value`` is ``-inf`` for a fill below fp16's range, such as ``finfo.min``)."""
    b = np.asarray(bias, dtype=np.float64).reshape(bias.shape[-2], bias.shape[-1])
    seq = b.shape[0]
    allowed = b == 0.0
    valid = allowed.any(axis=0)
    pads = np.flatnonzero(~valid)
    if pads.size == 0:
        side = None
    elif pads[0] == 0 and np.all(pads == np.arange(pads.size)):
        side = "left"
    elif pads[-1] == seq - 1 and np.all(pads == np.arange(seq - pads.size, seq)):
        side = "right"
    else:
        side = "scattered"
    upper = np.triu(allowed, k=1)
    return {
        "mask_value": (None if b.min() >= 0 else -np.inf if b.min() < FP16_LOWEST
                       else float(b.min())),
        "valid": valid,
        "padding_side": side,
        "bidirectional": bool(upper.any()),
        "bidirectional_pairs": int(upper.sum()),
    }


def check_conventions(bundle: Bundle, conv: Conventions | None = None) -> list[Finding]:
    """Compare every convention the goldens reveal with ``conv`` (default: conventions.json)."""
    conv = conv if conv is not None else bundle.conventions()
    golden = bundle.root / "golden"
    findings = []
    split0 = load_npz(golden / "llm_split0_io.npz", ["attention_bias", "hidden_states"])
    info = infer_from_bias(split0["attention_bias"])
    findings.append(_mask_value(info["mask_value"], conv))
    findings.append(Finding(
        "padding_side", info["padding_side"] if info["padding_side"] != "scattered" else None,
        conv.padding_side if info["padding_side"] else None,
        f"{int((~info['valid']).sum())} fully masked key columns in attention_bias"
        if info["padding_side"] else "no padding in the golden prompt: either side fits"))
    findings.append(Finding("bidirectional_image_attention", info["bidirectional"],
                            conv.bidirectional_image_attention,
                            f"{info['bidirectional_pairs']} allowed query<key pairs"))
    step = load_npz(golden / "action_step_io.npz", ["encoder_attention_mask"])
    enc = np.asarray(step["encoder_attention_mask"]).reshape(-1) > 0.5
    hidden_valid = int((info["valid"] & ~enc).sum())
    findings.append(Finding(
        "encoder_mask", "exclude_eos" if hidden_valid else "padding_only", conv.encoder_mask,
        f"{hidden_valid} valid prompt positions hidden from the action expert"))
    in_graph = "next_trajectory" in step
    findings.append(Finding("euler_in_graph", in_graph if in_graph or "velocity" in step
                            else None, conv.euler_in_graph,
                            "action_step output is " + ("next_trajectory" if in_graph
                                                        else "velocity")))
    findings.append(_patch_embedding(bundle, conv, split0["hidden_states"]))
    findings.append(_baked_steps(bundle, conv, step, in_graph))
    return findings


def _baked_steps(bundle: Bundle, conv: Conventions, step: dict, in_graph: bool) -> Finding:
    """With Euler in the graph its dt is baked: the primary trace ran the graph's own step
    count, and the action_step golden's timestep is a multiple of 1/N. No graph shows dt."""
    name = "euler_baked_steps"
    trace_path = bundle.root / "golden" / "e2e_trace.npz"
    if not in_graph:
        return Finding(name, None, conv.euler_baked_steps, "action_step outputs velocity")
    try:
        steps = int(load_npz(trace_path, ["flow_steps"])["flow_steps"])
    except Exception as exc:  # no trace: nothing shows the step count
        return Finding(name, None, conv.euler_baked_steps,
                       f"needs golden/e2e_trace.npz ({type(exc).__name__})")
    t = float(np.asarray(step.get("timestep", np.nan)).reshape(-1)[0])
    if steps < 1 or not np.isfinite(t) or abs(t * steps - round(t * steps)) > 1e-4:
        return Finding(name, None, conv.euler_baked_steps,
                       f"e2e_trace.npz ran {steps} steps but action_step's timestep {t:g} is "
                       "not a multiple of 1/steps")
    return Finding(name, steps, conv.euler_baked_steps,
                   f"e2e_trace.npz ran {steps} steps through this graph (timestep {t:g}); "
                   "parity end to end confirms the baked dt")


#: A configured mask value at or below this zeroes softmax as ``finfo.min`` does.
MASKING_ENOUGH = -1e4


def _mask_value(observed: float | None, conv: Conventions) -> Finding:
    """An fp16-range fill must be the configured one; a fill beyond it (``finfo.min``) is
    read as "masked" and matched by any configured value <= -1e4 (-30000 when writing)."""
    if observed is None or observed != -np.inf:
        return Finding("mask_value", observed, conv.mask_value,
                       "minimum of llm_split0 attention_bias")
    ok = conv.mask_value <= MASKING_ENOUGH
    return Finding("mask_value", conv.mask_value if ok else Conventions().mask_value,
                   conv.mask_value,
                   "llm_split0 attention_bias is filled below fp16's range (finfo.min): read "
                   "as masked; any value <= -1e4 zeroes the softmax alike")


def _patch_embedding(bundle: Bundle, conv, hidden_states: np.ndarray) -> Finding:
    """At each image position, hidden − image_embed is wte(<im_patch>) (host adds it) or 0."""
    name = "image_embeds_include_patch_embedding"
    try:
        vision = load_npz(bundle.root / "golden" / "vision_io.npz", ["image_embeds"])
        from .prompt import EmbeddingTable, PromptConfig, Tokenizer

        config = PromptConfig.from_json(bundle.host_path("prompt.json"))
        patch_id = Tokenizer(bundle.host_path("tokenizer.json")).token_id(
            config.image_patch_token)
        patch_row = EmbeddingTable(bundle.host_path("embeddings.npy")).rows(
            np.array([patch_id]))[0]
    except Exception as exc:  # host assets are optional for this check
        return Finding(name, None, conv.image_embeds_include_patch_embedding,
                       f"needs vision_io.npz and the host assets ({exc})")
    hidden = np.asarray(hidden_states, np.float64).reshape(-1, patch_row.shape[0])
    feats = np.asarray(vision["image_embeds"], np.float64).reshape(-1, patch_row.shape[0])
    added, replaced = 0, 0
    for feat in feats:
        residual = hidden - feat
        best = residual[np.argmin(np.minimum(
            np.linalg.norm(residual - patch_row, axis=1), np.linalg.norm(residual, axis=1)))]
        scale = np.linalg.norm(patch_row) + 1e-12
        if np.linalg.norm(best - patch_row) / scale < 1e-2:
            added += 1
        elif np.linalg.norm(best) / scale < 1e-2:
            replaced += 1
    if added == len(feats):
        observed = False
    elif replaced == len(feats):
        observed = True
    else:
        observed = None
    return Finding(name, observed, conv.image_embeds_include_patch_embedding,
                   f"{added} image rows = wte(<im_patch>) + feature, {replaced} = feature alone, "
                   f"of {len(feats)}")


def format_findings(findings: list[Finding]) -> str:
    lines = [f"{'convention':<38} {'goldens show':<14} {'conventions.json':<17} verdict  evidence"]
    for f in findings:
        lines.append(f"{f.name:<38} {f.observed!s:<14} {f.configured!s:<17} {f.verdict:<8} "
                     f"{f.evidence}")
    return "\n".join(lines)


#: Choices no golden file shows: they keep their default and are reported as still to verify.
UNREADABLE = ("euler_baked_steps", "flip_images_180")


def conventions_from_goldens(bundle: Bundle, base: Conventions | None = None
                             ) -> tuple[Conventions, list[Finding]]:
    """``base`` (defaults) with every choice the goldens show replaced by what they show.

    ``euler_baked_steps`` defaults to the variant's flow steps (the tiny bundles bake that).
    """
    if base is None:
        base = Conventions(euler_baked_steps=bundle.variant.default_flow_steps)
    findings = check_conventions(bundle, base)
    known = {f.name for f in fields(Conventions)}
    seen = {f.name: f.observed for f in findings if f.observed is not None and f.name in known}
    return replace(base, **seen), findings


def unverified(findings: list[Finding]) -> list[str]:
    """Names of the choices the goldens did not decide (defaults still to be verified)."""
    seen = {f.name for f in findings if f.verdict != UNKNOWN}
    return [f.name for f in findings if f.verdict == UNKNOWN] + [
        u for u in UNREADABLE if u not in seen and u not in {f.name for f in findings}]
