"""Chunk timing (start stamp, first future row) and blending on hand-computed chunks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from molmoact2_ros.control.execution import (
    Executing,
    blend,
    chunk_timing,
    first_future_index,
    inpaint_guidance,
    inpaint_weights,
    ramp_weights,
)

MS = 1_000_000


def test_observation_start_marks_the_rows_already_due():
    # observed at 10.000 s, published at 10.150 s, 50 ms period: rows 0, 1, 2 were due at
    # 10.050, 10.100, 10.150 (<= publish), row 3 at 10.200 is the first still ahead
    timing = chunk_timing("observation", 10_000 * MS, 10_150 * MS, 50 * MS, 10)
    assert (timing.start_ns, timing.trajectory_stamp_ns, timing.first_future_index) == (
        10_000 * MS, 10_000 * MS, 3)
    just_before = chunk_timing("observation", 10_000 * MS, 10_149 * MS, 50 * MS, 10)
    assert just_before.first_future_index == 2


def test_receipt_start_runs_from_publish_time_with_a_zero_trajectory_stamp():
    timing = chunk_timing("receipt", 10_000 * MS, 10_150 * MS, 50 * MS, 10)
    assert (timing.start_ns, timing.trajectory_stamp_ns, timing.first_future_index) == (
        10_150 * MS, 0, 0)


def test_first_future_index_is_clamped_to_the_chunk():
    assert first_future_index(0, -5 * MS, 50 * MS, 10) == 0
    assert first_future_index(0, 2_000 * MS, 50 * MS, 10) == 10
    with pytest.raises(ValueError, match="period"):
        first_future_index(0, 0, 0, 10)
    with pytest.raises(ValueError, match="execution.start"):
        chunk_timing("later", 0, 0, 50 * MS, 10)


def _prev(horizon=5, start_ns=0, period_ns=100, counts=None) -> Executing:
    rows = np.arange(horizon, dtype=np.float32)[:, None].repeat(2, axis=1)  # row j holds j
    return Executing(rows, start_ns, period_ns, counts)


NEW = np.full((5, 2), 100.0, np.float32)


def test_none_and_inpaint_leave_the_chunk_and_report_the_raw_jump():
    # new chunk starts 2 rows later: its rows 0..2 coincide with old rows 2..4
    for mode in ("none", "inpaint"):
        res = blend(mode, NEW, _prev(), 200, 1)
        np.testing.assert_array_equal(res.actions, NEW)
        assert res.overlap_rows == 3
        assert res.boundary_jump == pytest.approx(97.0)  # new row 1 (100) vs old row 3 (3)


def test_crossfade_linear_on_a_hand_computed_chunk():
    res = blend("crossfade", NEW, _prev(), 200, 1)
    # row 0 already due: old (2); future overlap rows 1, 2 get new weights 1/3, 2/3
    want = [2.0, 3 * 2 / 3 + 100 / 3, 4 / 3 + 200 / 3, 100.0, 100.0]
    np.testing.assert_allclose(res.actions[:, 0], want, rtol=1e-6)
    assert res.boundary_jump == pytest.approx(want[1] - 3.0, rel=1e-6)


def test_crossfade_cosine_ramp():
    res = blend("crossfade", NEW, _prev(), 200, 0, ramp="cosine")
    w = [0.5 - 0.5 * math.cos(math.pi * k / 4) for k in (1, 2, 3)]
    want = [(1 - wk) * old + wk * 100 for wk, old in zip(w, (2, 3, 4))] + [100, 100]
    np.testing.assert_allclose(res.actions[:, 1], want, rtol=1e-6)
    np.testing.assert_allclose(ramp_weights(3, "cosine"), w)
    with pytest.raises(ValueError, match="crossfade_ramp"):
        ramp_weights(3, "cubic")


def test_ensemble_weights_older_predictions_as_act():
    decay = math.log(2.0)  # weights 1, 1/2, 1/4 for the oldest, next, newest prediction
    first = blend("ensemble", NEW, _prev(), 200, 1, decay=decay)
    np.testing.assert_allclose(first.actions[:3, 0], [(o + 50) / 1.5 for o in (2, 3, 4)],
                               rtol=1e-6)
    np.testing.assert_array_equal(first.actions[3:], NEW[3:])
    np.testing.assert_array_equal(first.counts, [2, 2, 2, 1, 1])
    # a third prediction for the same times, one row later
    prev = Executing(first.actions, 200, 100, first.counts)
    third = np.full((5, 2), -40.0, np.float32)
    out = blend("ensemble", third, prev, 300, 0, decay=decay)
    # time of new row 0 = old row 1 (times 2 predictions: old 3, 100; now -40)
    want0 = (1 * 3 + 0.5 * 100 + 0.25 * -40) / 1.75
    want3 = (1 * 100 + 0.5 * -40) / 1.5  # old row 4 held one prediction only
    np.testing.assert_allclose(out.actions[[0, 3], 0], [want0, want3], rtol=1e-6)
    np.testing.assert_array_equal(out.counts, [3, 3, 2, 2, 1])


def test_no_previous_chunk_or_no_overlap_leaves_the_chunk():
    res = blend("crossfade", NEW, None, 0, 0)
    np.testing.assert_array_equal(res.actions, NEW)
    assert (res.overlap_rows, res.boundary_jump) == (0, 0.0)
    late = blend("crossfade", NEW, _prev(), 900, 0)  # starts after the old chunk ended
    np.testing.assert_array_equal(late.actions, NEW)
    assert late.overlap_rows == 0
    assert late.boundary_jump == pytest.approx(96.0)  # against the held last row (4)
    with pytest.raises(ValueError, match="execution.blend"):
        blend("average", NEW, None, 0, 0)


def test_inpaint_weights_freeze_then_decay():
    w = inpaint_weights(2, 5, 8)
    c = np.array([3, 2, 1]) / 4
    want = [1, 1, *(c * np.expm1(c) / math.expm1(1)), 0, 0, 0]
    np.testing.assert_allclose(w, want, rtol=1e-6)
    assert np.all(np.diff(w) <= 0)
    np.testing.assert_array_equal(inpaint_weights(0, 0, 4), np.zeros(4))


def test_inpaint_guidance_takes_the_overlap_and_the_rows_due_during_inference():
    prev = _prev(horizon=10, start_ns=0, period_ns=50 * MS)
    g = inpaint_guidance(prev, 100 * MS, 230 * MS, 10)
    # offset 2 rows, 8 overlap rows; rows due by 230 ms (2) and the first after: 3 frozen
    assert (g.frozen_rows, g.overlap_rows) == (3, 8)
    np.testing.assert_array_equal(g.prefix[:8, 0], np.arange(2, 10))
    np.testing.assert_array_equal(g.prefix[8:], 0)
    np.testing.assert_allclose(g.weights, inpaint_weights(3, 8, 10))
    receipt = inpaint_guidance(prev, 100 * MS, 100 * MS, 10)  # runs from when it is ready
    assert receipt.frozen_rows == 1 and receipt.weights[0] == 1 and receipt.weights[1] < 1
    assert inpaint_guidance(None, 0, 0, 10) is None
    assert inpaint_guidance(prev, 600 * MS, 700 * MS, 10) is None
