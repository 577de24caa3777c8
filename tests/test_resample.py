"""The fast resize/normalise path against the independent numpy reference, whole images."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.host.images import preprocess, resize_bilinear, to_unit_range
from molmoact2_ros.host.resample import unit_table
from molmoact2_ros.synth import reference_host as ref


def _rand(seed: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    ("in_hw", "out_hw"),
    [
        ((256, 256), (378, 378)),  # LIBERO renders
        ((480, 640), (378, 378)),  # VGA cameras: downscale, every row read
        ((1000, 50), (378, 378)),
        ((60, 2), (90, 3)),  # lambda exactly 0.5 on every row: many exact ties (x.5)
        ((2, 60), (3, 90)),
        ((7, 9), (378, 378)),  # large upscale: long runs of equal taps
    ],
)
def test_resize_equals_reference_on_every_pixel(in_hw: tuple, out_hw: tuple) -> None:
    for seed in range(3):
        img = _rand(seed + sum(in_hw), *in_hw)
        np.testing.assert_array_equal(
            resize_bilinear(img, *out_hw), ref.resize_bilinear_uint8(img, *out_hw)
        )


def test_resize_exact_on_ties_and_smooth_images() -> None:
    # Neighbouring levels that differ by one put every lambda = 0.5 sample on an exact x.5;
    # gradients put many samples close to the rounding boundary.
    ramp = (np.arange(60)[:, None, None] + np.arange(2)[None, :, None] + np.zeros(3, int))
    ramp = ramp.astype(np.uint8)
    np.testing.assert_array_equal(
        resize_bilinear(ramp, 90, 3), ref.resize_bilinear_uint8(ramp, 90, 3)
    )
    yy, xx = np.mgrid[0:256, 0:256]
    smooth = np.stack([(yy + xx) // 2, (yy * 3) % 256, np.full_like(yy, 128)], axis=2)
    smooth = smooth.astype(np.uint8)
    np.testing.assert_array_equal(
        resize_bilinear(smooth, 378, 378), ref.resize_bilinear_uint8(smooth, 378, 378)
    )


def test_unit_table_is_the_processor_formula() -> None:
    u = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(unit_table("<f4"), to_unit_range(u))
    np.testing.assert_array_equal(unit_table("<f2"), to_unit_range(u).astype(np.float16))


@pytest.mark.parametrize("hw", [(256, 256), (480, 640), (378, 378)])
@pytest.mark.parametrize("flip", [False, True])
def test_preprocess_into_arena_dtypes_equals_reference(hw: tuple, flip: bool) -> None:
    primary, wrist = _rand(1, *hw), _rand(2, *hw)
    seen = [np.rot90(primary, 2), np.rot90(wrist, 2)] if flip else [primary, wrist]
    expected = ref.pixel_values(*seen)
    out32 = np.full((1, 2, 729, 588), np.nan, np.float32)
    preprocess([primary, wrist], flip=flip, out=out32)
    np.testing.assert_array_equal(out32, expected)
    out16 = np.full((1, 2, 729, 588), np.nan, np.float16)
    preprocess([primary, wrist], flip=flip, out=out16)
    np.testing.assert_array_equal(out16, expected.astype(np.float16))


def test_preprocess_numpy_lookup_equals_reference(monkeypatch) -> None:
    from molmoact2_ros.host import resample

    monkeypatch.setattr(resample, "_cv2_lut", lambda: None)  # the path without OpenCV
    primary, wrist = _rand(7, 256, 256), _rand(8, 480, 640)
    expected = ref.pixel_values(primary, wrist)
    for dtype in (np.float16, np.float32):
        out = np.full((1, 2, 729, 588), np.nan, dtype)
        preprocess([primary, wrist], out=out)
        np.testing.assert_array_equal(out, expected.astype(dtype))
