"""numba for the host kernels: imported lazily, compiled once per process, used only after a
bit-exact self-check against the numpy definition, and switched off as a whole by one variable.

numba is optional (the ``fast`` extra): wheels for x86_64 and aarch64 on Python 3.10-3.13,
numpy 1.22-2.5 across its releases, no C toolchain at install. Its LLVM adds about 100 MiB to
a process's RSS (most of it shared library pages), so ``MOLMOACT2_NUMBA=0`` keeps it out of a
process entirely; every kernel then runs its numpy (or OpenCV) path.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

#: Set to 0 (or off/false/no) to never import numba in this process.
ENV = "MOLMOACT2_NUMBA"
ON_WORDS = ("1", "on", "true", "yes")
OFF_WORDS = ("0", "off", "false", "no")
_UNSET = object()


class Mismatch(RuntimeError):
    """A compiled kernel's results are not the numpy definition's, bit for bit."""


def switched_off() -> bool:
    """``MOLMOACT2_NUMBA`` read strictly: unset or an on word means on, an off word off,
    anything else is refused (a typo must not silently mean on)."""
    from ..errors import MolmoActError

    raw = os.environ.get(ENV, "")
    text = raw.strip().lower()
    if text in ("", *ON_WORDS):
        return False
    if text in OFF_WORDS:
        return True
    raise MolmoActError(f"{ENV}={raw!r}: use one of {', '.join(ON_WORDS)} (numba on) or "
                        f"{', '.join(OFF_WORDS)} (off)")


class CheckedKernel:
    """One numba kernel: ``build(numba, cache)`` returns the compiled function, ``check(fn)``
    raises ``Mismatch`` if it differs from the definition. ``get()`` returns it, or None (and
    ``why_not`` says why) when numba is missing or switched off, compilation fails or the
    check fails. Built once per process, under a lock (camera threads may ask together)."""

    def __init__(self, what: str, build: Callable, check: Callable) -> None:
        self.what = what
        self._build_fn = build
        self._check = check
        self._fn: object = _UNSET
        self._lock = threading.Lock()
        self.why_not = ""

    def get(self):
        if self._fn is _UNSET:
            with self._lock:
                if self._fn is _UNSET:
                    self._fn = self._build()
        return self._fn

    def reset(self) -> None:
        """Forget the compiled kernel (tests: build it again under other conditions)."""
        with self._lock:
            self._fn = _UNSET
            self.why_not = ""

    def _build(self):
        from ..errors import MolmoActError

        try:
            off = switched_off()
        except MolmoActError as exc:  # refused where it is read first (CLI, configure)
            self.why_not = str(exc)
            return None
        if off:
            self.why_not = f"{ENV}={os.environ.get(ENV)}"
            return None
        try:
            import numba
        except ImportError:
            self.why_not = "numba not installed"
            return None
        try:
            try:
                fn = self._build_fn(numba, True)
                self._check(fn)
            except Mismatch:
                raise
            except RuntimeError as exc:  # "cannot cache function": no writable cache folder
                log.debug("numba cache unavailable (%s); compiling without it", exc)
                fn = self._build_fn(numba, False)
                self._check(fn)
        except Mismatch as exc:
            self.why_not = f"compiled kernel refused: it differs from the numpy path ({exc})"
            log.warning("compiled %s kernel differs from the numpy path (%s); using numpy",
                        self.what, exc)
            return None
        except Exception as exc:  # numba/LLVM failures differ by version: fall back, say why
            self.why_not = f"numba could not compile the kernel ({type(exc).__name__}: {exc})"
            log.warning("numba could not compile the %s kernel (%s: %s); using numpy",
                        self.what, type(exc).__name__, exc)
            return None
        return fn


def describe(name: str, kernel: CheckedKernel, pinned: bool = False) -> str:
    """One line for doctor and reports: the implementation in use and, if not numba, why."""
    if name == "numba":
        import numba

        return f"numba {numba.__version__} kernel (self-checked against the numpy path)"
    reason = "pinned" if pinned else (kernel.why_not or "not built yet")
    hint = "" if reason.startswith(ENV) or pinned else \
        "; pip install -e '.[fast]' (numba) for the compiled kernel"
    return f"{name} path ({reason}{hint})"


class Choice:
    """Which implementation a host kernel uses in this process: the first of ``fast`` (name,
    ``available()``) pairs whose ``available()`` returns a kernel (not None), else
    ``fallback``; ``force``/``using`` pin one, e.g. for tests and the bench's side-by-side
    rows."""

    def __init__(self, what: str, fast: list[tuple[str, Callable[[], object]]], fallback: str,
                 unavailable: str) -> None:
        self.what, self.fallback = what, fallback
        self._fast = dict(fast)
        self._unavailable = unavailable
        self._forced: str | None = None
        self._lock = threading.Lock()

    @property
    def forced(self) -> str | None:
        return self._forced

    def available(self, name: str) -> bool:
        return name == self.fallback or (name in self._fast and self._fast[name]() is not None)

    def kernel(self) -> str:
        """The implementation in use: the pinned one, else the first fast one available."""
        if self._forced is not None:
            return self._forced
        return next((n for n, get in self._fast.items() if get() is not None), self.fallback)

    def force(self, name: str | None) -> None:
        """Pin ``name`` (a fast one or the fallback), or None for the automatic choice."""
        names = [self.fallback, *self._fast]
        if name is not None and name not in names:
            raise ValueError(f"unknown {self.what} kernel {name!r}; use one of "
                             f"{', '.join(map(repr, names))} or None")
        if name is not None and not self.available(name):
            raise ValueError(f"the {name} {self.what} kernel is not available "
                             f"({self._unavailable})")
        with self._lock:
            self._forced = name

    @contextmanager
    def using(self, name: str | None) -> Iterator[None]:
        """``force(name)`` for the duration of a ``with`` block, then back to what it was."""
        before = self._forced
        self.force(name)
        try:
            yield
        finally:
            with self._lock:
                self._forced = before
