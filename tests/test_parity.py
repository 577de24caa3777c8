"""Golden parity on the tiny bundles: passes when the host glue is right, and names the
failing stage when it is wrong (swapped cameras, shifted image tokens, causal-only bias,
wrong flow steps, a corrupted weight)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from molmoact2_ros.bundle.golden import compare, component_parity, load_npz
from molmoact2_ros.cli.app import main as cli_main
from molmoact2_ros.policy import Observation, Policy, e2e_parity


@pytest.fixture(scope="module")
def policies(tiny_root):
    loaded = {v: Policy.load(tiny_root / v, v) for v in ("grid_sampler", "lp_vtp_sd", "fused")}
    yield loaded
    for p in loaded.values():
        p.close()


def _contracts(policy):
    return policy.variant.contracts(euler_in_graph=policy.conventions.euler_in_graph)


def test_every_component_and_trace_passes(policies, tiny_root, variant_name):
    policy = policies[variant_name]
    golden = tiny_root / variant_name / "golden"
    rows = component_parity(golden, policy.pipeline.run_component, _contracts(policy))
    assert {r.stage for r in rows} == {
        "vision", "llm_split0", "llm_split1", "llm_split2", "llm_split3",
        "action_context", "action_step",
    }
    for trace in ("e2e_trace.npz", "e2e_trace_alt.npz"):
        rows += e2e_parity(policy, golden / trace)
    failed = [r for r in rows if not r.passed]
    assert not failed, failed
    chunk = [r for r in rows if r.tensor == "chunk"]
    assert len(chunk) == 2 and min(r.cosine for r in chunk) >= 0.9999


def _trace(tiny_root, variant):
    return load_npz(tiny_root / variant / "golden" / "e2e_trace.npz")


def _run(policy, trace, images=None):
    policy.set_flow_steps(int(trace["flow_steps"]))
    obs = Observation(
        images=images or (trace["image_primary"], trace["image_wrist"]),
        state=trace["state"],
        instruction=str(trace["instruction"]),
    )
    return policy.predict(obs, noise=trace["noise"])


def test_swapped_cameras_fail(policies, tiny_root):
    policy, trace = policies["grid_sampler"], _trace(tiny_root, "grid_sampler")
    good = _run(policy, trace)
    assert compare("e2e", "chunk", good.actions, trace["chunk"]).passed
    swapped = _run(policy, trace, images=(trace["image_wrist"], trace["image_primary"]))
    assert not compare("e2e", "chunk", swapped.actions, trace["chunk"]).passed
    pv = policy.pipeline.input_buffer("pixel_values")
    assert not compare("e2e", "pixel_values", pv, trace["pixel_values"]).passed


def test_image_tokens_shifted_by_one_fail(policies, tiny_root):
    policy = policies["lp_vtp_sd"]
    path = tiny_root / "lp_vtp_sd" / "golden" / "e2e_trace.npz"
    plan = policy.plan(str(_trace(tiny_root, "lp_vtp_sd")["instruction"]))
    original = plan.patch_positions.copy()
    plan.patch_positions = original + 1
    try:
        rows = {r.tensor: r for r in e2e_parity(policy, path)}
    finally:
        plan.patch_positions = original
    assert rows["pixel_values"].passed and rows["input_ids"].passed
    assert not rows["hidden_states"].passed and not rows["chunk"].passed


def _bundle_copy(tiny_root, tmp_path, variant):
    dst = tmp_path / variant
    shutil.copytree(tiny_root / variant, dst, ignore=shutil.ignore_patterns("ctx"))
    return dst


def test_causal_only_bias_fails_where_bundle_wants_bidirectional(tiny_root, tmp_path):
    bundle = _bundle_copy(tiny_root, tmp_path, "grid_sampler")
    conv_path = bundle / "host" / "conventions.json"
    conv = json.loads(conv_path.read_text())
    assert conv["bidirectional_image_attention"] is True
    conv["bidirectional_image_attention"] = False
    conv_path.write_text(json.dumps(conv))
    with Policy.load(bundle) as policy:
        rows = {r.tensor: r for r in e2e_parity(policy, bundle / "golden" / "e2e_trace.npz")}
    assert rows["hidden_states"].passed
    assert not rows["attention_bias"].passed and not rows["chunk"].passed


@pytest.mark.parametrize("variant, steps", [("grid_sampler", 2), ("grid_sampler", 8),
                                            ("lp_vtp_sd", 10)])
def test_wrong_flow_step_count_fails(policies, tiny_root, tmp_path, variant, steps):
    """Running one variant with another's step count (or 8 instead of 10) is caught."""
    policy = policies[variant]
    trace = dict(_trace(tiny_root, variant))
    assert int(trace["flow_steps"]) != steps
    trace["flow_steps"] = np.int64(steps)
    path = tmp_path / "wrong_steps.npz"
    np.savez(path, **trace)
    rows = {r.tensor: r for r in e2e_parity(policy, path)}
    assert rows["hidden_states"].passed and not rows["chunk"].passed


def test_corrupted_weight_names_the_component(tiny_root, tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    bundle = _bundle_copy(tiny_root, tmp_path, "grid_sampler")
    path = bundle / "onnx" / "llm_split2" / "model.onnx"
    model = onnx.load(str(path))
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    weights = numpy_helper.to_array(init).copy()
    weights.flat[0] += 3.0  # one corrupted weight
    init.CopyFrom(numpy_helper.from_array(weights, init.name))
    onnx.save(model, str(path))
    with Policy.load(bundle) as policy:
        rows = component_parity(bundle / "golden", policy.pipeline.run_component,
                                _contracts(policy))
    failed = {r.stage for r in rows if not r.passed}
    assert failed == {"llm_split2"}


def test_cli_parity_exit_status(tiny_root, tmp_path, capsys):
    assert cli_main(["parity", str(tiny_root), "--variant", "lp_vtp_sd"]) == 0
    out = capsys.readouterr().out
    assert "30/30 rows pass" in out
    assert "== lp_vtp_sd (onnx): the onnx/ graphs (context suffixes apply to the HTP only), " \
        "precision fp32" in out
    bundle = _bundle_copy(tiny_root, tmp_path, "lp_vtp_sd")
    golden = bundle / "golden" / "action_step_io.npz"
    data = dict(load_npz(golden))
    data["next_trajectory"] = data["next_trajectory"][..., ::-1].copy()
    np.savez(golden, **data)
    assert cli_main(["parity", str(bundle)]) == 1
    assert "FAIL" in capsys.readouterr().out
