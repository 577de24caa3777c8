"""The torch-exact resize to patch-ordered levels as one compiled kernel (numba), if installed.

The numpy path (``resample.resize_levels`` + ``normalise_into``) makes about fifteen passes
over every output value (gathers, casts, two multiplies, the tie check, the reorder); on a
2-core host that is most of the preprocessing time. This kernel computes every value with the
exact emulation of torch's channels-last kernel (four weighted taps, so no tie re-check), one
output row at a time, rounds it to uint8 levels and stores them in patch order. The shared
table lookup (``resample.lookup_into``) then writes the unit-range values into the arena, as
on the numpy path.

Compiled through ``host/jit.py`` (why numba, the self-check, the switch): without numba, or if
the kernel fails its bit-exact self-check against the numpy path at first use, the numpy path
runs and nothing else changes.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from . import jit
from .jit import CheckedKernel, Mismatch

_lock = threading.Lock()


def resize_levels_patched(src, y0, y1, wy0, wy1, c0, c1, wx0, wx1, patch, index8, levels):
    """The kernel numba compiles (plain Python it is the same maths, slowly): one frame's
    [H, W*3] bytes -> uint8 levels [grid², p²·3] in patch order."""
    # torch's channels-last kernel per output value: float32 tap weights h·w, then
    # fma(t11, w11, fma(t10, w10, fma(t00, w00, t01·w01))) rounded half-even to a level;
    # ``src`` is the frame as [H, W*3] bytes, c0/c1 the flat tap of each (column, channel)
    cols = c0.size
    run = patch * 3
    grid = y0.size // patch
    for oy in range(y0.size):
        top = src[y0[oy]]
        bottom = src[y1[oy]]
        h0 = wy0[oy]
        h1 = wy1[oy]
        for j in range(cols):
            v0 = wx0[j]
            v1 = wx1[j]
            w00 = np.float32(h0 * v0)
            w01 = np.float32(h0 * v1)
            w10 = np.float32(h1 * v0)
            w11 = np.float32(h1 * v1)
            value = np.float32(np.float64(w00) * np.float64(top[c0[j]])
                               + np.float64(np.float32(w01 * np.float32(top[c1[j]]))))
            value = np.float32(np.float64(w10) * np.float64(bottom[c0[j]]) + np.float64(value))
            value = np.float32(np.float64(w11) * np.float64(bottom[c1[j]]) + np.float64(value))
            level = np.rint(value)
            levels[j] = np.uint8(min(max(level, np.float32(0.0)), np.float32(255.0)))
        first = (oy // patch) * grid
        offset = (oy % patch) * run
        for pc in range(grid):
            index8[first + pc, offset:offset + run] = levels[pc * run:(pc + 1) * run]


def _compile(numba, cache: bool):
    return numba.njit(nogil=True, cache=cache, error_model="numpy")(resize_levels_patched)


def _compiled():
    """The compiled kernel, or None (``KERNEL.why_not`` says why)."""
    return KERNEL.get()


def describe() -> str:
    """One line for doctor and reports: which preprocessing kernel runs here, and why."""
    return jit.describe(kernel(), KERNEL, pinned=CHOICE.forced == "numpy")


def _self_check(fn) -> None:
    """Compare with the numpy path on ties (lambda 0.5 ramps), a gradient and random pixels,
    upscaled and downscaled, flipped and not, into float16 and float32."""
    from .resample import normalise_into, resize_levels

    rng = np.random.default_rng(20261201)
    ramp = (np.arange(56)[:, None, None] + np.arange(28)[None, :, None]
            + np.zeros(3, int)).astype(np.uint8)
    cases = [(ramp, 84), (rng.integers(0, 256, (30, 45, 3), dtype=np.uint8), 28),
             (rng.integers(0, 256, (9, 7, 3), dtype=np.uint8), 42)]
    for img, size in cases:
        for flip in (False, True):
            for dtype in (np.float16, np.float32):
                grid = size // 14
                want = np.empty((grid * grid, 14 * 14 * 3), dtype)
                got = np.full_like(want, np.nan)
                normalise_into(resize_levels(img, size, size, flip), 14, want)
                run(fn, img, size, 14, flip, got)
                if not np.array_equal(want.view(np.uint8), got.view(np.uint8)):
                    bad = int(np.count_nonzero(want != got))
                    raise Mismatch(f"{bad} of {want.size} values for a {img.shape[:2]} frame "
                                    f"to {size}x{size}, flip={flip}, {np.dtype(dtype).name}")


KERNEL = CheckedKernel("preprocessing", _compile, _self_check)


def run(fn, img: np.ndarray, size: int, patch: int, flip: bool, dst: np.ndarray) -> None:
    """Apply the kernel ``fn`` for one camera: ``img`` uint8 [H, W, 3] -> ``dst`` [grid², p²·3]
    (levels in patch order from the kernel, then the shared table lookup)."""
    from .resample import lookup_into, plan, scratch

    p = plan(img.shape[0], img.shape[1], size, size, flip)
    k = _tables(p)
    index8 = scratch("index8", dst.shape, np.uint8)
    fn(img.reshape(img.shape[0], -1), k.y0, k.y1, k.wy0, k.wy1, k.c0, k.c1, p.wx0, p.wx1,
       patch, index8, scratch("jit_levels", (size * 3,), np.uint8))
    lookup_into(index8, dst)


class _KernelTables(NamedTuple):
    """A plan's tables in the kernel's types: unsigned indices (no negative-index wrap code,
    half the bytes) and the row weights as flat float32."""

    y0: np.ndarray
    y1: np.ndarray
    c0: np.ndarray
    c1: np.ndarray
    wy0: np.ndarray
    wy1: np.ndarray


_table_cache: dict[int, tuple[object, _KernelTables]] = {}


def _tables(p) -> _KernelTables:
    """Convert (once per plan; plans are cached and immutable) the plan's tables."""
    hit = _table_cache.get(id(p))
    if hit is not None and hit[0] is p:
        return hit[1]
    u32 = np.uint32
    k = _KernelTables(p.y0.astype(u32), p.y1.astype(u32), p.c0.astype(u32), p.c1.astype(u32),
                      np.ascontiguousarray(p.wy0.reshape(-1)),
                      np.ascontiguousarray(p.wy1.reshape(-1)))
    with _lock:
        if len(_table_cache) > 32:
            _table_cache.clear()
        _table_cache[id(p)] = (p, k)
    return k


CHOICE = jit.Choice("preprocessing", [("numba", _compiled)], "numpy",
                    "pip install -e '.[fast]' (numba), or see the log for why")
kernel, force, using = CHOICE.kernel, CHOICE.force, CHOICE.using


def resize_normalise_into(img: np.ndarray, size: int, patch: int, flip: bool,
                          dst: np.ndarray) -> bool:
    """Run the compiled kernel into ``dst`` if this process uses it; False if it does not."""
    if kernel() != "numba":
        return False
    fn = _compiled()
    if fn is None:
        return False
    run(fn, np.ascontiguousarray(img), size, patch, flip, dst)
    return True
