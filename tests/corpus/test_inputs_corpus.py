"""Bad sensor input: raw images, compressed-image headers, JointState and TF state values.
Each is refused with one ObservationError line naming the field and the fix, before any
large allocation."""

from __future__ import annotations

import math
import sys
import tracemalloc

import numpy as np
import pytest
from image_bytes import jpeg_header, png_header

from molmoact2_ros.errors import ObservationError
from molmoact2_ros.host.images import decode_compressed, decode_image
from molmoact2_ros.host.state import state_from_joint_state, state_from_pose

pytestmark = pytest.mark.usefixtures("no_leaks")
NAMES = [f"j{i}" for i in range(8)]


def _refused(fn, *words):
    with pytest.raises(ObservationError) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


RAW = [
    # (encoding, height, width, step, data, words)
    ("16UC1", 4, 4, 8, bytes(32), ["16UC1", "depth or multi-bit", "rgb8"]),
    ("mono16", 4, 4, 8, bytes(32), ["mono16", "8-bit colour"]),
    ("32FC1", 4, 4, 16, bytes(64), ["32FC1", "depth"]),
    ("rgb16", 4, 4, 24, bytes(96), ["rgb16"]),
    ("bgra16", 2, 2, 16, bytes(32), ["bgra16"]),
    ("yuv422", 2, 2, 4, bytes(8), ["yuv422", "not supported"]),
    ("rgb8", 20000, 20000, 60000, bytes(16), ["20000x20000", "max_image_side_px=4096"]),
    ("rgb8", 5000, 5000, 15000, bytes(15000), ["5000x5000", "25000000 pixels",
                                                "max_image_side_px=4096 squared"]),
    ("rgb8", 1, 20_000_000, 60_000_000, bytes(16), ["20000000x1", "max_image_side_px"]),
    ("rgb8", 0, 4, 12, b"", ["must be positive", "empty frame"]),
    ("rgb8", -3, 4, 12, b"", ["must be positive"]),
    ("rgb8", 4, 4, 11, bytes(44), ["Image.step 11", "smaller than"]),
    ("rgb8", 4, 4, 12, bytes(47), ["truncated", "48 bytes"]),
    ("rgb8", 4, 4, 12, bytes(49), ["49 bytes"]),
    ("rgb8", 4.0, 4, 12, bytes(48), ["Image.height", "integer"]),
    ("rgb8", 4, 4, 12, np.zeros(12, np.float32), ["float32 array", "uint8"]),
    ("rgb8", 4, 4, 12, "not bytes" * 6, ["str", "bytes"]),
]


@pytest.mark.parametrize("encoding,height,width,step,data,words", RAW,
                         ids=[f"{r[0]}-{r[1]}x{r[2]}-{r[3]}" for r in RAW])
def test_bad_raw_image(encoding, height, width, step, data, words):
    _refused(lambda: decode_image(encoding, height, width, step, data), *words)


@pytest.mark.parametrize("height,width", [(3, 5000), (5000, 3), (4096, 4096)])
def test_raw_strips_within_the_area_cap_decode(height, width):
    """The cap is an area for raw frames: a harmless 3x5000 strip is not refused."""
    img = decode_image("rgb8", height, width, width * 3, bytes(height * width * 3))
    assert img.shape == (height, width, 3)


def test_raw_image_cap_is_configurable():
    _refused(lambda: decode_image("rgb8", 64, 64, 192, bytes(192 * 64), max_side_px=32),
             "64x64", "max_image_side_px=32")


COMPRESSED = [
    # (format, data, words)
    ("png", png_header(20000, 20000) + bytes(64), ["20000x20000", "max_image_side_px=4096"]),
    ("png", png_header(100000, 10) + bytes(64), ["100000x10"]),
    ("png", png_header(64, 64, depth=16), ["16-bit png", "8-bit"]),
    ("png", png_header(64, 64, depth=16, colour=0), ["16-bit png"]),
    ("jpeg", jpeg_header(30000, 30000), ["30000x30000", "max_image_side_px"]),
    ("jpeg", jpeg_header(64, 64, precision=12), ["12-bit jpeg"]),
    ("jpeg", jpeg_header(8000, 64, sof=0xC2), ["8000x64"]),  # progressive
    ("jpeg", b"\xff\xd8\xff\xe0\x00\x10JFIF", ["no frame header"]),
    ("jpeg", b"\xff\xd8\x00\x00\x00\x00", ["no marker"]),
    ("png", b"\x89PNG\r\n\x1a\n\x00\x00", ["no IHDR"]),
    ("png", b"GIF89a" + bytes(20), ["neither PNG nor JPEG"]),
    ("jpeg", b"BM" + bytes(60), ["neither PNG nor JPEG"]),
    ("png", b"", ["empty"]),
    ("16UC1; compressedDepth", png_header(64, 64, 16), ["not a jpeg/png colour image"]),
    ("tiff", b"II*\x00", ["not a jpeg/png"]),
]


@pytest.mark.parametrize("fmt,data,words", COMPRESSED, ids=[f"{c[0]}-{i}" for i, c in
                                                           enumerate(COMPRESSED)])
def test_bad_compressed_header_is_refused_before_decoding(fmt, data, words, monkeypatch):
    # a decoder that must never be reached: the header alone decides
    monkeypatch.setitem(sys.modules, "cv2", None)
    monkeypatch.setitem(sys.modules, "PIL", None)
    tracemalloc.start()
    try:
        _refused(lambda: decode_compressed(fmt, data), *words)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # nothing the size of the image was allocated


def test_compressed_cap_is_configurable(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)
    _refused(lambda: decode_compressed("png", png_header(640, 480), max_side_px=512),
             "640x480", "max_image_side_px=512")


JOINT_STATES = [
    # (names, positions, words)
    (NAMES + ["j0"], list(range(9)), ["['j0']", "more than once"]),
    (["j0", "j0"] + NAMES[1:], list(range(9)), ["more than once"]),
    (NAMES, list(range(9)), ["8 names but 9 positions"]),
    (NAMES, list(range(7)), ["8 names but 7 positions"]),
    (NAMES, [], ["8 names but 0 positions"]),
    (NAMES[:7], list(range(7)), ["lacks ['j7']", "state.joint_names"]),
    (NAMES, [0, 1, 2, math.nan, 4, 5, 6, 7], ["NaN/inf at index [3]"]),
    (NAMES, [0, 1, 2, 3, 4, 5, 6, math.inf], ["NaN/inf at index [7]"]),
    (NAMES, [0, 1, 2, 3, 4, 5, 6, "x"], ["not a list of numbers"]),
    (NAMES, [0, 1, 2, 3, 4, 5, 6, None], ["NaN/inf at index [7]"]),
]


@pytest.mark.parametrize("names,positions,words", JOINT_STATES,
                         ids=[f"js{i}" for i in range(len(JOINT_STATES))])
def test_bad_joint_state(names, positions, words):
    _refused(lambda: state_from_joint_state(names, positions, NAMES), *words)


TF_STATES = [
    # (xyz, quaternion xyzw, gripper, words)
    ([0, 0, 0], [math.nan, 0, 0, 1], [0, 0], ["quaternion", "NaN/inf"]),
    ([0, 0, 0], [0, 0, 0, 0], [0, 0], ["norm 0.000", "unit quaternion"]),
    ([0, 0, 0], [0, 0, 0, 5], [0, 0], ["norm 5.000"]),
    ([0, 0, 0], [0, 0, 1], [0, 0], ["quaternion has 3 values", "x, y, z, w"]),
    ([0, 0, 0], ["a", 0, 0, 1], [0, 0], ["quaternion", "not 4 numbers"]),
    ([0, 0], [0, 0, 0, 1], [0, 0], ["3 positions and 2 gripper values"]),
    ([0, 0, 0], [0, 0, 0, 1], [0], ["3 positions and 2 gripper values"]),
    ([0, math.inf, 0], [0, 0, 0, 1], [0, 0], ["NaN/inf at index [1]"]),
    ([0, 0, 0], [0, 0, 0, 1], [0, math.nan], ["NaN/inf at index [7]"]),
    (["x", 0, 0], [0, 0, 0, 1], [0, 0], ["not numbers"]),
]


@pytest.mark.parametrize("xyz,quat,gripper,words", TF_STATES,
                         ids=[f"tf{i}" for i in range(len(TF_STATES))])
def test_bad_tf_state(xyz, quat, gripper, words):
    _refused(lambda: state_from_pose(xyz, quat, gripper), *words)


def test_good_inputs_pass():
    assert decode_image("rgb8", 2, 2, 6, bytes(12)).shape == (2, 2, 3)
    assert state_from_joint_state(NAMES[::-1], list(range(8))[::-1], NAMES).tolist() == list(
        range(8))
    assert state_from_pose([0, 0, 0], [0, 0, 0, 1], [0.01, -0.01]).shape == (8,)
