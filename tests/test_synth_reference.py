"""The numpy reference behind the tiny-bundle goldens: tokenizer, prompt, host maths, isolation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from molmoact2_ros.bundle.variants import VARIANTS
from molmoact2_ros.synth import assets
from molmoact2_ros.synth import reference_host as rh
from molmoact2_ros.synth.reference import prompt_ids
from molmoact2_ros.synth.writer import reference_for

#: The main prompt (BOS + tokens) of the golden trace, per variant.
MAIN_PROMPT_TOKENS = {"grid_sampler": 121, "lp_vtp_sd": 121, "fused": 481}
STATE = np.asarray(assets.MAIN_TRACE.state, dtype=np.float32)


@pytest.fixture(scope="module")
def references():
    return {v: reference_for(spec, 0) for v, spec in VARIANTS.items()}


def test_reference_imports_no_code_under_test():
    code = (
        "import sys, molmoact2_ros.synth.reference as r\n"
        "bad = [m for m in sys.modules if m.startswith(('onnx', 'onnxruntime', "
        "'molmoact2_ros.host', 'molmoact2_ros.policy', 'tokenizers'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reference_tokenizer_equals_tokenizers(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = assets.vocabulary()
    path = tmp_path / "tokenizer.json"
    path.write_text(assets.tokenizer_json(vocab))
    hf = tokenizers.Tokenizer.from_file(str(path))
    ref = rh.WordLevelTokenizer(vocab, assets.SPECIAL_TOKENS)
    assert hf.get_vocab_size() == len(vocab)
    for token in assets.SPECIAL_TOKENS:
        assert hf.token_to_id(token) == vocab.index(token)
    cfg = assets.prompt_config()
    rng = np.random.default_rng(0)
    texts = [rh.prompt_text(cfg, task, rng.integers(0, 256, 8), k)
             for task in assets.LIBERO_TASKS for k in (16, 196)]
    texts += ["Put the bowl, on the stove!!", "unknown words  here\t\n", "a<im_patch>b <state_12>"]
    for text in texts:
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ids == ref.encode(text), text


@pytest.mark.parametrize("variant", tuple(VARIANTS))
def test_prompt_lengths_fit(references, variant):
    model, host = references[variant]
    spec = VARIANTS[variant]
    _, _, n = prompt_ids(model, host, assets.MAIN_TRACE.instruction, STATE)
    assert n == MAIN_PROMPT_TOKENS[variant]
    for task in assets.LIBERO_TASKS:
        ids, valid, n = prompt_ids(model, host, task, STATE)
        assert n <= spec.seq_len and ids.shape == (spec.seq_len,)
        assert np.count_nonzero(ids[valid] == host.tokenizer.token_id("<im_patch>")) == (
            spec.image_tokens)
        assert host.tokenizer.unk_id not in ids[valid].tolist(), task


@pytest.mark.parametrize("variant", tuple(VARIANTS))
def test_overlong_instruction_is_refused(references, variant):
    model, host = references[variant]
    long_task = " ".join(["put the bowl on the plate"] * 80)
    with pytest.raises(rh.PromptTooLong):
        prompt_ids(model, host, long_task, STATE)


def test_padding_side_and_bos(references):
    for variant, side in (("grid_sampler", "right"), ("lp_vtp_sd", "left")):
        model, host = references[variant]
        ids, valid, n = prompt_ids(model, host, assets.MAIN_TRACE.instruction, STATE)
        bos, pad = host.tokenizer.token_id("<|im_end|>"), host.tokenizer.token_id("<|endoftext|>")
        first = 0 if side == "right" else model.seq_len - n
        assert ids[first] == bos and valid[first] and valid.sum() == n
        assert np.all(ids[~valid] == pad)


def test_normalize_task():
    assert rh.normalize_task("  Pick up the   Bowl. ") == "pick up the bowl"
    assert rh.normalize_task('"Task: open the drawer!"') == "open the drawer"
    assert rh.normalize_task("The task is to turn on the stove.") == "turn on the stove"
    assert rh.normalize_task("Open it. Then close it.") == "open it; then close it"


def test_resize_and_patchify():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)
    assert np.array_equal(rh.resize_bilinear_uint8(img, 32, 48), img)
    flat = np.full((256, 256, 3), 77, dtype=np.uint8)
    assert np.all(rh.resize_bilinear_uint8(flat, 378, 378) == 77)
    # 2x upsampling of a ramp: half-pixel centres give exact quarter weights
    ramp = np.tile(np.array([0, 100], dtype=np.uint8)[None, :, None], (1, 1, 3))
    row = rh.resize_bilinear_uint8(ramp, 1, 4)[0, :, 0]
    assert row.tolist() == [0, 25, 75, 100]
    # values pinned from torch CPU (F.interpolate bilinear, antialias=False, .round()): its
    # fused multiply-adds give these; unfused float32 arithmetic gives 2, 18, 36, 55
    pinned = np.array([[[129, 1, 202], [255, 85, 54]]], dtype=np.uint8)
    out = rh.resize_bilinear_uint8(pinned, 1, 168)[0, :, 1]
    assert [int(out[i]) for i in (43, 59, 77, 95)] == [3, 18, 37, 54]
    patches = rh.preprocess_image(assets.synthetic_image(3))
    assert patches.shape == (729, 588) and patches.dtype == np.float32
    u = rh.resize_bilinear_uint8(assets.synthetic_image(3), 378, 378)
    # patch 28 = row 1, col 1; element (dy*14+dx)*3+c
    f32 = np.float32
    want = f32(u[14 + 2, 14 + 5, 1]) / f32(255) * f32(2) - f32(1)
    assert patches[28, (2 * 14 + 5) * 3 + 1] == want


def test_state_bins_and_denormalize():
    stats = assets.norm_stats()["metadata_by_tag"]["libero"]
    bins = rh.state_bins(STATE, stats["state_stats"])
    assert bins.dtype == np.int64 and bins.shape == (8,) and np.all((bins >= 0) & (bins <= 255))
    assert bins[7] == 124  # unmasked dim: raw −0.0309 → rint(0.9691 / 2 · 255)
    a = np.array([[-2.0, -1.0, 0.0, 1.0, 2.0, 0.5, 1.7]], dtype=np.float32)
    y = rh.denormalize(a, stats["action_stats"])
    q01, q99 = stats["action_stats"]["q01"], stats["action_stats"]["q99"]
    assert np.isclose(y[0, 0], q01[0]) and np.isclose(y[0, 3], q99[3])
    assert y[0, 6] == 1.0  # gripper: clipped, not rescaled


def test_bias_and_encoder_mask_semantics():
    valid = np.array([True, True, True, True, False])
    img = np.array([False, True, True, False, False])
    bias = rh.attention_bias(valid, img, bidirectional=True, mask_value=-30000.0)[0, 0]
    assert bias[1, 2] == 0 and bias[0, 1] == -30000.0 and bias[4, 3] == 0 and bias[4, 4] != 0
    causal = rh.attention_bias(valid, img, bidirectional=False, mask_value=-1e4)[0, 0]
    assert causal[1, 2] == -1e4
    ids = np.array([9, 5, 5, 9, 0])
    assert rh.encoder_mask(ids, valid, 9, "exclude_eos").tolist() == [[0, 1, 1, 0, 0]]
    assert rh.encoder_mask(ids, valid, 9, "padding_only").tolist() == [[1, 1, 1, 1, 0]]
