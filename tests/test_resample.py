"""The fast resize/normalise path against the independent numpy reference, whole images."""

from __future__ import annotations

import numpy as np
import pytest

from molmoact2_ros.host import resample_jit
from molmoact2_ros.host.images import preprocess, resize_bilinear, to_unit_range
from molmoact2_ros.host.resample import plan, unit_table
from molmoact2_ros.synth import reference_host as ref


@pytest.fixture(params=["numpy", "numba"])
def kernel(request):
    """Run the test with each preprocessing implementation (numba only where installed)."""
    if request.param == "numba":
        pytest.importorskip("numba")
        assert resample_jit.kernel() == "numba", "numba is installed but its kernel was refused"
    with resample_jit.using(request.param):
        yield request.param


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
def test_preprocess_into_arena_dtypes_equals_reference(hw: tuple, flip: bool, kernel) -> None:
    primary, wrist = _rand(1, *hw), _rand(2, *hw)
    seen = [np.rot90(primary, 2), np.rot90(wrist, 2)] if flip else [primary, wrist]
    expected = ref.pixel_values(*seen)
    out32 = np.full((1, 2, 729, 588), np.nan, np.float32)
    preprocess([primary, wrist], flip=flip, out=out32)
    np.testing.assert_array_equal(out32, expected)
    out16 = np.full((1, 2, 729, 588), np.nan, np.float16)
    preprocess([primary, wrist], flip=flip, out=out16)
    np.testing.assert_array_equal(out16, expected.astype(np.float16))


def test_preprocess_numpy_lookup_equals_reference(monkeypatch, kernel) -> None:
    from molmoact2_ros.host import resample

    monkeypatch.setattr(resample, "_cv2_lut", lambda: None)  # the path without OpenCV
    primary, wrist = _rand(7, 256, 256), _rand(8, 480, 640)
    expected = ref.pixel_values(primary, wrist)
    for dtype in (np.float16, np.float32):
        out = np.full((1, 2, 729, 588), np.nan, dtype)
        preprocess([primary, wrist], out=out)
        np.testing.assert_array_equal(out, expected.astype(dtype))


@pytest.mark.parametrize(("in_hw", "size"), [((256, 256), 378), ((60, 2), 84), ((7, 9), 378)])
def test_preprocess_kernels_on_odd_geometries(in_hw: tuple, size: int, kernel) -> None:
    img = _rand(sum(in_hw), *in_hw)
    expected = ref.preprocess_image(img, image_size=size)
    out = np.full((1, 1) + expected.shape, np.nan, np.float32)
    preprocess([img], size=size, out=out)
    np.testing.assert_array_equal(out[0, 0], expected)


def test_kernel_maths_uncompiled_equals_reference() -> None:
    """The function numba compiles, run as plain Python on small frames (ties included): the
    maths is checked even where numba is not installed."""
    from molmoact2_ros.host.resample import lookup_into

    ramp = (np.arange(20)[:, None, None] + np.arange(11)[None, :, None]
            + np.zeros(3, int)).astype(np.uint8)
    for img, size, flip in ((ramp, 28, False), (_rand(5, 9, 13), 14, True)):
        p = plan(img.shape[0], img.shape[1], size, size, flip)
        tables = resample_jit._tables(p)
        grid = size // 14
        index8 = np.zeros((grid * grid, 14 * 14 * 3), np.uint8)
        resample_jit.resize_levels_patched(
            img.reshape(img.shape[0], -1), tables.y0, tables.y1, tables.wy0, tables.wy1,
            tables.c0, tables.c1, p.wx0, p.wx1, 14, index8, np.zeros(size * 3, np.uint8))
        got = np.empty(index8.shape, np.float32)
        lookup_into(index8, got)
        seen = np.rot90(img, 2) if flip else img
        np.testing.assert_array_equal(got, ref.preprocess_image(seen, image_size=size))


def test_a_kernel_that_differs_is_refused(monkeypatch, caplog) -> None:
    """A compiled kernel that does not reproduce the numpy path bit for bit (a compiler that
    fused an FMA, say) is never used: preprocessing falls back to numpy and says why."""
    pytest.importorskip("numba")
    real = resample_jit.KERNEL._build_fn

    def off_by_one_level(numba, cache: bool):
        fn = real(numba, cache)

        def wrong(*args):
            fn(*args)
            index8 = args[10]
            index8[0, 0] = min(int(index8[0, 0]) + 1, 255) if index8[0, 0] < 255 else 254

        return wrong

    monkeypatch.setattr(resample_jit.KERNEL, "_build_fn", off_by_one_level)
    resample_jit.KERNEL.reset()
    try:
        with caplog.at_level("WARNING", logger="molmoact2_ros.host.jit"):
            assert resample_jit.kernel() == "numpy"
        assert "differs from the numpy path" in caplog.text
        with pytest.raises(ValueError, match="not available"):
            resample_jit.force("numba")
    finally:
        resample_jit.KERNEL.reset()


def test_environment_switches_numba_off_without_importing_it() -> None:
    """MOLMOACT2_NUMBA=0 keeps numba (and its LLVM) out of the process."""
    import os
    import subprocess
    import sys

    code = ("import sys, numpy as np; from molmoact2_ros.host import images, resample_jit; "
            "out = np.zeros((1, 1, 729, 588), np.float16); "
            "images.preprocess([np.zeros((64, 64, 3), np.uint8)], out=out); "
            "print(resample_jit.kernel(), 'numba' in sys.modules, resample_jit.describe())")
    from molmoact2_ros.host import jit

    env = {**os.environ, jit.ENV: "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.split(maxsplit=2)
    assert out[:2] == ["numpy", "False"]
    assert jit.ENV in out[2]
