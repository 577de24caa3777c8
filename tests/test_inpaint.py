"""Training-free inpainting in the flow loop: off is bit-identical, weight 1 lands on the prefix,
and the HTP action worker's loop (fake qai_appbuilder) and the in-process loop agree."""

from __future__ import annotations

import numpy as np
import pytest
from htp_helpers import ensure_contexts, fake_env

from molmoact2_ros.bundle.conventions import Conventions
from molmoact2_ros.bundle.golden import load_npz
from molmoact2_ros.control.execution import InpaintGuidance, inpaint_weights
from molmoact2_ros.host.flow import run_flow
from molmoact2_ros.policy import Observation, Policy

T, A = 10, 32


def _step(in_graph: bool):
    """A velocity (or next-x) field that mixes rows and dims, like an attention block."""
    rng = np.random.default_rng(3)
    mix_rows = rng.standard_normal((T, T)).astype(np.float32) / T
    mix_dims = rng.standard_normal((A, A)).astype(np.float32) / A

    def step(x, t):
        v = np.tanh(mix_rows @ x[0] @ mix_dims + t[0])[None].astype(np.float32)
        return (x + 0.1 * v).astype(np.float32) if in_graph else v

    return step


@pytest.fixture(params=[True, False], ids=["euler_in_graph", "velocity"])
def flow(request):
    conv = Conventions(euler_in_graph=request.param, euler_baked_steps=10)
    pad = np.zeros((1, A), np.float32)
    pad[0, 7:] = 1.0
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((1, T, A)).astype(np.float32) * (1 - pad)
    prefix = rng.uniform(-1, 1, (1, T, A)).astype(np.float32) * (1 - pad)
    return _step(request.param), x0, pad, conv, prefix


@pytest.mark.parametrize("method", ["pull", "pigdm"])
@pytest.mark.parametrize("steps", [1, 3, 10])
def test_zero_weights_are_bit_identical_to_no_inpainting(flow, steps, method):
    step, x0, pad, conv, prefix = flow
    plain = run_flow(step, x0, pad, steps, conv)
    zero = run_flow(step, x0, pad, steps, conv, prefix, np.zeros(T, np.float32), method)
    assert plain.tobytes() == zero.tobytes()


@pytest.mark.parametrize("steps", [2, 10])
def test_pigdm_guidance_moves_the_masked_rows_towards_the_prefix(flow, steps):
    step, x0, pad, conv, prefix = flow
    weights = inpaint_weights(3, 7, T)
    plain = run_flow(step, x0, pad, steps, conv)
    out = run_flow(step, x0, pad, steps, conv, prefix, weights, "pigdm", 5.0)
    for row in range(5):
        assert (np.abs(out[0, row] - prefix[0, row]).sum()
                < np.abs(plain[0, row] - prefix[0, row]).sum())
    assert np.all(out[..., 7:] == 0)


@pytest.mark.parametrize("steps", [1, 2, 10])
def test_weight_one_reproduces_the_prefix_exactly(flow, steps):
    step, x0, pad, conv, prefix = flow
    weights = inpaint_weights(3, 7, T)
    plain = run_flow(step, x0, pad, steps, conv)
    out = run_flow(step, x0, pad, steps, conv, prefix, weights)
    np.testing.assert_array_equal(out[:, :3], prefix[:, :3])
    # partially weighted rows move towards the prefix, padded dims stay zero; the pulls start
    # after the first step (at t = 0 the pull target is x0 itself, so a pull there would only
    # add float rounding), so with one step the unweighted rows 7.. are bit-identical
    for row in (3, 4):
        assert (np.abs(out[0, row] - prefix[0, row]).sum()
                < np.abs(plain[0, row] - prefix[0, row]).sum())
    assert np.all(out[..., 7:] == 0)
    assert np.array_equal(out[:, 7:], plain[:, 7:]) == (steps == 1)


def _observation(trace) -> Observation:
    return Observation(images=(trace["image_primary"], trace["image_wrist"]),
                       state=trace["state"], instruction=str(trace["instruction"]))


def _guidance(policy: Policy, rng) -> InpaintGuidance:
    v = policy.variant
    raw = rng.uniform(-0.8, 0.8, (v.horizon, v.action_dim)).astype(np.float32)
    prefix = policy.norm_stats.action.denormalize(raw)
    return InpaintGuidance(prefix, inpaint_weights(3, 7, v.horizon), 3, 7)


def test_policy_with_zero_guidance_matches_the_plain_chunk(tiny_root):
    pytest.importorskip("onnxruntime")
    trace = load_npz(tiny_root / "lp_vtp_sd" / "golden" / "e2e_trace.npz")
    with Policy.load(tiny_root / "lp_vtp_sd", backend="onnx") as policy:
        noise = np.random.default_rng(1).standard_normal((1, 10, 32)).astype(np.float32)
        plain = policy.predict(_observation(trace), noise=noise)
        g = _guidance(policy, np.random.default_rng(2))
        off = InpaintGuidance(g.prefix, np.zeros(10, np.float32), 0, 0)
        zero = policy.predict(_observation(trace), noise=noise, guidance=off)
        assert plain.actions.tobytes() == zero.actions.tobytes()
        with pytest.raises(Exception, match="inpaint guidance"):
            policy.predict(_observation(trace), guidance=InpaintGuidance(
                g.prefix[:5], g.weights, 3, 7))


@pytest.mark.parametrize("method", ["pull", "pigdm"])
def test_htp_worker_loop_and_in_process_loop_give_the_same_inpainted_chunk(
        tiny_root, monkeypatch, method):
    pytest.importorskip("onnxruntime")
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    trace = load_npz(tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz")
    noise = np.random.default_rng(5).standard_normal((1, 10, 32)).astype(np.float32)
    chunks = {}
    for backend in ("onnx", "htp"):
        with Policy.load(tiny_root / "grid_sampler", backend=backend) as policy:
            g = _guidance(policy, np.random.default_rng(6))
            guidance = InpaintGuidance(g.prefix, g.weights, 3, 7, method, 5.0)
            want = policy.norm_stats.action.normalize(guidance.prefix)
            obs = _observation(trace)
            chunks[backend] = policy.predict(obs, noise=noise, guidance=guidance)
            chunks[backend + "_plain"] = policy.predict(obs, noise=noise)
            if method == "pull":  # weight-1 rows land exactly on the prefix in either loop
                np.testing.assert_array_equal(chunks[backend].actions_normalized[:3], want[:3])
    # the same chunk from both loops (the fake runs fp16 I/O like the NPU: same tolerance as
    # the end-to-end HTP test), and the guidance really reached the worker
    np.testing.assert_allclose(chunks["htp"].actions, chunks["onnx"].actions, atol=2e-2)
    guided, plain = chunks["htp"].actions_normalized, chunks["htp_plain"].actions_normalized
    assert np.abs(guided[:5] - plain[:5]).max() > 0.1
