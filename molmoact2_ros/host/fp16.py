"""float16 sums into the fp16 arena: float32 arithmetic with one rounding, on a SIMD kernel.

numpy converts float16 element by element on x86 (5-10 ns a value: 392 x 2560 image rows
cost more than the whole runtime), so the same float32 add and single rounding runs on OpenCV's
F16C/NEON ``cv2.add`` where OpenCV has float16 arithmetic (OpenCV 5, which needs numpy 2), else
on a numba kernel (``host/jit.py``; for numpy 1.x installs such as ROS 2 from apt), else on
numpy. Each is used only after a bit-exact self-check against numpy on values that exercise
ties, subnormals, overflow and NaN (numba's also on every float16 value).
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


def half_add(a, b, out, fa, fb, fs, fg, ua, ub, us, ug):
    """The numba kernel (plain Python it is the same maths, slowly): ``out = half(float(a) +
    float(b))`` on flat uint16 bit patterns, in blocks of ``fa.size`` through float32 scratch
    rows ``fa``..``fg`` and their uint32 views ``ua``..``ug``. Both conversions are numpy's
    (round half to even, NaN keeping its top payload bits), written without branches so the
    loops vectorise; numba has no float16 type."""
    n, block = out.size, fa.size
    for s in range(0, n, block):
        m = min(block, n - s)
        ab, bb, ob = a[s:s + m], b[s:s + m], out[s:s + m]
        for j in range(m):  # half -> float bits: normal numbers, inf and NaN by shifting
            h, h2 = np.int64(ab[j]), np.int64(bb[j])
            em, em2 = h & 0x7FFF, h2 & 0x7FFF
            bits = (em << 13) + (112 << 23) + ((112 << 23) if em >= 0x7C00 else 0)
            bits2 = (em2 << 13) + (112 << 23) + ((112 << 23) if em2 >= 0x7C00 else 0)
            ua[j] = np.uint32(((h & 0x8000) << 16) | (bits if em >= 0x400 else 0))
            ub[j] = np.uint32(((h2 & 0x8000) << 16) | (bits2 if em2 >= 0x400 else 0))
        for j in range(m):  # subnormal halves are em * 2**-24, exactly
            fs[j] = np.float32(np.int64(ab[j]) & 0x7FFF) * np.float32(2.0**-24)
            fg[j] = np.float32(np.int64(bb[j]) & 0x7FFF) * np.float32(2.0**-24)
        for j in range(m):
            ua[j] = ua[j] | (us[j] if (np.int64(ab[j]) & 0x7FFF) < 0x400 else np.uint32(0))
            ub[j] = ub[j] | (ug[j] if (np.int64(bb[j]) & 0x7FFF) < 0x400 else np.uint32(0))
        for j in range(m):  # the float32 sum; |sum| + 0.5 rounds a subnormal result's bits
            fs[j] = fa[j] + fb[j]
            fg[j] = np.abs(fs[j]) + np.float32(0.5)
        for j in range(m):  # float -> half bits, round half to even
            f = np.int64(us[j])
            sign, mag = (f >> 16) & 0x8000, f & 0x7FFFFFFF
            normal = (mag - (112 << 23) + 0xFFF + ((mag >> 13) & 1)) >> 13
            subnormal = np.int64(ug[j]) - 0x3F000000
            nan = 0x7C00 + ((mag & 0x7FFFFF) >> 13)
            nan = nan + 1 if nan == 0x7C00 else nan
            h = nan if mag > 0x7F800000 else (0x7C00 if mag >= 0x47800000 else (
                subnormal if mag < (113 << 23) else normal))
            ob[j] = np.uint16(h | sign)


#: Elements per block of the numba kernel: its four float32 scratch rows stay in L1/L2.
_JIT_BLOCK = 4096


def _run_numba(fn, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    work = scratch("fp16_jit", (4, _JIT_BLOCK), np.float32)
    bits = work.view(np.uint32)
    fn(a.reshape(-1).view(np.uint16), b.reshape(-1).view(np.uint16),
       out.reshape(-1).view(np.uint16), *work, *bits)


def _numba_check(fn) -> None:
    """Bit for bit against numpy on the probe (ties, subnormals, overflow, inf, NaN) and on
    every float16 value plus 0, 1 and the values in reverse."""
    a, b = _probe()
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    cases = [(a, b), (every, np.zeros_like(every)), (every, np.ones_like(every)),
             (every, every[::-1].copy())]
    for x, y in cases:
        want, got = np.empty_like(x), np.empty_like(x)
        with np.errstate(all="ignore"):
            add_reference(x.reshape(1, -1), y.reshape(1, -1), want.reshape(1, -1))
        _run_numba(fn, x, y, got)
        # which payload NaN + NaN keeps is the arithmetic unit's choice, not the kernel's
        free = np.isnan(x) & np.isnan(y)
        differ = (want.view(np.uint16) != got.view(np.uint16)) & ~free
        if differ.any() or not np.isnan(got[free]).all():
            raise jit.Mismatch(f"{int(np.count_nonzero(differ))} of {x.size} float16 sums")


NUMBA_ADD = jit.CheckedKernel(
    "fp16",
    lambda numba, cache: numba.njit(nogil=True, cache=cache, error_model="numpy")(half_add),
    _numba_check)

#: OpenCV's SIMD add first (F16C/NEON; OpenCV 5, which needs numpy 2), then numba's.
CHOICE = jit.Choice("fp16", [("opencv", _cv2_add), ("numba", NUMBA_ADD.get)], "numpy",
                    "OpenCV without float16 arithmetic, numba missing or switched off, or "
                    "inexact: see the log")
kernel, force, using = CHOICE.kernel, CHOICE.force, CHOICE.using


def add_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = float16(float32(a) + float32(b))`` for float16 2-D ``a``, ``b`` and ``out``."""
    name = kernel()
    same_layout = (a.shape == b.shape == out.shape and out.flags.c_contiguous
                   and a.flags.c_contiguous and b.flags.c_contiguous)
    if name == "opencv" and out.flags.c_contiguous and a.shape == b.shape == out.shape:
        add = _cv2_add()
        if add is not None and add(a, b, dst=out) is out:
            return
    elif name == "numba" and same_layout:
        fn = NUMBA_ADD.get()
        if fn is not None:
            _run_numba(fn, a, b, out)
            return
    add_reference(a, b, out)
