"""Torch-exact bilinear resize to uint8 levels and the lookup-table normalise into patch order.

The processor's resize is float32 with fused multiply-adds (see ``_source_positions`` and
``_exact_levels``: torch's channels-last kernel, four weighted taps per value); the vision
tower then sees ``2*u/255 - 1`` of the rounded levels ``u``. Emulating every FMA in float64
costs several full passes per image, so the resize runs as plain float32 separable passes and
only the few values that land within ``_TIE_MARGIN`` of a rounding boundary (x.5) are
recomputed with the exact emulation: both the passes and torch's chain are within a few
float32 ulps (2**-16 each below 256) of the exact value, well inside the 2**-10 margin, so
every other value rounds the same.
Normalising 256 possible levels is one table lookup, written straight into the caller's
float16/float32 buffer in patch order (numpy casts float32 -> float16 element by element).
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import NamedTuple

import numpy as np

#: Distance from x.5 below which a value takes the exact FMA path (8x the float32 error bound).
_TIE_MARGIN = np.float32(2.0**-10)
_workspaces = threading.local()


def scratch(name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A per-thread reusable buffer: fresh multi-MB temporaries cost more in page faults
    than the arithmetic itself, and ROS executors may call in from several threads."""
    bufs = getattr(_workspaces, "bufs", None)
    if bufs is None:
        bufs = _workspaces.bufs = {}
    key = (name, shape, np.dtype(dtype).str)
    buf = bufs.get(key)
    if buf is None:
        if len(bufs) > 64:  # many geometries seen: start over rather than grow without bound
            bufs.clear()
        buf = bufs[key] = np.empty(shape, dtype=dtype)
    return buf


def _source_positions(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Torch's align_corners=False taps and lambda along one axis, bit for bit.

    Torch evaluates ``scale * (dst + 0.5) - 0.5`` in float32 as one fused multiply-add; the
    float64 evaluation below is exact before its single rounding to float32, i.e. an FMA.
    """
    scale = np.float32(in_size) / np.float32(out_size)
    half_dst = np.arange(out_size, dtype=np.float32) + np.float32(0.5)
    src = (np.float64(scale) * half_dst.astype(np.float64) - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.intp), in_size - 1)
    i1 = np.minimum(i0 + 1, in_size - 1)
    lam1 = np.clip(src - i0.astype(np.float32), np.float32(0.0), np.float32(1.0))
    return i0, i1, lam1


class Plan(NamedTuple):
    """Precomputed taps and weights for one (input, output, flip) geometry."""

    rows: np.ndarray  # input rows actually read (sorted)
    r0: np.ndarray  # per output row: index into ``rows`` of the upper tap
    r1: np.ndarray
    y0: np.ndarray  # per output row: input row of the upper tap (exact path)
    y1: np.ndarray
    wy0: np.ndarray  # [out_h, 1] float32
    wy1: np.ndarray  # [out_h, 1] float32
    x0: np.ndarray  # per output column: input column of the left tap (exact path)
    x1: np.ndarray
    c0: np.ndarray  # per output (column, channel): flat index of the left tap in a row
    c1: np.ndarray
    wx0: np.ndarray  # [out_w*3] float32, repeated per channel (long inner loops)
    wx1: np.ndarray


@lru_cache(maxsize=32)
def plan(in_h: int, in_w: int, out_h: int, out_w: int, flip: bool) -> Plan:
    """Build (and cache) the separable tables; ``flip`` mirrors the taps, not the pixels."""
    y0, y1, ly = _source_positions(in_h, out_h)
    x0, x1, lx = _source_positions(in_w, out_w)
    if flip:  # sampling the flipped image at i == sampling the original at n-1-i
        y0, y1 = in_h - 1 - y0, in_h - 1 - y1
        x0, x1 = in_w - 1 - x0, in_w - 1 - x1
    rows, inverse = np.unique(np.concatenate([y0, y1]), return_inverse=True)
    inverse = inverse.reshape(-1)
    chan = np.arange(3)
    result = Plan(
        rows=rows, r0=inverse[:out_h], r1=inverse[out_h:], y0=y0, y1=y1,
        wy0=(np.float32(1.0) - ly).reshape(-1, 1), wy1=ly.reshape(-1, 1),
        x0=x0, x1=x1,
        c0=(x0[:, None] * 3 + chan).reshape(-1), c1=(x1[:, None] * 3 + chan).reshape(-1),
        wx0=np.repeat(np.float32(1.0) - lx, 3), wx1=np.repeat(lx, 3),
    )
    for arr in result:
        arr.setflags(write=False)
    return result


def _fma32(w0: np.ndarray, a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``fma(w0, a, c)``: ``w0*a`` (float32 weight, level <= 255) is exact in float64
    and so is the sum with a float32 ``c`` of this range, so one rounding remains."""
    return (w0.astype(np.float64) * a + c.astype(np.float64)).astype(np.float32)


def _exact_levels(img: np.ndarray, p: Plan, flat_idx: np.ndarray, out_w: int) -> np.ndarray:
    """The torch-exact rounded level of the output values at ``flat_idx`` (y*out_w*3 + x*3 + c).

    The processor resizes a channels-last view, so torch runs its channels-last kernel: four
    float32 tap weights ``h·w`` per value, summed as the compiled chain
    ``fma(t11, w11, fma(t10, w10, fma(t00, w00, t01·w01)))``.
    """
    y, rest = np.divmod(flat_idx, out_w * 3)
    x, c = np.divmod(rest, 3)
    ya, yb, xa, xb = p.y0[y], p.y1[y], p.x0[x], p.x1[x]
    h0, h1 = p.wy0[y, 0], p.wy1[y, 0]
    v0, v1 = p.wx0[rest], p.wx1[rest]
    w00, w01 = np.multiply(h0, v0, dtype=np.float32), np.multiply(h0, v1, dtype=np.float32)
    w10, w11 = np.multiply(h1, v0, dtype=np.float32), np.multiply(h1, v1, dtype=np.float32)
    value = _fma32(w00, img[ya, xa, c], np.multiply(w01, img[ya, xb, c], dtype=np.float32))
    value = _fma32(w10, img[yb, xa, c], value)
    value = _fma32(w11, img[yb, xb, c], value)
    return np.clip(np.rint(value), 0, 255)


def resize_levels(img: np.ndarray, out_h: int, out_w: int, flip: bool) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [out_h, out_w, 3] of torch's rounded levels (0..255).

    The result is a per-thread scratch buffer, valid until this thread's next call.
    """
    in_h, in_w = img.shape[:2]
    p = plan(in_h, in_w, out_h, out_w, flip)
    n_rows, cols = p.rows.size, out_w * 3
    flat = np.ascontiguousarray(img).reshape(in_h, in_w * 3)
    src = flat
    if n_rows < in_h:  # downscaling skips rows: gather the ones read into scratch
        src = scratch("src_rows", (n_rows, in_w * 3), np.uint8)
        np.take(flat, p.rows, axis=0, out=src, mode="clip")
    # Width pass on [rows, out_w*3]: long inner loops, one-byte gathers, then float32.
    gathered = scratch("gathered", (n_rows, cols), np.uint8)
    rows = scratch("rows", (n_rows, cols), np.float32)
    tmp = scratch("tmp", (n_rows, cols), np.float32)
    np.take(src, p.c0, axis=1, out=gathered, mode="clip")  # "clip": take() writes to ``out``
    np.copyto(rows, gathered, casting="unsafe")
    np.take(src, p.c1, axis=1, out=gathered, mode="clip")
    np.copyto(tmp, gathered, casting="unsafe")
    rows *= p.wx0
    tmp *= p.wx1
    rows += tmp
    # Height pass: per-row weights broadcast along the row.
    top = scratch("top", (out_h, cols), np.float32)
    bottom = scratch("bottom", (out_h, cols), np.float32)
    np.take(rows, p.r0, axis=0, out=top, mode="clip")
    np.take(rows, p.r1, axis=0, out=bottom, mode="clip")
    top *= p.wy0
    bottom *= p.wy1
    top += bottom
    levels = scratch("levels", (out_h, cols), np.float32)
    np.rint(top, out=levels)
    # Values within the margin of x.5 may round differently from the FMA: redo them exactly.
    np.subtract(top, levels, out=bottom)
    np.abs(bottom, out=bottom)
    near = scratch("near", (out_h, cols), np.bool_)
    np.greater(bottom, np.float32(0.5) - _TIE_MARGIN, out=near)
    if near.any():
        idx = np.flatnonzero(near)
        levels.reshape(-1)[idx] = _exact_levels(img, p, idx, out_w)
    # No clip: every tap weight is >= 0 and each pair sums to at most 1 + 2**-23, so the
    # float32 value lies in [0, 255 + 2**-14] and rounds into 0..255.
    return levels.reshape(out_h, out_w, 3)


@lru_cache(maxsize=4)
def unit_table(dtype: str) -> np.ndarray:
    """``2*u/255 - 1`` for u = 0..255 as the processor computes it in float32, then cast once."""
    u = np.arange(256, dtype=np.float32)
    x = np.divide(u, np.float32(255.0), dtype=np.float32)
    x *= np.float32(2.0)
    x -= np.float32(1.0)
    table = x.astype(np.dtype(dtype))
    table.setflags(write=False)
    return table


def patch_view(x: np.ndarray, patch: int) -> np.ndarray:
    """[S, S, C] -> [S/p, S/p, p, p, C] view in patch order (row, col, dy, dx, c)."""
    grid = x.shape[0] // patch
    return x.reshape(grid, patch, grid, patch, x.shape[2]).transpose(0, 2, 1, 3, 4)


@lru_cache(maxsize=1)
def _cv2_lut():
    """OpenCV's ``LUT`` (SIMD, one byte per index read) if it is installed, else None."""
    try:
        import cv2
    except ImportError:
        return None
    return cv2.LUT


def normalise_into(levels: np.ndarray, patch: int, dst: np.ndarray) -> None:
    """Levels [S, S, 3] (uint8, or float32 holding integers) -> ``dst`` (contiguous float16 or
    float32 [grid², p²·3]) as unit-range values in patch order: one reorder, one lookup."""
    grid = levels.shape[0] // patch
    flat = dst.reshape(grid * grid, -1)
    index8 = scratch("index8", flat.shape, np.uint8)
    np.copyto(index8.reshape(grid, grid, patch, patch, 3), patch_view(levels, patch),
              casting="unsafe")
    lookup_into(index8, dst)


def lookup_into(index8: np.ndarray, dst: np.ndarray) -> None:
    """uint8 levels [grid², p²·3] in patch order -> unit-range values in ``dst`` (same shape,
    float16 or float32): one table lookup per value.

    The lookup copies table entries bit for bit (float16 as uint16), so OpenCV's and numpy's
    results are the same; OpenCV reads one byte per index where numpy's take reads eight.
    """
    table = unit_table(dst.dtype.str)
    flat = dst.reshape(index8.shape)
    lut = _cv2_lut()
    if lut is not None and flat.shape[1] <= 4096:
        half = dst.dtype == np.float16  # as uint16: OpenCV builds without float16 LUTs
        view = flat.view(np.uint16) if half else flat
        try:
            done = lut(index8, table.view(np.uint16) if half else table, dst=view) is view
        except Exception:  # cv2.error: an OpenCV that cannot do this table type
            done = False
        if done:
            return
    index = scratch("index", (index8.size,), np.intp)  # take() would cast into a fresh one
    np.copyto(index, index8.reshape(-1), casting="unsafe")
    np.take(table, index, out=dst.reshape(-1), mode="clip")
