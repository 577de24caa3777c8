"""The torch-exact resize to patch-ordered levels as one compiled kernel (numba), if installed.

The numpy path (``resample.resize_levels`` + ``normalise_into``) makes about fifteen passes
over every output value (gathers, casts, two multiplies, the tie check, the reorder); on a
2-core host that is most of the preprocessing time. This kernel computes every value with the
reference's exact FMA emulation (so no tie re-check), reading each input row once: the width
pass fills a per-thread float32 row buffer, the height pass rounds each output row to uint8
levels and stores them in patch order. The shared table lookup (``resample.lookup_into``)
then writes the unit-range values into the arena, as on the numpy path.

numba is chosen because it is the field's compiled-kernel tool for numpy code: wheels for
x86_64 and aarch64 on Python 3.10-3.13, numpy 1.22-2.5, and no C toolchain at install. It
is optional (the ``fast`` extra): without it, or if the compiled kernel fails its bit-exact
self-check against the numpy path at first use, the numpy path runs and nothing else changes.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

log = logging.getLogger(__name__)
_lock = threading.Lock()
_forced: str | None = None


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


def _compile(cache: bool):
    import numba

    return numba.njit(nogil=True, cache=cache, error_model="numpy")(resize_levels_patched)


_UNSET = object()
_compiled_fn: object = _UNSET
_why_not = ""
_compile_lock = threading.Lock()


def _compiled():
    """The compiled kernel if numba is installed and the kernel passes its self-check; built
    once per process (under a lock: both camera threads may ask at the first frame)."""
    global _compiled_fn
    if _compiled_fn is _UNSET:
        with _compile_lock:
            if _compiled_fn is _UNSET:
                _compiled_fn = _build()
    return _compiled_fn


def _reset() -> None:
    """Forget the compiled kernel (tests: build it again under other conditions)."""
    global _compiled_fn
    with _compile_lock:
        _compiled_fn = _UNSET


#: Environment variable pinning the implementation for a process: "numpy" never imports numba
#: (its LLVM adds about 120 MiB to the process's RSS, mostly shared library pages), "numba"
#: or unset/"auto" use the compiled kernel when it is installed and passes its self-check.
ENV = "MOLMOACT2_PREPROCESS_KERNEL"


def _build():
    global _why_not
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "numba", "numpy"):
        log.warning("%s=%r is not one of auto, numba, numpy; using auto", ENV, choice)
    if choice == "numpy":
        _why_not = f"{ENV}=numpy"
        return None
    try:
        import numba  # noqa: F401
    except ImportError:
        _why_not = "numba not installed"
        return None
    try:
        try:
            fn = _compile(cache=True)
            _self_check(fn)
        except RuntimeError as exc:  # "cannot cache function": no writable cache folder
            if isinstance(exc, _Mismatch):
                raise
            log.debug("numba cache unavailable (%s); compiling without it", exc)
            fn = _compile(cache=False)
            _self_check(fn)
    except _Mismatch as exc:
        _why_not = f"compiled kernel refused: it differs from the numpy path ({exc})"
        log.warning("compiled preprocessing kernel differs from the numpy path (%s); "
                    "using numpy", exc)
        return None
    except Exception as exc:  # numba/LLVM failures differ by version: fall back, say why
        _why_not = f"numba could not compile the kernel ({type(exc).__name__}: {exc})"
        log.warning("numba could not compile the preprocessing kernel (%s: %s); using numpy",
                    type(exc).__name__, exc)
        return None
    return fn


def describe() -> str:
    """One line for doctor and reports: which preprocessing kernel runs here, and why."""
    name = kernel()
    if name == "numba":
        import numba

        return f"numba {numba.__version__} kernel (self-checked against the numpy path)"
    reason = "pinned" if _forced == "numpy" else _why_not
    if reason.startswith(ENV):
        return f"numpy path ({reason})"
    return f"numpy path ({reason}; pip install 'molmoact2_ros[fast]' for the compiled kernel)"


class _Mismatch(RuntimeError):
    """The compiled kernel's values are not the numpy path's, bit for bit."""


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
                    raise _Mismatch(f"{bad} of {want.size} values for a {img.shape[:2]} frame "
                                    f"to {size}x{size}, flip={flip}, {np.dtype(dtype).name}")


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


def kernel() -> str:
    """Which implementation preprocessing uses in this process: "numba" or "numpy"."""
    if _forced is not None:
        return _forced
    return "numba" if _compiled() is not None else "numpy"


def force(name: str | None) -> None:
    """Pin the implementation ("numpy", "numba" or None for automatic), e.g. to compare them."""
    global _forced
    if name not in (None, "numpy", "numba"):
        raise ValueError(f"unknown preprocessing kernel {name!r}; use 'numpy', 'numba' or None")
    if name == "numba" and _compiled() is None:
        raise ValueError("the numba preprocessing kernel is not available "
                         "(pip install 'molmoact2_ros[fast]', or see the log for why)")
    with _lock:
        _forced = name


@contextmanager
def using(name: str | None):
    """``force(name)`` for the duration of a ``with`` block, then back to what it was."""
    before = _forced
    force(name)
    try:
        yield
    finally:
        with _lock:
            globals()["_forced"] = before


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
