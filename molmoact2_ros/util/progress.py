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
    """The bar's interface, doing nothing (not a terminal, tqdm missing, or turned off)."""

    def set_description(self, text: str) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def counter(total: int, desc: str, *, unit: str = "it", enabled: bool = True,
            stream: TextIO | None = None):
    """A bar updated by hand (``update``, ``set_description``, ``close``): tqdm on a terminal,
    else silent, so logs and pipes get only the results."""
    stream = stream or sys.stderr
    tqdm = _tqdm() if enabled and stream.isatty() else None
    if tqdm is None:
        return _Quiet()
    return tqdm(total=total, desc=desc, unit=unit, file=stream, leave=False)
