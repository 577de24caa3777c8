"""Image sizes and bit depths read from headers, so oversized or 16-bit frames are refused
before anything is decoded or allocated (a 400 kB PNG can inflate to gigabytes)."""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import ObservationError

#: Default cap on each side of an incoming image (parameter ``max_image_side_px``).
MAX_IMAGE_SIDE_PX = 4096
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they carry the size.
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
#: sensor_msgs/Image encodings that are depth or more than 8 bits per channel.
DEEP_ENCODINGS = ("16", "32", "64", "depth")


class ImageHeader(NamedTuple):
    """What a compressed image's header says: kind, size and bits per channel."""

    kind: str
    width: int
    height: int
    bit_depth: int


def check_image_side(width: int, height: int, max_side_px: int, what: str) -> None:
    """Refuse frames larger than ``max_side_px`` on either side, naming the parameter."""
    if width > max_side_px or height > max_side_px:
        raise ObservationError(
            f"{what} is {width}x{height} (width x height), larger than max_image_side_px="
            f"{max_side_px}; send smaller frames (the policy sees 378x378) or raise the limit")


def check_image_area(width: int, height: int, max_side_px: int, what: str) -> None:
    """Raw frames: refuse more pixels than a ``max_side_px`` square (the bytes are already in
    memory; what matters is the work and the copies), so a 3x5000 strip passes."""
    if width * height > max_side_px * max_side_px:
        raise ObservationError(
            f"{what} is {width}x{height} (width x height) = {width * height} pixels, more than "
            f"max_image_side_px={max_side_px} squared ({max_side_px * max_side_px}); send "
            "smaller frames (the policy sees 378x378) or raise the limit")


def check_raw_encoding(encoding: str) -> None:
    """Depth and 16/32-bit encodings are refused with what to publish instead."""
    lowered = encoding.lower()
    if any(k in lowered for k in DEEP_ENCODINGS):
        raise ObservationError(
            f"Image.encoding {encoding!r} is a depth or multi-bit format; the policy takes "
            "8-bit colour: publish rgb8/bgr8 (or mono8) for this input")


def read_header(data: bytes | memoryview) -> ImageHeader:
    """Size and bit depth of a PNG or JPEG from its first bytes; raises on anything else."""
    head = bytes(data[:8])
    if head.startswith(PNG_SIGNATURE):
        return _png(data)
    if head.startswith(b"\xff\xd8"):
        return _jpeg(data)
    raise ObservationError(f"starts with {head[:4].hex()}, which is neither PNG nor JPEG")


def _png(data) -> ImageHeader:
    ihdr = bytes(data[8:33])
    if len(ihdr) < 25 or ihdr[4:8] != b"IHDR":
        raise ObservationError("the PNG has no IHDR chunk (truncated or corrupt)")
    width, height, depth = struct.unpack(">IIB", ihdr[8:17])
    return ImageHeader("png", width, height, depth)


def _jpeg(data) -> ImageHeader:
    view, i, n = memoryview(data), 2, len(data)
    while i + 4 <= n:
        if view[i] != 0xFF:
            raise ObservationError(f"the JPEG has no marker at byte {i} (corrupt)")
        marker = view[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD9)):  # standalone markers
            i += 2
            continue
        (length,) = struct.unpack(">H", view[i + 2 : i + 4])
        if marker in _JPEG_SOF:
            if i + 9 > n:
                break
            depth, height, width = struct.unpack(">BHH", view[i + 4 : i + 9])
            if height == 0:
                raise ObservationError("the JPEG defers its height (DNL); not supported")
            return ImageHeader("jpeg", width, height, depth)
        if marker == 0xDA or length < 2:  # start of scan before a frame header
            break
        i += 2 + length
    raise ObservationError("the JPEG has no frame header (truncated or corrupt)")


def check_compressed_header(fmt: str, data, max_side_px: int = MAX_IMAGE_SIDE_PX) -> ImageHeader:
    """Read and check a CompressedImage header before it is decoded: PNG/JPEG only, 8 bits
    per channel, no side beyond ``max_side_px``."""
    try:
        header = read_header(data)
    except ObservationError as exc:
        raise ObservationError(
            f"CompressedImage.data ({len(data)} bytes, format {fmt!r}) could not be decoded: "
            f"{exc}; the frame is corrupt or not jpeg/png") from None
    if header.bit_depth > 8:
        raise ObservationError(
            f"CompressedImage is a {header.bit_depth}-bit {header.kind}; the policy takes "
            "8-bit colour: publish 8-bit jpeg/png (16-bit and depth images are refused)")
    check_image_side(header.width, header.height, max_side_px, f"CompressedImage ({header.kind})")
    return header
