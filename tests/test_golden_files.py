"""Golden npz handling: no pickle, missing keys named with what the file holds, metrics."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.bundle.golden import compare, format_table, load_npz
from molmoact2_ros.errors import GoldenError


def test_missing_keys_say_what_the_file_holds(tmp_path):
    path = tmp_path / "vision_io.npz"
    np.savez(path, pixel_values=np.zeros((1, 2, 3), np.float32), other=np.ones(4))
    with pytest.raises(GoldenError) as err:
        load_npz(path, ["pixel_values", "image_embeds"], what="vision parity")
    msg = str(err.value)
    assert "lacks ['image_embeds']" in msg and "pixel_values[1, 2, 3]" in msg and "other[4]" in msg


def test_object_arrays_are_refused(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(GoldenError, match="without pickle"):
        load_npz(path, ["x"])


def test_truncated_and_missing_files(tmp_path):
    path = tmp_path / "t.npz"
    np.savez(path, x=np.arange(1000.0))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(GoldenError, match="not a readable .npz"):
        load_npz(path, ["x"])
    with pytest.raises(GoldenError, match="missing"):
        load_npz(tmp_path / "absent.npz")


def test_compare_metrics():
    want = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    row = compare("c", "t", want * 1.0, want)
    assert row.passed and row.cosine == pytest.approx(1.0) and row.max_abs == 0.0
    bad = compare("c", "t", want[::-1], want)
    assert not bad.passed and bad.cosine < 0.9
    shape = compare("c", "t", want[:3], want)
    assert not shape.passed and "shape" in shape.note
    nan = compare("c", "t", np.array([np.nan, 1, 1, 1]), want)
    assert not nan.passed and "NaN" in nan.note
    ids = compare("c", "ids", np.array([1, 2, 4]), np.array([1, 2, 3]))
    assert not ids.passed  # integer tensors must match exactly
    off = compare("c", "t", want + np.array([0, 0, 0, 0.5], np.float32), want, atol=0.1, rtol=0)
    assert off.within_tol == pytest.approx(0.75) and off.max_abs == pytest.approx(0.5)
    table = format_table([row, bad])
    assert "PASS" in table and "FAIL" in table
