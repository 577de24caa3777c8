"""The compressed-image decoder that installs with the package (Pillow): jpeg and png frames
decode to RGB, 16-bit and depth frames are refused with the reason."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from molmoact2_ros.errors import ObservationError
from molmoact2_ros.host.images import decode_compressed

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(autouse=True)
def _pillow_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # the path a default install takes


def _encode(arr: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


def _picture() -> np.ndarray:
    y, x = np.mgrid[0:48, 0:64]
    return np.stack([x * 4, y * 5, (x + y) * 2], -1).astype(np.uint8)


def test_png_is_lossless():
    img = _picture()
    np.testing.assert_array_equal(decode_compressed("png", _encode(img, "PNG")), img)


def test_jpeg_decodes_close_to_the_original():
    img = _picture()
    out = decode_compressed("rgb8; jpeg compressed bgr8", _encode(img, "JPEG", quality=95))
    assert out.shape == img.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - img.astype(int)).mean() < 3.0


def test_grey_png_becomes_three_channels():
    grey = _picture()[:, :, 0]
    out = decode_compressed("mono8; png compressed", _encode(grey, "PNG"))
    assert out.shape == (48, 64, 3) and np.array_equal(out[:, :, 1], grey)


def test_sixteen_bit_png_is_refused():
    deep = (np.arange(48 * 64, dtype=np.uint16).reshape(48, 64) * 13)
    data = _encode(deep, "PNG")
    assert data[24] == 16  # a real 16-bit PNG
    with pytest.raises(ObservationError, match="16-bit png; the policy takes 8-bit colour"):
        decode_compressed("png", data)


@pytest.mark.parametrize("fmt", ["mono16; png compressed", "16UC1; compressedDepth png",
                                 "rgb16; png compressed"])
def test_sixteen_bit_and_depth_formats_are_refused(fmt):
    with pytest.raises(ObservationError, match="16-bit|not a jpeg/png colour image"):
        decode_compressed(fmt, _encode(_picture(), "PNG"))


def test_corrupt_jpeg_names_the_problem():
    data = _encode(_picture(), "JPEG")[:40]
    with pytest.raises(ObservationError, match="could not be decoded"):
        decode_compressed("jpeg", data)
