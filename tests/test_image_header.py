"""Header reading of compressed images and the stamp gate: the accepting side of the checks."""

from __future__ import annotations

import pytest
from image_bytes import jpeg_header, png_header

from molmoact2_ros.control.stamps import StampGate
from molmoact2_ros.host.image_header import check_compressed_header, read_header


@pytest.mark.parametrize("width,height", [(1, 1), (640, 480), (4096, 4096), (378, 5)])
def test_png_and_jpeg_sizes_are_read_from_the_header(width, height):
    assert read_header(png_header(width, height) + b"rest") == ("png", width, height, 8)
    for sof in (0xC0, 0xC2):  # baseline and progressive
        assert read_header(jpeg_header(width, height, sof=sof)) == ("jpeg", width, height, 8)


def test_jpeg_fill_bytes_and_restart_markers_are_skipped():
    data = jpeg_header(32, 16)
    data = data[:2] + b"\xff\xff\xff\xd0" + data[2:]
    assert read_header(data)[1:3] == (32, 16)


def test_low_bit_depth_png_is_accepted():
    assert check_compressed_header("png", png_header(8, 8, depth=1, colour=0)).bit_depth == 1


def test_stamp_gate_admits_in_order_and_equal_stamps_and_sees_jumps():
    gate = StampGate()
    assert gate.admit(100, 100, 0.5) is None and gate.admit(100, 100, 0.5) is None
    assert gate.admit(99, 100, 0.5) == "out_of_order"
    assert gate.admit(100 + 600_000_000, 100, 0.5) == "future_stamp"
    assert gate.clock_jump(10_000_000_000) == 0
    assert gate.clock_jump(10_500_000_000) == 0  # normal progress
    assert gate.clock_jump(9_000_000_000) == -1_500_000_000  # back by 1.5 s
    gate.reset()
    assert gate.admit(1, 1, 0.5) is None and gate.clock_jump(5) == 0
