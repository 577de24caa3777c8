"""Progress for long CLI work: a tqdm bar on a terminal, one status line per step otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

T = TypeVar("T")


def _tqdm():
    try:
        from tqdm import tqdm
    except ImportError:  # a colcon install without pip: plain status lines are enough
        return None
    return tqdm


def progress(items: Iterable[T], desc: str, *, total: int | None = None,
             label: Callable[[T], str] = str, stream: TextIO | None = None) -> Iterator[T]:
    """Yield ``items``, showing which one runs: a bar on a TTY, else ``desc [i/n] label`` lines.

    Output goes to stderr, so stdout keeps only results (tables, summaries) for scripts.
    """
    stream = stream or sys.stderr
    items = list(items) if total is None else items
    total = len(items) if total is None else total
    tqdm = _tqdm() if stream.isatty() else None
    if tqdm is not None:
        with tqdm(items, desc=desc, total=total, file=stream, leave=False,
                  dynamic_ncols=True) as bar:
            for item in bar:
                bar.set_postfix_str(label(item), refresh=True)
                yield item
        return
    start = time.perf_counter()
    for i, item in enumerate(items, 1):
        print(f"{desc} [{i}/{total}] {label(item)} ({time.perf_counter() - start:.1f} s)",
              file=stream, flush=True)
        yield item


class _Quiet:
    """The bar's interface, doing nothing (progress turned off, or tqdm missing on a terminal)."""

    def set_description(self, text: str) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class _Lines:
    """The bar's interface for logs and pipes: one status line per step on the stream.

    A step starts at ``set_description`` (``desc [i/n] text (elapsed)``); with ``every`` > 0,
    ``update`` also prints a line each time the count crosses a multiple of ``every`` and at
    the end (``desc [count/n unit] (elapsed)``), so a long run shows about ``n / every`` lines.
    """

    def __init__(self, total: int, desc: str, unit: str, every: int, stream: TextIO) -> None:
        self.total, self.desc, self.unit, self.every, self.stream = total, desc, unit, every, stream
        self.n = 0
        self.start = time.perf_counter()

    def _line(self, text: str) -> None:
        print(f"{self.desc} {text} ({time.perf_counter() - self.start:.1f} s)", file=self.stream,
              flush=True)

    def set_description(self, text: str) -> None:
        self._line(f"[{min(self.n + 1, self.total)}/{self.total}] {text}")

    def update(self, n: int = 1) -> None:
        before, self.n = self.n, self.n + n
        if self.every > 0 and (self.n // self.every > before // self.every
                               or (self.n >= self.total > before)):
            self._line(f"[{self.n}/{self.total} {self.unit}]")

    def close(self) -> None:
        pass


def counter(total: int, desc: str, *, unit: str = "it", enabled: bool = True,
            every: int = 0, stream: TextIO | None = None):
    """A bar updated by hand (``update``, ``set_description``, ``close``): tqdm on a terminal,
    else one status line per step (see ``_Lines``; ``every`` units make a step of ``update``),
    so a log or a pipe still shows that the run moves. ``enabled=False`` prints nothing."""
    stream = stream or sys.stderr
    if not enabled:
        return _Quiet()
    if not stream.isatty():
        return _Lines(total, desc, unit, every, stream)
    tqdm = _tqdm()
    if tqdm is None:
        return _Lines(total, desc, unit, every, stream)
    return tqdm(total=total, desc=desc, unit=unit, file=stream, leave=False)
