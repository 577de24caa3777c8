"""Writes one tiny bundle folder: host assets, seven ONNX graphs and reference goldens."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from ..bundle.conventions import Conventions
from ..bundle.variants import COMPONENTS, VARIANTS, VariantSpec
from . import assets
from .graphs import GraphOptions, build_graphs
from .reference import HostSetup, ReferenceModel, run_trace
from .reference_host import WordLevelTokenizer
from .weights import TinyDims, make_weights

BUNDLE_FORMAT = "molmoact2_ros.bundle.v1"


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez_compressed`` layout (``np.load`` reads it), zlib level 1, fixed timestamps."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for key, value in arrays.items():
            with zf.open(key + ".npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(value), allow_pickle=False)


def reference_for(spec: VariantSpec, seed: int, dims: TinyDims | None = None
                  ) -> tuple[ReferenceModel, HostSetup]:
    """The reference model and host setup of one variant (what the goldens come from)."""
    dims = dims or TinyDims()
    vocab = assets.vocabulary()
    conv = assets.CONVENTIONS[spec.name]
    weights = make_weights(dims, len(vocab), spec.image_tokens_per_camera, seed)
    model = ReferenceModel(
        weights=weights, dims=dims, seq_len=spec.seq_len,
        image_tokens_per_camera=spec.image_tokens_per_camera,
        patch_token_id=vocab.index("<im_patch>"),
        include_patch_embedding=conv["image_embeds_include_patch_embedding"],
        euler_in_graph=conv["euler_in_graph"], euler_baked_steps=conv["euler_baked_steps"],
    )
    host = HostSetup(
        tokenizer=WordLevelTokenizer(vocab, assets.SPECIAL_TOKENS),
        prompt=assets.prompt_config(),
        norm_stats=assets.norm_stats()["metadata_by_tag"]["libero"],
        conventions=conv,
        action_dim=spec.action_dim,
    )
    return model, host


def _write_host(root: Path, spec: VariantSpec, model: ReferenceModel, seed: int) -> None:
    _write_json(root / "bundle.json", {"format": BUNDLE_FORMAT, "variant": spec.name,
                                       "synthetic": True, "seed": seed})
    _write_json(root / "norm_stats.json", assets.norm_stats())
    host = root / "host"
    host.mkdir(parents=True, exist_ok=True)
    (host / "tokenizer.json").write_text(assets.tokenizer_json(assets.vocabulary()) + "\n")
    _write_json(host / "prompt.json", assets.prompt_config())
    (host / "conventions.json").write_text(
        Conventions(**assets.CONVENTIONS[spec.name]).to_json() + "\n")
    with open(host / "embeddings.npy", "wb") as fh:
        np.save(fh, np.ascontiguousarray(model.weights["embed"], dtype=np.float16))


def _write_graphs(root: Path, spec: VariantSpec, model: ReferenceModel) -> None:
    conv = assets.CONVENTIONS[spec.name]
    include_patch = conv["image_embeds_include_patch_embedding"]
    opt = GraphOptions(
        seq_len=spec.seq_len,
        image_tokens_per_camera=spec.image_tokens_per_camera,
        num_cameras=spec.num_cameras,
        patch_token_id=model.patch_token_id if include_patch else None,
        euler_in_graph=conv["euler_in_graph"],
        euler_baked_steps=conv["euler_baked_steps"],
    )
    graphs = build_graphs(model.weights, model.dims, opt)
    for component in COMPONENTS:
        path = root / "onnx" / spec.onnx_dir(component) / "model.onnx"
        _write_bytes(path, graphs[component].SerializeToString())


def _write_goldens(root: Path, spec: VariantSpec, model: ReferenceModel, host: HostSetup) -> None:
    golden = root / "golden"
    golden.mkdir(parents=True, exist_ok=True)
    for trace in (assets.MAIN_TRACE, assets.alt_trace(spec.default_flow_steps)):
        steps = trace.flow_steps or spec.default_flow_steps
        primary = assets.synthetic_image(trace.image_seeds[0])
        wrist = assets.synthetic_image(trace.image_seeds[1])
        state = np.asarray(trace.state, dtype=np.float32)
        arrays, io = run_trace(model, host, primary=primary, wrist=wrist, state=state,
                               instruction=trace.instruction, seed=trace.seed, flow_steps=steps)
        save_npz(golden / f"{trace.name}.npz", {
            "image_primary": primary, "image_wrist": wrist, "image_encoding": np.array("rgb8"),
            "state": state, "instruction": np.array(trace.instruction),
            "seed": np.int64(trace.seed), "flow_steps": np.int64(steps),
            **{k: (v.astype(np.int64) if k == "input_ids" else v.astype(np.float32))
               for k, v in arrays.items()},
        })
        if trace is assets.MAIN_TRACE:
            for component in COMPONENTS:
                tensors = {k: np.asarray(v, dtype=np.float32) for k, v in io[component].items()}
                save_npz(golden / f"{component}_io.npz", tensors)


def write_variant(out_dir: Path, variant: str, seed: int = 0) -> Path:
    """Write ``out_dir/<variant>/`` and return it."""
    spec = VARIANTS[variant]
    root = Path(out_dir) / variant
    model, host = reference_for(spec, seed)
    _write_host(root, spec, model, seed)
    _write_graphs(root, spec, model)
    _write_goldens(root, spec, model, host)
    return root
