"""The tiny bundle generator: layout, ONNX-vs-reference parity, determinism, goldens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from molmoact2_ros.bundle.conventions import Conventions  # noqa: E402
from molmoact2_ros.bundle.variants import COMPONENTS, VARIANTS  # noqa: E402
from molmoact2_ros.runtime.onnx_backend import OnnxSession  # noqa: E402
from molmoact2_ros.runtime.session import SessionSet  # noqa: E402
from molmoact2_ros.synth import assets, write_tiny_bundles  # noqa: E402
from molmoact2_ros.synth.reference import run_trace  # noqa: E402
from molmoact2_ros.synth.writer import reference_for  # noqa: E402

VARIANT_NAMES = tuple(VARIANTS)
TRACE_KEYS = {
    "image_primary", "image_wrist", "image_encoding", "state", "instruction", "seed",
    "flow_steps", "noise", "pixel_values", "input_ids", "hidden_states", "attention_bias",
    "encoder_attention_mask", "action_dim_is_pad", "actions_normalized", "chunk",
}


@pytest.fixture(scope="module")
def bundles(tiny_root) -> dict[str, Path]:
    """The session's tiny bundles (conftest: built once, or ``MOLMOACT2_TINY_BUNDLE``)."""
    return {v: tiny_root / v for v in VARIANT_NAMES}


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def _graph(root: Path, variant: str, component: str) -> Path:
    return root / "onnx" / VARIANTS[variant].onnx_dir(component) / "model.onnx"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def test_layout_and_manifest(bundles):
    for variant, root in bundles.items():
        manifest = json.loads((root / "bundle.json").read_text())
        assert manifest == {"format": "molmoact2_ros.bundle.v1", "variant": variant,
                            "synthetic": True, "seed": 0}
        for name in ("tokenizer.json", "prompt.json", "embeddings.npy", "conventions.json"):
            assert (root / "host" / name).is_file()
        for component in COMPONENTS:
            assert _graph(root, variant, component).is_file()
            assert (root / "golden" / f"{component}_io.npz").is_file()
        norm = json.loads((root / "norm_stats.json").read_text())
        libero = norm["metadata_by_tag"]["libero"]
        assert norm["format"] == "molmoact2_norm_stats.v1"
        assert len(libero["action_stats"]["q01"]) == 7 and len(libero["state_stats"]["q99"]) == 8
        table = np.load(root / "host" / "embeddings.npy", mmap_mode="r")
        assert table.dtype == np.float16 and table.shape == (len(assets.vocabulary()), 64)
    assert (bundles["fused"] / "onnx" / "vision_fused" / "model.onnx").is_file()
    assert (bundles["fused"] / "onnx" / "action_step_fused" / "model.onnx").is_file()


def test_conventions_per_variant(bundles):
    conv = {v: Conventions.from_json(r / "host" / "conventions.json") for v, r in bundles.items()}
    assert conv["grid_sampler"].padding_side == "right"
    assert conv["grid_sampler"].encoder_mask == "exclude_eos"
    assert conv["lp_vtp_sd"].padding_side == "left" and conv["lp_vtp_sd"].mask_value == -10000.0
    assert conv["lp_vtp_sd"].image_embeds_include_patch_embedding
    assert conv["lp_vtp_sd"].euler_baked_steps == 2
    assert not conv["fused"].euler_in_graph


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_sessions_bind_to_the_variant_contract(bundles, variant):
    root = bundles[variant]
    conv = Conventions.from_json(root / "host" / "conventions.json")
    sessions = {c: OnnxSession(c, _graph(root, variant, c), providers=["CPUExecutionProvider"])
                for c in COMPONENTS}
    with SessionSet(sessions, VARIANTS[variant], euler_in_graph=conv.euler_in_graph) as ss:
        geo = ss.geometry
        assert geo.seq_len == VARIANTS[variant].seq_len
        assert (geo.hidden, geo.kv_width, geo.num_layers) == (64, 32, 8)
        assert geo.layers_per_split == (2, 2, 2, 2)
        assert (geo["AH"], geo["AD"]) == (4, 12)


@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_onnx_matches_reference(bundles, variant, component):
    root = bundles[variant]
    io = _load(root / "golden" / f"{component}_io.npz")
    sess = _session(_graph(root, variant, component))
    feeds = {i.name: io[i.name] for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    assert set(io) == set(feeds) | set(names)
    for name, got in zip(names, sess.run(names, feeds)):
        ref = io[name]
        assert got.shape == ref.shape and ref.dtype == np.float32
        assert np.all(np.isfinite(got))
        assert _cosine(got, ref) >= 0.99999, name
        assert np.abs(got - ref).max() <= 2e-4 * max(1.0, float(np.abs(ref).max())), name


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_outputs_are_not_degenerate(bundles, variant):
    golden = bundles[variant] / "golden"
    checks = [("vision", "image_embeds"), ("action_context", "k_ctx"),
              ("action_context", "v_ctx")]
    checks += [(f"llm_split{i}", n) for i in range(4) for n in ("hidden_out", "keys", "values")]
    step = _load(golden / "action_step_io.npz")
    out = step.get("next_trajectory", step.get("velocity"))
    for component, name in checks:
        arr = _load(golden / f"{component}_io.npz")[name]
        assert np.all(np.isfinite(arr)) and 0.3 < arr.std() < 10.0, (component, name)
    assert np.all(np.isfinite(out)) and out[..., :7].std() > 0.1
    assert np.all(out[..., 7:] == 0)


def test_conditioning_changes_actions():
    spec = VARIANTS["grid_sampler"]
    model, host = reference_for(spec, 0)
    base = dict(primary=assets.synthetic_image(101), wrist=assets.synthetic_image(102),
                state=np.asarray(assets.MAIN_TRACE.state, np.float32),
                instruction=assets.MAIN_TRACE.instruction, seed=7, flow_steps=10)
    ref = run_trace(model, host, **base)[0]["actions_normalized"]
    changes = {
        "primary": assets.synthetic_image(5), "wrist": assets.synthetic_image(6),
        "state": base["state"] + np.float32(0.05), "instruction": "put the bowl on the plate",
        "seed": 8,
    }
    for key, value in changes.items():
        got = run_trace(model, host, **{**base, key: value})[0]["actions_normalized"]
        assert np.abs(got - ref).max() > 1e-2, key


def test_deterministic_bytes(tmp_path):
    # two fresh runs: the session bundles may have gained files (ctx/ stand-ins) from other tests
    first = write_tiny_bundles(tmp_path / "first")
    again = write_tiny_bundles(tmp_path / "again")
    assert again == {v: tmp_path / "again" / v for v in VARIANT_NAMES}
    for variant, root in first.items():
        files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
        other = sorted(p.relative_to(again[variant]) for p in again[variant].rglob("*")
                       if p.is_file())
        assert files == other
        for rel in files:
            assert (root / rel).read_bytes() == (again[variant] / rel).read_bytes(), rel


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_trace_files(bundles, variant):
    spec = VARIANTS[variant]
    golden = bundles[variant] / "golden"
    for name, steps in (("e2e_trace", spec.default_flow_steps),
                        ("e2e_trace_alt", 1 if spec.default_flow_steps == 2 else 5)):
        t = _load(golden / f"{name}.npz")
        assert set(t) == TRACE_KEYS
        assert t["image_primary"].dtype == np.uint8 and t["image_primary"].shape == (256, 256, 3)
        assert str(t["image_encoding"]) == "rgb8" and int(t["flow_steps"]) == steps
        assert t["input_ids"].dtype == np.int64 and t["input_ids"].shape == (spec.seq_len,)
        assert t["pixel_values"].shape == (1, 2, 729, 588)
        assert t["hidden_states"].shape == (1, spec.seq_len, 64)
        assert t["attention_bias"].shape == (1, 1, spec.seq_len, spec.seq_len)
        assert t["noise"].shape == (1, 10, 32) and np.all(t["noise"][..., 7:] == 0)
        assert t["chunk"].shape == (10, 7) and t["actions_normalized"].shape == (10, 7)
        for key in TRACE_KEYS - {"image_primary", "image_wrist", "image_encoding",
                                 "instruction", "seed", "flow_steps", "input_ids"}:
            assert t[key].dtype == np.float32, key
    main = _load(golden / "e2e_trace.npz")
    assert str(main["instruction"]) == assets.MAIN_TRACE.instruction and int(main["seed"]) == 7
    assert np.array_equal(_load(golden / "vision_io.npz")["pixel_values"], main["pixel_values"])
    split0 = _load(golden / "llm_split0_io.npz")
    assert np.array_equal(split0["hidden_states"], main["hidden_states"])
    assert np.array_equal(split0["attention_bias"], main["attention_bias"])
    step = _load(golden / "action_step_io.npz")
    assert np.isclose(float(step["timestep"][0]), 1.0 / spec.default_flow_steps)
    assert np.array_equal(step["encoder_attention_mask"], main["encoder_attention_mask"])


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_patch_rows_hold_the_image_features(bundles, variant):
    root = bundles[variant]
    conv = Conventions.from_json(root / "host" / "conventions.json")
    table = np.load(root / "host" / "embeddings.npy").astype(np.float32)
    patch_id = assets.vocabulary().index("<im_patch>")
    main = _load(root / "golden" / "e2e_trace.npz")
    embeds = _load(root / "golden" / "vision_io.npz")["image_embeds"]
    rows = main["hidden_states"][0, main["input_ids"] == patch_id]
    want = embeds if conv.image_embeds_include_patch_embedding else table[patch_id] + embeds
    assert np.array_equal(rows, want)
    other = main["input_ids"] != patch_id
    assert np.array_equal(main["hidden_states"][0, other], table[main["input_ids"][other]])


@pytest.mark.parametrize("trace", ("e2e_trace", "e2e_trace_alt"))
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_onnx_chain_reproduces_trace(bundles, variant, trace):
    """vision → splits → context → flow loop on ONNX Runtime, host arrays taken from the trace."""
    root = bundles[variant]
    conv = Conventions.from_json(root / "host" / "conventions.json")
    t = _load(root / "golden" / f"{trace}.npz")
    run = {c: _session(_graph(root, variant, c)) for c in COMPONENTS}
    embeds = run["vision"].run(None, {"pixel_values": t["pixel_values"]})[0]
    table = np.load(root / "host" / "embeddings.npy").astype(np.float32)
    ids = t["input_ids"]
    hidden = table[ids][None]
    patch = ids == assets.vocabulary().index("<im_patch>")
    if conv.image_embeds_include_patch_embedding:
        hidden[0, patch] = embeds
    else:
        hidden[0, patch] += embeds
    np.testing.assert_allclose(hidden, t["hidden_states"], atol=2e-4)
    keys, values = [], []
    for i in range(4):
        out = run[f"llm_split{i}"].run(None, {"hidden_states": hidden,
                                              "attention_bias": t["attention_bias"]})
        hidden = out[0]
        keys.append(out[1])
        values.append(out[2])
    k_ctx, v_ctx = run["action_context"].run(
        None, {"keys": np.concatenate(keys), "values": np.concatenate(values)})
    n = int(t["flow_steps"])
    keep = 1.0 - t["action_dim_is_pad"][:, None, :]
    x = t["noise"]
    for i in range(n):
        out = run["action_step"].run(None, {
            "trajectory": x, "timestep": np.array([i / n], np.float32), "k_ctx": k_ctx,
            "v_ctx": v_ctx, "encoder_attention_mask": t["encoder_attention_mask"],
            "action_dim_is_pad": t["action_dim_is_pad"]})[0]
        if conv.euler_in_graph:
            x = out if n == conv.euler_baked_steps else x + (out - x) * (conv.euler_baked_steps / n)
        else:
            x = x + out / n
        x = (x * keep).astype(np.float32)
    np.testing.assert_allclose(x[0, :, :7], t["actions_normalized"], atol=2e-4)


def test_onnx_threads_come_from_the_environment_and_a_bad_value_is_refused(bundles, monkeypatch):
    """``MOLMOACT2_THREADS`` sizes each session's intra-op pool (a Ray actor sets it to
    its CPUs); a word or a negative count is refused naming the variable."""
    from molmoact2_ros.errors import MolmoActError

    path = _graph(bundles["grid_sampler"], "grid_sampler", "action_step")
    monkeypatch.setenv("MOLMOACT2_THREADS", "1")
    session = OnnxSession("action_step", path, providers=["CPUExecutionProvider"])
    assert session._sess.get_session_options().intra_op_num_threads == 1
    session.close()
    for bad in ("banana", "-1", "1.5"):
        monkeypatch.setenv("MOLMOACT2_THREADS", bad)
        with pytest.raises(MolmoActError, match="MOLMOACT2_THREADS"):
            OnnxSession("action_step", path, providers=["CPUExecutionProvider"])
