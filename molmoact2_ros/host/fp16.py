"""float16 sums into the fp16 arena: float32 arithmetic with one rounding, on a SIMD kernel.

numpy converts float16 element by element on x86 (5-10 ns a value: 392 x 2560 image rows
cost more than the whole runtime), so where OpenCV is installed its F16C/NEON ``cv2.add``
does the same float32 add and single rounding; it is used only after a self-check against
numpy on values that exercise ties, subnormals, overflow and NaN, else numpy does it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import jit
from .resample import scratch


def _probe() -> tuple[np.ndarray, np.ndarray]:
    """float16 pairs whose sums hit ties-to-even, subnormals, overflow, infinities and NaN."""
    rng = np.random.default_rng(20260101)
    bits = rng.integers(0, 1 << 16, size=(2, 4096), dtype=np.uint16)
    a, b = bits.view(np.float16)
    tiny = np.float16(2.0**-24)
    edge_a = np.array([1, 2048, 65504, 65504, -65504, tiny, -tiny, 0, np.inf, np.nan, 1, 3],
                      np.float16)
    edge_b = np.array([2.0**-11, 1, 16, 32, -32, tiny, tiny, -0.0, -np.inf, 1, 2.0**-12, 0.5],
                      np.float16)
    return np.concatenate([a, edge_a]), np.concatenate([b, edge_b])


#: Rows per block of the numpy path: float32 temporaries stay small (and in cache).
_BLOCK_ROWS = 16


def add_reference(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = float16(float32(a) + float32(b))`` with numpy: the definition (no fp16 math)."""
    a2, b2, out2 = (np.asarray(x).reshape(-1, out.shape[-1]) for x in (a, b, out))
    for start in range(0, out2.shape[0], _BLOCK_ROWS):
        rows = slice(start, start + _BLOCK_ROWS)
        n = min(_BLOCK_ROWS, out2.shape[0] - start)
        total = scratch("fp16_sum", (_BLOCK_ROWS, out2.shape[1]), np.float32)[:n]
        np.add(a2[rows], b2[rows], out=total, dtype=np.float32)
        np.copyto(out2[rows], total, casting="same_kind")


@lru_cache(maxsize=1)
def _cv2_add():
    """OpenCV's ``add`` if it is installed and gives numpy's bits on the probe, else None."""
    try:
        import cv2
    except ImportError:
        return None
    a, b = _probe()
    want = np.empty_like(a)
    got = np.empty_like(a)
    with np.errstate(all="ignore"):
        add_reference(a, b, want)
        try:
            result = cv2.add(a.reshape(1, -1), b.reshape(1, -1), dst=got.reshape(1, -1))
        except Exception:  # an OpenCV without float16 arithmetic
            return None
    same = np.array_equal(want.view(np.uint16), got.view(np.uint16))
    if not same or result is None or result.dtype != np.float16:
        return None
    return cv2.add


CHOICE = jit.Choice("fp16", "opencv", "numpy", _cv2_add, "OpenCV missing or inexact")
kernel, force, using = CHOICE.kernel, CHOICE.force, CHOICE.using


def add_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = float16(float32(a) + float32(b))`` for float16 2-D ``a``, ``b`` and ``out``."""
    add = _cv2_add() if kernel() == "opencv" else None
    if add is not None and out.flags.c_contiguous and a.shape == b.shape == out.shape:
        if add(a, b, dst=out) is out:
            return
    add_reference(a, b, out)
