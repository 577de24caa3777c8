"""The torch-exact resize to patch-ordered levels as one compiled kernel (numba), if installed.

The numpy path (``resample.resize_levels`` + ``normalise_into``) makes about fifteen passes
over every output value (gathers, casts, two multiplies, the tie check, the reorder); on a
2-core host that is most of the preprocessing time. This kernel computes every value with the
reference's exact FMA emulation (so no tie re-check), reading each input row once: the width
pass fills a per-thread float32 row buffer, the height pass rounds each output row to uint8
levels and stores them in patch order. The shared table lookup (``resample.lookup_into``)
then writes the unit-range values into the arena, as on the numpy path.

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


def resize_levels_patched(src, rows, r0, r1, wy0, wy1, c0, c1, wx0, wx1, patch, index8, hbuf,
                          line32, levels):
    """The kernel numba compiles (plain Python it is the same maths, slowly): one frame's
    [H, W*3] bytes -> uint8 levels [grid², p²·3] in patch order."""
    # width pass: every input row read once -> float32 [n_rows, out_w*3]; ``src`` is the
    # frame as [H, W*3] bytes, c0/c1 the flat tap of each (column, channel). The row is
    # widened to float32 first so the taps are plain float loads.
    cols = c0.size
    for i in range(rows.size):
        line = src[rows[i]]
        for j in range(line.size):
            line32[j] = np.float32(line[j])
        out = hbuf[i]
        for j in range(cols):
            near = np.float32(wx1[j] * line32[c1[j]])
            out[j] = np.float32(wx0[j] * np.float64(line32[c0[j]]) + near)
    # height pass: fma(wy0, top, wy1*bottom) rounded half-even to a level, one output row
    # at a time (vectorised), then its runs of ``patch*3`` values into patch order
    run = patch * 3
    grid = r0.size // patch
    for oy in range(r0.size):
        top = hbuf[r0[oy]]
        bottom = hbuf[r1[oy]]
        w0 = wy0[oy]
        w1 = wy1[oy]
        for j in range(cols):
            near = np.float32(w1 * bottom[j])
            level = np.rint(np.float32(w0 * np.float64(top[j]) + near))
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
    cols = size * 3
    index8 = scratch("index8", dst.shape, np.uint8)
    fn(img.reshape(img.shape[0], -1), k.rows, k.r0, k.r1, k.wy0, p.wy1.reshape(-1), k.c0, k.c1,
       k.wx0, p.wx1, patch, index8, scratch("jit_rows", (p.rows.size, cols), np.float32),
       scratch("jit_line", (img.shape[1] * 3,), np.float32),
       scratch("jit_levels", (cols,), np.uint8))
    lookup_into(index8, dst)


class _KernelTables(NamedTuple):
    """A plan's tables in the kernel's types: unsigned indices (no negative-index wrap code,
    half the bytes) and the FMA's exact factors as float64 (exact copies of the float32s)."""

    rows: np.ndarray
    r0: np.ndarray
    r1: np.ndarray
    c0: np.ndarray
    c1: np.ndarray
    wy0: np.ndarray
    wx0: np.ndarray


_table_cache: dict[int, tuple[object, _KernelTables]] = {}


def _tables(p) -> _KernelTables:
    """Convert (once per plan; plans are cached and immutable) the plan's tables."""
    hit = _table_cache.get(id(p))
    if hit is not None and hit[0] is p:
        return hit[1]
    u32 = np.uint32
    k = _KernelTables(p.rows.astype(u32), p.r0.astype(u32), p.r1.astype(u32),
                      p.c0.astype(u32), p.c1.astype(u32),
                      p.wy0.reshape(-1).astype(np.float64), p.wx0.astype(np.float64))
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
