"""PromptPlan.embed into float16/float32 buffers against the independent numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.host import fp16
from molmoact2_ros.host.prompt import PromptPlan
from molmoact2_ros.synth import reference_host as ref

KERNELS = ["numpy"] + [k for k in ("opencv", "numba") if fp16.CHOICE.available(k)]


@pytest.fixture(params=KERNELS)
def kernel(request):
    fp16.force(request.param)
    yield request.param
    fp16.force(None)


def _case(seq: int, hidden: int, runs: list[tuple[int, int]], seed: int = 0):
    """A float16 table, token ids with a state block and <im_patch> runs, and f16 features."""
    rng = np.random.default_rng(seed)
    vocab, patch_id, state_base = 400, 3, 100
    table = (rng.standard_normal((vocab, hidden)) * rng.choice([1e-3, 1.0, 300.0], (vocab, 1)))
    table = table.astype(np.float16)
    ids = rng.integers(10, 90, seq)
    positions = np.concatenate([np.arange(a, b) for a, b in runs])
    ids[positions] = patch_id
    state_positions = np.arange(runs[-1][1] + 1, runs[-1][1] + 9)
    bins = rng.integers(0, 256, 8)
    with_state = ids.copy()
    with_state[state_positions] = state_base + bins
    feats = (rng.standard_normal((positions.size, hidden)) * 40).astype(np.float16)
    plan = PromptPlan(
        instruction="t", input_ids=ids, valid=np.ones(seq, bool), is_image=ids == patch_id,
        state_positions=state_positions, patch_positions=positions,
        base_embeddings=table[ids].astype(np.float32),
        attention_bias=np.zeros((1, 1, seq, seq), np.float32),
        encoder_mask=np.ones((1, seq), np.float32), state_base_id=state_base, num_valid=seq,
        add_image_to_patch_embedding=True,
        state_rows=table[state_base : state_base + 256].astype(np.float32),
    )
    expected = ref.embed(table, with_state, patch_id, feats.astype(np.float32))
    return plan, bins, feats, expected


@pytest.mark.parametrize(
    ("seq", "runs"), [(128, [(1, 17), (19, 35)]), (488, [(1, 197), (199, 395)]), (40, [(0, 6)])]
)
def test_embed_equals_reference(kernel: str, seq: int, runs: list) -> None:
    plan, bins, feats, expected = _case(seq, 64, runs)
    out16 = np.full((1, seq, 64), np.nan, np.float16)
    for _ in range(2):  # the second call runs on the cached tables
        plan.embed(bins, feats, out=out16)
        np.testing.assert_array_equal(out16, expected.astype(np.float16))
    out32 = np.full((1, seq, 64), np.nan, np.float32)
    plan.embed(bins, feats, out=out32)
    np.testing.assert_array_equal(out32, expected)
    plan.embed(bins, feats.astype(np.float32), out=out16)  # float32 features, f16 buffer
    np.testing.assert_array_equal(out16, expected.astype(np.float16))


def test_fp16_add_is_float32_add_rounded_once(kernel: str) -> None:
    a, b = fp16._probe()
    rng = np.random.default_rng(1)
    more = rng.integers(0, 1 << 16, (2, 30000), dtype=np.uint16).view(np.float16)
    a, b = np.concatenate([a, more[0]]), np.concatenate([b, more[1]])
    with np.errstate(all="ignore"):
        want = (a.astype(np.float64) + b.astype(np.float64)).astype(np.float32)
        want = want.astype(np.float16)  # float32 sum of two halves, rounded once
        got = np.empty_like(a).reshape(1, -1)
        fp16.add_into(a.reshape(1, -1), b.reshape(1, -1), got)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got[0]), nan)
    np.testing.assert_array_equal(got[0][~nan].view(np.uint16), want[~nan].view(np.uint16))


def test_force_rejects_unknown_kernel() -> None:
    with pytest.raises(ValueError, match="unknown fp16 kernel"):
        fp16.force("cuda")


def test_numba_kernel_maths_uncompiled_equals_numpy() -> None:
    """The function numba compiles, run as plain Python on the probe (ties, subnormals,
    overflow, inf, NaN) in blocks that do not divide it: the maths holds without numba too.
    Which payload NaN + NaN keeps is the arithmetic unit's choice (numpy scalars and compiled
    loops differ), so those sums are only checked to be NaN."""
    a, b = fp16._probe()
    want, got = np.empty_like(a), np.empty_like(a)
    with np.errstate(all="ignore"):
        fp16.add_reference(a.reshape(1, -1), b.reshape(1, -1), want.reshape(1, -1))
    work = np.zeros((4, 1000), np.float32)
    with np.errstate(all="ignore"):  # inf - inf and NaN sums, on numpy scalars
        fp16.half_add(a.view(np.uint16), b.view(np.uint16), got.view(np.uint16), *work,
                      *work.view(np.uint32))
    both_nan = np.isnan(a) & np.isnan(b)
    assert np.isnan(got[both_nan]).all()
    np.testing.assert_array_equal(got.view(np.uint16)[~both_nan], want.view(np.uint16)[~both_nan])
