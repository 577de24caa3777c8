"""Hand-made PNG/JPEG headers (no encoder needed) for header-check tests."""

from __future__ import annotations

import struct
import zlib


def png_header(width: int, height: int, depth: int = 8, colour: int = 2) -> bytes:
    """PNG signature + IHDR chunk (with its CRC): what a decoder reads the size from."""
    body = b"IHDR" + struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + body
            + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF))


def jpeg_header(width: int, height: int, precision: int = 8, sof: int = 0xC0) -> bytes:
    """SOI, an APP0 segment, then a start-of-frame segment with three components."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    components = b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    frame = struct.pack(">BHHB", precision, height, width, 3) + components
    return b"\xff\xd8" + app0 + bytes([0xFF, sof]) + struct.pack(">H", 2 + len(frame)) + frame
