"""Tests for host/images.py: decoding, torch-exact bilinear resize, patchify, preprocess."""

from __future__ import annotations

import array
import io
import math
import sys
import threading
import types

import numpy as np
import pytest
from image_bytes import jpeg_header, png_header

from molmoact2_ros.errors import ObservationError
from molmoact2_ros.host.images import (
    ENCODINGS,
    decode_compressed,
    decode_image,
    flip_180,
    patchify,
    preprocess,
    resize_bilinear,
    to_unit_range,
)


def gray3(values: list[list[int]]) -> np.ndarray:
    """A single-channel picture replicated to RGB, for hand-worked resize examples."""
    g = np.array(values, dtype=np.uint8)
    return np.repeat(g[:, :, None], 3, axis=2)


def rand_u8(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- resize, by hand


def test_resize_2x2_to_4x4_by_hand() -> None:
    # scale = 2/4 = 0.5; src = (d + 0.5) * 0.5 - 0.5 = -0.25 -> 0 (clamped), 0.25, 0.75, 1.25.
    # d=0: x0=0, lambda 0 -> a | d=1: 0.75a + 0.25b | d=2: 0.25a + 0.75b | d=3: x0=1, x1=1 -> b.
    # Rows: [0, 100] -> [0, 25, 75, 100];  [200, 40] -> [200, 160, 80, 40].
    # Output rows mix those the same way (all sums exact in float32):
    #   r1 = 0.75*[0,25,75,100] + 0.25*[200,160,80,40] = [50, 58.75, 76.25, 85] -> [50, 59, 76, 85]
    #   r2 = 0.25*[0,25,75,100] + 0.75*[200,160,80,40] = [150, 126.25, 78.75, 55] -> [150,126,79,55]
    out = resize_bilinear(gray3([[0, 100], [200, 40]]), 4, 4)
    expected = [
        [0, 25, 75, 100],
        [50, 59, 76, 85],
        [150, 126, 79, 55],
        [200, 160, 80, 40],
    ]
    assert out.dtype == np.uint8 and out.shape == (4, 4, 3)
    np.testing.assert_array_equal(out, gray3(expected))


def test_resize_2x2_to_3x3_by_hand_with_ties() -> None:
    # scale = float32(2/3); src: d=0 -> -1/6 -> 0; d=1 -> 0.5 (the float32 result rounds to
    # exactly 0.5); d=2 -> 1.1667 -> x0 = x1 = 1. So along an axis [a, b] -> [a, (a+b)/2, b].
    # Rows: [0, 101] -> [0, 50.5, 101];  [51, 200] -> [51, 125.5, 200].
    # Middle row = mean of rows: [25.5, 88, 150.5].
    # Round half to even: 50.5 -> 50, 125.5 -> 126, 25.5 -> 26, 150.5 -> 150.
    out = resize_bilinear(gray3([[0, 101], [51, 200]]), 3, 3)
    np.testing.assert_array_equal(out, gray3([[0, 50, 101], [26, 88, 150], [51, 126, 200]]))


def test_resize_rounds_exact_halves_to_even() -> None:
    # 1x2 -> 1x3: the middle sample is 0.5*a + 0.5*b, exactly x.5 when a + b is odd.
    img = np.array([[[2, 1, 254], [3, 2, 255]]], dtype=np.uint8)
    mid = resize_bilinear(img, 1, 3)[0, 1]
    # 2.5 -> 2, 1.5 -> 2, 254.5 -> 254 (half-up would give 3, 2, 255).
    assert mid.tolist() == [2, 2, 254]


def test_resize_constant_image_stays_constant() -> None:
    for value in (0, 1, 127, 254, 255):
        img = np.full((13, 29, 3), value, dtype=np.uint8)
        for size in ((378, 378), (5, 3), (29, 13)):
            out = resize_bilinear(img, *size)
            assert out.shape == (*size, 3)
            assert (out == value).all(), (value, size)


def test_resize_same_size_is_identity() -> None:
    img = rand_u8(np.random.default_rng(1), 378, 378)
    np.testing.assert_array_equal(resize_bilinear(img, 378, 378), img)


def test_resize_matches_torch_fused_multiply_add_rounding() -> None:
    # Pinned from torch 2.13 CPU, F.interpolate(float, (1, 168), bilinear, align_corners=False,
    # antialias=False).round() with 2 threads (its generic kernel: src and each lerp are a
    # float32 fused multiply-add). The naive unfused float32 formula gives 2, 18, 36, 55 here.
    img = np.array([[[129, 1, 202], [255, 85, 54]]], dtype=np.uint8)
    out = resize_bilinear(img, 1, 168)[0, :, 1]
    assert [int(out[i]) for i in (43, 59, 77, 95)] == [3, 18, 37, 54]


# ----------------------------------------------------------------- resize, slow reference


def _f32(v: float) -> float:
    """Round a Python float to the nearest float32 (ties to even)."""
    return float(np.float32(v))


def _ref_taps(n_in: int, n_out: int) -> list[tuple[int, int, float, float]]:
    """Per output index: (i0, i1, w0, w1), written from the formula, one index at a time."""
    scale = _f32(_f32(n_in) / _f32(n_out))
    taps = []
    for d in range(n_out):
        src = _f32(scale * (d + 0.5) - 0.5)  # exact in double, one float32 rounding (= FMA)
        src = max(src, 0.0)
        i0 = min(math.floor(src), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        w1 = min(max(_f32(src - i0), 0.0), 1.0)
        taps.append((i0, i1, _f32(1.0 - w1), w1))
    return taps


def _ref_pixel(img: np.ndarray, ty: tuple, tx: tuple, ch: int) -> int:
    """One output value as torch's channels-last kernel computes it: float32 tap weights h*w,
    then fma(t11, w11, fma(t10, w10, fma(t00, w00, t01*w01)))."""
    y0, y1, wy0, wy1 = ty
    x0, x1, wx0, wx1 = tx
    w00, w01, w10, w11 = _f32(wy0 * wx0), _f32(wy0 * wx1), _f32(wy1 * wx0), _f32(wy1 * wx1)
    value = _f32(w00 * float(img[y0, x0, ch]) + _f32(w01 * float(img[y0, x1, ch])))
    value = _f32(w10 * float(img[y1, x0, ch]) + value)
    value = _f32(w11 * float(img[y1, x1, ch]) + value)
    return min(max(round(value), 0), 255)  # Python's round() is half-to-even


def _ref_resize_points(img: np.ndarray, out_h: int, out_w: int, points) -> list[int]:
    ty, tx = _ref_taps(img.shape[0], out_h), _ref_taps(img.shape[1], out_w)
    return [_ref_pixel(img, ty[y], tx[x], c) for y, x, c in points]


@pytest.mark.parametrize(
    ("in_hw", "out_hw"),
    [((5, 7), (11, 13)), ((20, 20), (7, 7)), ((3, 17), (8, 5)), ((1, 4), (2, 9))],
)
def test_resize_equals_slow_reference_small(in_hw: tuple, out_hw: tuple) -> None:
    rng = np.random.default_rng(sum(in_hw) * 100 + sum(out_hw))
    for _ in range(4):
        img = rand_u8(rng, *in_hw)
        points = [(y, x, c) for y in range(out_hw[0]) for x in range(out_hw[1]) for c in range(3)]
        expected = np.array(_ref_resize_points(img, *out_hw, points)).reshape(*out_hw, 3)
        np.testing.assert_array_equal(resize_bilinear(img, *out_hw), expected)


def test_resize_equals_slow_reference_256_to_378() -> None:
    rng = np.random.default_rng(378)
    img = rand_u8(rng, 256, 256)
    out = resize_bilinear(img, 378, 378)
    # Full rows/columns at the borders and inside, plus random points (all 428k would be slow).
    lines = [0, 1, 188, 376, 377]
    points = [(y, x, c) for y in lines for x in range(378) for c in range(3)]
    points += [(y, x, c) for x in lines for y in range(378) for c in range(3)]
    ys, xs, cs = rng.integers(0, 378, 4000), rng.integers(0, 378, 4000), rng.integers(0, 3, 4000)
    points += list(zip(ys.tolist(), xs.tolist(), cs.tolist()))
    expected = _ref_resize_points(img, 378, 378, points)
    got = [int(out[p]) for p in points]
    assert got == expected


def test_resize_accepts_strided_views() -> None:
    img = rand_u8(np.random.default_rng(2), 40, 60)
    view = img[::2, 5:45]
    np.testing.assert_array_equal(
        resize_bilinear(view, 30, 31), resize_bilinear(np.ascontiguousarray(view), 30, 31)
    )


@pytest.mark.parametrize(
    "bad", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8), np.zeros((4, 4, 3))]
)
def test_resize_rejects_non_rgb_u8(bad: np.ndarray) -> None:
    with pytest.raises(ObservationError, match="image"):
        resize_bilinear(bad, 8, 8)


# ------------------------------------------------------------------------- unit range, patches


def test_to_unit_range_values() -> None:
    u = np.arange(256, dtype=np.uint8)
    x = to_unit_range(u)
    assert x.dtype == np.float32 and x.shape == (256,)
    assert x[0] == -1.0 and x[255] == 1.0
    # The processor's float32 steps: (u / 255) then * 2 - 1, each rounded to float32.
    for v in (1, 127, 128, 200):
        q = np.float32(v) / np.float32(255)
        assert x[v] == q * np.float32(2) - np.float32(1)
    # The vision tower re-snaps to the uint8 grid; that must give every u back.
    np.testing.assert_array_equal(np.round((x.astype(np.float64) + 1) / 2 * 255), u)
    assert np.all(np.diff(x) > 0)


def test_patchify_order() -> None:
    r, c, ch = np.meshgrid(np.arange(378), np.arange(378), np.arange(3), indexing="ij")
    x = (r * 10000 + c * 10 + ch).astype(np.float32)  # exact in float32 (< 2**24)
    p = patchify(x)
    assert p.shape == (729, 588)
    for row, col in ((0, 0), (2, 3), (26, 26), (13, 0)):
        for dy, dx, cc in ((0, 0, 0), (0, 1, 2), (5, 7, 1), (13, 13, 2)):
            assert p[row * 27 + col, (dy * 14 + dx) * 3 + cc] == x[row * 14 + dy, col * 14 + dx, cc]
    # The spec's example: patch 2*27+3, element (dy*14+dx)*3+c == x[2*14+dy, 3*14+dx, c].
    # With dy=4, dx=9, c=1 that is x[32, 51, 1] = 32*10000 + 51*10 + 1.
    assert p[27 * 2 + 3, (4 * 14 + 9) * 3 + 1] == 320511 == x[2 * 14 + 4, 3 * 14 + 9, 1]
    back = p.reshape(27, 27, 14, 14, 3).transpose(0, 2, 1, 3, 4).reshape(378, 378, 3)
    np.testing.assert_array_equal(back, x)


def test_patchify_rejects_non_multiple() -> None:
    with pytest.raises(ObservationError, match="divisible"):
        patchify(np.zeros((20, 20, 3), np.float32))


# ------------------------------------------------------------------------------- decode_image


def _padded(rows: np.ndarray, step: int, fill: int = 0xEE) -> bytes:
    """Lay [H, W, C] bytes out with ``step`` bytes per row; padding filled with a sentinel."""
    h = rows.shape[0]
    flat = rows.reshape(h, -1)
    buf = np.full((h, step), fill, dtype=np.uint8)
    buf[:, : flat.shape[1]] = flat
    return buf.tobytes()


@pytest.fixture
def rgb() -> np.ndarray:
    return rand_u8(np.random.default_rng(7), 3, 5)


def test_decode_rgb8_with_step_padding(rgb: np.ndarray) -> None:
    out = decode_image("rgb8", 3, 5, 20, _padded(rgb, 20))
    assert out.dtype == np.uint8 and out.shape == (3, 5, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, rgb)


def test_decode_bgr8_swaps_channels(rgb: np.ndarray) -> None:
    out = decode_image("bgr8", 3, 5, 17, _padded(rgb[:, :, ::-1], 17))
    np.testing.assert_array_equal(out, rgb)
    assert out.flags.c_contiguous


@pytest.mark.parametrize("encoding", ["rgba8", "bgra8"])
def test_decode_four_channel_drops_alpha(rgb: np.ndarray, encoding: str) -> None:
    colour = rgb if encoding == "rgba8" else rgb[:, :, ::-1]
    alpha = np.full((3, 5, 1), 77, dtype=np.uint8)
    out = decode_image(encoding, 3, 5, 24, _padded(np.concatenate([colour, alpha], axis=2), 24))
    np.testing.assert_array_equal(out, rgb)
    assert out.flags.c_contiguous


def test_decode_mono8_replicates(rgb: np.ndarray) -> None:
    gray = rgb[:, :, 0]
    out = decode_image("mono8", 3, 5, 8, _padded(gray, 8))
    np.testing.assert_array_equal(out, np.repeat(gray[:, :, None], 3, axis=2))
    assert out.flags.c_contiguous


def test_decode_accepts_every_buffer_type(rgb: np.ndarray) -> None:
    raw = _padded(rgb, 16)
    for data in (
        raw,
        bytearray(raw),
        memoryview(raw),
        array.array("B", raw),
        np.frombuffer(raw, dtype=np.uint8),
    ):
        np.testing.assert_array_equal(decode_image("rgb8", 3, 5, 16, data), rgb)


def test_decode_copies_out_of_the_message(rgb: np.ndarray) -> None:
    raw = bytearray(rgb.tobytes())
    out = decode_image("rgb8", 3, 5, 15, raw)
    raw[0] ^= 0xFF  # a driver reusing its buffer must not change an image already decoded
    assert out[0, 0, 0] == rgb[0, 0, 0]
    out[0, 0, 0] ^= 0xFF  # and the result is ours to modify
    assert raw[0] == rgb[0, 0, 0] ^ 0xFF


def test_decode_unknown_encoding_names_supported_ones() -> None:
    with pytest.raises(ObservationError) as err:
        decode_image("yuv422", 2, 2, 4, bytes(8))
    msg = str(err.value)
    assert "yuv422" in msg and "CompressedImage" in msg
    assert all(name in msg for name in ENCODINGS)


def test_decode_step_too_small() -> None:
    with pytest.raises(ObservationError, match=r"step 14 .*width\*channels = 5\*3 = 15"):
        decode_image("rgb8", 3, 5, 14, bytes(42))


def test_decode_truncated_data_says_expected_and_got() -> None:
    with pytest.raises(ObservationError, match=r"truncated.*60 bytes, got 59"):
        decode_image("rgb8", 3, 5, 20, bytes(59))


def test_decode_oversized_data() -> None:
    with pytest.raises(ObservationError, match=r"61 bytes but step\*height"):
        decode_image("rgb8", 3, 5, 20, bytes(61))


@pytest.mark.parametrize(("h", "w"), [(0, 5), (3, 0), (-1, 5)])
def test_decode_non_positive_size(h: int, w: int) -> None:
    with pytest.raises(ObservationError, match="must be positive"):
        decode_image("rgb8", h, w, 15, bytes(15))


def test_decode_wrong_data_types() -> None:
    with pytest.raises(ObservationError, match="uint16"):
        decode_image("rgb8", 1, 1, 3, np.zeros(3, dtype=np.uint16))
    with pytest.raises(ObservationError, match="list"):
        decode_image("rgb8", 1, 1, 3, [1, 2, 3])
    with pytest.raises(ObservationError, match="2-byte items"):
        decode_image("rgb8", 1, 1, 3, array.array("H", [1, 2]))
    with pytest.raises(ObservationError, match="Image.height"):
        decode_image("rgb8", 1.5, 1, 3, bytes(3))


# -------------------------------------------------------------------------- decode_compressed


def _fake_cv2(result) -> types.ModuleType:
    mod = types.ModuleType("cv2")
    mod.IMREAD_COLOR = 1
    mod.imdecode = lambda buf, flags: result
    return mod


def test_decode_compressed_cv2_path_returns_rgb(monkeypatch: pytest.MonkeyPatch) -> None:
    bgr = rand_u8(np.random.default_rng(3), 4, 6)
    monkeypatch.setitem(sys.modules, "cv2", _fake_cv2(bgr))
    out = decode_compressed("jpeg", jpeg_header(6, 4) + b" not really")
    np.testing.assert_array_equal(out, bgr[:, :, ::-1])
    assert out.flags.c_contiguous


def test_decode_compressed_cv2_corrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", _fake_cv2(None))
    with pytest.raises(ObservationError, match="could not be decoded"):
        decode_compressed("png", png_header(6, 4) + b"garbage")


def test_decode_compressed_pillow_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    rgb = rand_u8(np.random.default_rng(4), 4, 6)

    class FakeImage:
        def __init__(self, data: bytes) -> None:
            if b"OK" not in data:
                raise OSError("cannot identify image file")

        def __enter__(self) -> FakeImage:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def convert(self, mode: str) -> np.ndarray:
            assert mode == "RGB"
            return rgb

    pil = types.ModuleType("PIL")
    pil.Image = types.SimpleNamespace(open=lambda f: FakeImage(f.read()))
    monkeypatch.setitem(sys.modules, "cv2", None)
    monkeypatch.setitem(sys.modules, "PIL", pil)
    np.testing.assert_array_equal(decode_compressed("png", png_header(6, 4) + b"OK..."), rgb)
    with pytest.raises(ObservationError, match="cannot identify"):
        decode_compressed("png", png_header(6, 4) + b"bad")


def test_decode_compressed_without_decoders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ObservationError, match="pip install opencv-python-headless"):
        decode_compressed("jpeg", jpeg_header(6, 4))


@pytest.mark.parametrize("fmt", ["16UC1; compressedDepth", "tiff"])
def test_decode_compressed_rejects_other_formats(fmt: str) -> None:
    with pytest.raises(ObservationError, match="not a jpeg/png"):
        decode_compressed(fmt, b"\x00")


def test_decode_compressed_real_pillow_png(monkeypatch: pytest.MonkeyPatch) -> None:
    image_mod = pytest.importorskip("PIL.Image")
    monkeypatch.setitem(sys.modules, "cv2", None)  # force the Pillow path
    rgb = rand_u8(np.random.default_rng(5), 7, 9)
    png = io.BytesIO()
    image_mod.fromarray(rgb).save(png, format="PNG")
    decoded = decode_compressed("rgb8; png compressed rgb8", png.getvalue())
    np.testing.assert_array_equal(decoded, rgb)
    with pytest.raises(ObservationError, match="could not be decoded"):
        decode_compressed("png", png.getvalue()[:20])


def test_decode_compressed_real_opencv_png() -> None:
    cv2 = pytest.importorskip("cv2")
    rgb = rand_u8(np.random.default_rng(6), 7, 9)
    ok, png = cv2.imencode(".png", np.ascontiguousarray(rgb[:, :, ::-1]))
    assert ok
    np.testing.assert_array_equal(decode_compressed("bgr8; png compressed bgr8", png), rgb)
    with pytest.raises(ObservationError, match="could not be decoded"):
        decode_compressed("png", b"\x89PNG\r\n\x1a\n broken")


# --------------------------------------------------------------------------------- preprocess


def _pipeline(img: np.ndarray) -> np.ndarray:
    """The documented steps composed by hand: resize -> unit range -> patchify."""
    return patchify(to_unit_range(resize_bilinear(img, 378, 378)))


def test_preprocess_shape_dtype_range_and_steps() -> None:
    rng = np.random.default_rng(11)
    agent, wrist = rand_u8(rng, 256, 256), rand_u8(rng, 224, 300)
    pv = preprocess([agent, wrist])
    assert pv.shape == (1, 2, 729, 588) and pv.dtype == np.float32
    assert pv.min() >= -1.0 and pv.max() <= 1.0
    np.testing.assert_array_equal(pv[0, 0], _pipeline(agent))
    np.testing.assert_array_equal(pv[0, 1], _pipeline(wrist))


def test_preprocess_keeps_camera_order() -> None:
    black = np.zeros((256, 256, 3), np.uint8)
    white = np.full((256, 256, 3), 255, np.uint8)
    pv = preprocess([black, white])
    assert (pv[0, 0] == -1.0).all() and (pv[0, 1] == 1.0).all()
    pv = preprocess([white, black])
    assert (pv[0, 0] == 1.0).all() and (pv[0, 1] == -1.0).all()


@pytest.mark.parametrize("hw", [(256, 256), (378, 378), (480, 640), (1000, 50)])
def test_preprocess_flip_is_a_180_rotation(hw: tuple[int, int]) -> None:
    img = rand_u8(np.random.default_rng(hw[1]), *hw)
    rotated = np.ascontiguousarray(np.rot90(img, 2))
    flipped = preprocess([img], flip=True)
    np.testing.assert_array_equal(flipped, preprocess([rotated]))
    assert not np.array_equal(flipped, preprocess([img]))
    np.testing.assert_array_equal(flip_180(img), rotated)


def test_preprocess_into_float16_buffer() -> None:
    rng = np.random.default_rng(12)
    imgs = [rand_u8(rng, 256, 256), rand_u8(rng, 256, 256)]
    buf = np.full((1, 2, 729, 588), np.nan, dtype=np.float16)
    result = preprocess(imgs, out=buf)
    assert result is buf
    np.testing.assert_array_equal(buf, preprocess(imgs).astype(np.float16))


def test_preprocess_into_float32_buffer_reused() -> None:
    rng = np.random.default_rng(13)
    buf = np.full((1, 2, 729, 588), np.nan, dtype=np.float32)
    for _ in range(2):
        imgs = [rand_u8(rng, 256, 256), rand_u8(rng, 200, 320)]
        assert preprocess(imgs, out=buf) is buf
        np.testing.assert_array_equal(buf, preprocess(imgs))


def test_preprocess_rejects_bad_out() -> None:
    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ObservationError, match=r"shape \(1, 2, 729, 588\)"):
        preprocess([img], out=np.zeros((1, 2, 729, 588), np.float32))
    with pytest.raises(ObservationError, match="float32 or float16"):
        preprocess([img], out=np.zeros((1, 1, 729, 588), np.float64))


def test_preprocess_names_the_bad_camera() -> None:
    good = np.zeros((16, 16, 3), np.uint8)
    with pytest.raises(ObservationError, match="camera 1 .*float32"):
        preprocess([good, np.zeros((16, 16, 3), np.float32)])
    with pytest.raises(ObservationError, match=r"camera 0 .*\(16, 16, 4\)"):
        preprocess([np.zeros((16, 16, 4), np.uint8), good])
    with pytest.raises(ObservationError, match="no camera"):
        preprocess([])


def test_preprocess_is_thread_safe() -> None:
    rng = np.random.default_rng(14)
    pairs = [[rand_u8(rng, 256, 256), rand_u8(rng, 256, 256)] for _ in range(4)]
    expected = [preprocess(p) for p in pairs]
    results: dict[int, list[np.ndarray]] = {i: [] for i in range(4)}

    def work(i: int) -> None:
        for _ in range(5):
            results[i].append(preprocess(pairs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert len(results[i]) == 5
        for got in results[i]:
            np.testing.assert_array_equal(got, expected[i])
