"""Hand-worked checks of the host maths: bias, masks, state bins, de-normalisation, Euler."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.bundle.conventions import Conventions
from molmoact2_ros.bundle.normstats import FeatureStats
from molmoact2_ros.errors import BundleError, ObservationError
from molmoact2_ros.host.flow import euler_update, initial_noise, run_flow, timesteps
from molmoact2_ros.host.prompt import (
    action_dim_is_pad,
    attention_bias,
    encoder_mask,
    normalize_instruction,
)
from molmoact2_ros.host.state import check_state, quat_to_axis_angle, state_bins

M = -30000.0


def test_attention_bias_hand_worked():
    # positions: 0 text, 1 img, 2 img, 3 text, 4 pad (right padding)
    valid = np.array([1, 1, 1, 1, 0], bool)
    is_img = np.array([0, 1, 1, 0, 0], bool)
    bias = attention_bias(valid, is_img, Conventions(mask_value=M))[0, 0]
    allowed = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0],  # image token 1 also sees image token 2 (bidirectional block)
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 0],  # pad row still sees the valid prefix, never itself
        ],
        bool,
    )
    np.testing.assert_array_equal(bias, np.where(allowed, 0.0, M).astype(np.float32))


def test_attention_bias_causal_only_when_not_bidirectional():
    valid = np.ones(3, bool)
    is_img = np.array([1, 1, 1], bool)
    bias = attention_bias(valid, is_img, Conventions(bidirectional_image_attention=False))
    assert bias[0, 0, 0, 1] == Conventions().mask_value
    assert bias[0, 0, 1, 0] == 0.0


def test_encoder_mask_policies():
    ids = np.array([9, 5, 6, 9, 7, 0])  # 9 = eos used as BOS and after the user turn
    valid = np.array([1, 1, 1, 1, 1, 0], bool)
    only_pad = encoder_mask(ids, valid, 9, Conventions(encoder_mask="padding_only"))
    no_eos = encoder_mask(ids, valid, 9, Conventions(encoder_mask="exclude_eos"))
    np.testing.assert_array_equal(only_pad, [[1, 1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(no_eos, [[0, 1, 1, 0, 1, 0]])


def test_action_dim_is_pad():
    pad = action_dim_is_pad(7, 32)
    assert pad.shape == (1, 32)
    assert pad[0, :7].sum() == 0 and pad[0, 7:].sum() == 25


def _stats(width=3, mask=(True, True, False)):
    return FeatureStats(
        names=tuple(f"d{i}" for i in range(width)),
        q01=np.array([-1.0, 0.0, 0.0], np.float32),
        q99=np.array([1.0, 2.0, 1.0], np.float32),
        mask=np.array(mask, bool),
    )


def test_state_bins_hand_worked():
    stats = _stats()
    # d0: (0 - -1)/2*2-1 = 0 -> rint(0.5*255)=rint(127.5)=128 (half to even)
    # d1: 2*(2-0)/2-1 = 1 -> 255 ; d2 unmasked raw -0.2 -> rint(0.8/2*255)=rint(102.0)=102
    np.testing.assert_array_equal(state_bins([0.0, 2.0, -0.2], stats), [128, 255, 102])
    # out of range clips: d1 = 5 -> 1 -> 255, raw gripper 3.0 clips to 1 -> 255
    np.testing.assert_array_equal(state_bins([-1.0, 5.0, 3.0], stats), [0, 255, 255])


def test_state_errors_name_the_problem():
    with pytest.raises(ObservationError, match="has 2 values but the policy needs 3"):
        check_state([1.0, 2.0], 3)
    with pytest.raises(ObservationError, match=r"NaN/inf at index \[1\]"):
        check_state([1.0, np.nan, 0.0], 3)


def test_denormalize_clips_then_scales_and_passes_gripper():
    stats = _stats()
    a = np.array([[0.0, 1.5, -0.25]], np.float32)
    # d0: (0+1)*2/2-1 = 0 ; d1: clip 1.5->1 -> (2)*2/2+0 = 2 ; d2 gripper raw -0.25
    np.testing.assert_allclose(stats.denormalize(a), [[0.0, 2.0, -0.25]])


def test_quat_to_axis_angle():
    half = np.sqrt(0.5)
    np.testing.assert_allclose(quat_to_axis_angle([0, 0, half, half]), [0, 0, np.pi / 2], 1e-6)
    np.testing.assert_allclose(quat_to_axis_angle([0, 0, 0, 1]), [0, 0, 0])
    np.testing.assert_allclose(quat_to_axis_angle([1, 0, 0, 0]), [np.pi, 0, 0], 1e-6)
    with pytest.raises(ObservationError, match="unit quaternion"):
        quat_to_axis_angle([0, 0, 0, 0.1])


def test_normalize_instruction():
    raw = '  "Task: Put the bowl   on the plate." '
    assert normalize_instruction(raw) == "put the bowl on the plate"
    two = "Open the drawer. Then close it!"
    assert normalize_instruction(two) == "open the drawer; then close it"
    assert normalize_instruction("The task is to pick up the cup") == "pick up the cup"
    # the model's own rules (LeRobot's _normalize_question_text), not a tidier reading:
    # every run of .!? splits, also inside a word; "-" after a prefix; "…" and closers trail
    assert normalize_instruction("pick up the 3.5 cm block") == "pick up the 3; 5 cm block"
    assert normalize_instruction("Goal - Open it") == "open it"
    assert normalize_instruction("language_instruction: wait...go…") == "wait; go"
    assert normalize_instruction("(stack them!)") == "stack them"


def test_timesteps_and_noise():
    np.testing.assert_allclose(timesteps(2), [0.0, 0.5])
    np.testing.assert_allclose(timesteps(10)[3], 0.3, rtol=1e-6)
    pad = action_dim_is_pad(7, 32)
    x0 = initial_noise(3, (1, 10, 32), pad)
    assert np.all(x0[..., 7:] == 0) and np.all(x0[..., :7] != 0)
    np.testing.assert_array_equal(x0, initial_noise(3, (1, 10, 32), pad))


def test_euler_host_and_in_graph_rescale_agree():
    rng = np.random.default_rng(0)
    keep = np.ones((1, 1, 4), np.float32)
    keep[..., 3] = 0
    x = rng.standard_normal((1, 2, 4)).astype(np.float32) * keep
    v = rng.standard_normal((1, 2, 4)).astype(np.float32) * keep
    host = euler_update(x, v, keep, 5, Conventions(euler_in_graph=False))
    np.testing.assert_allclose(host, x + v / 5, rtol=1e-6)
    # a graph that baked dt0 = 1/10 returns x + v/10; the host must still land on x + v/5
    baked = Conventions(euler_in_graph=True, euler_baked_steps=10)
    np.testing.assert_allclose(euler_update(x, x + v / 10, keep, 5, baked), x + v / 5, atol=1e-6)
    np.testing.assert_array_equal(euler_update(x, x + v / 10, keep, 10, baked), x + v / 10)


def test_run_flow_integrates_constant_velocity():
    pad = action_dim_is_pad(2, 4)
    seen = []

    def step(x, t):
        seen.append(float(t[0]))
        return np.ones_like(x)  # velocity 1 everywhere, host Euler

    x = run_flow(step, np.zeros((1, 3, 4), np.float32), pad, 4, Conventions(euler_in_graph=False))
    np.testing.assert_allclose(seen, [0, 0.25, 0.5, 0.75])
    np.testing.assert_allclose(x[..., :2], 1.0, rtol=1e-6)
    assert np.all(x[..., 2:] == 0)


def test_conventions_reject_bad_values():
    with pytest.raises(BundleError, match="mask_value"):
        Conventions(mask_value=float("-inf"))
    with pytest.raises(BundleError, match="padding_side"):
        Conventions(padding_side="middle")
