"""Shared-memory tensor arena: one anonymous mapping per loaded variant, named regions as views.

The orchestrator creates the arena once and hands its file descriptor to every worker over
the worker's control socket (SCM_RIGHTS). The mapping has no name anywhere: it is a
``memfd`` (mode 0600), or, where ``memfd_create`` is missing, a ``/dev/shm`` file created
``O_EXCL`` with mode 0600 and unlinked before anyone else can open it. So no exit path —
close, crash, SIGKILL of the orchestrator — can leave a segment behind, and
``multiprocessing.resource_tracker`` (which unlinks and warns about ``SharedMemory`` attached
in children before Python 3.13) is never involved. The memory is freed when the last process
unmaps it.
"""

from __future__ import annotations

import mmap
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import RuntimeBackendError

#: Region offsets are aligned to this many bytes (cache line; HTP DMA likes 64 too).
ALIGN = 64


@dataclass(frozen=True)
class Region:
    """One tensor in the arena: byte offset, shape and numpy dtype name."""

    name: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ArenaLayout:
    """Where every region lives; plain data, sent to the workers."""

    regions: tuple[Region, ...]
    size: int

    @classmethod
    def plan(cls, tensors: Iterable[tuple[str, tuple[int, ...], str]]) -> ArenaLayout:
        """Lay the ``(name, shape, dtype)`` tensors out back to back, ``ALIGN``-aligned."""
        regions, offset, seen = [], 0, set()
        for name, shape, dtype in tensors:
            if name in seen:
                raise RuntimeBackendError(f"arena region {name!r} is declared twice")
            seen.add(name)
            region = Region(name, offset, tuple(int(d) for d in shape), str(np.dtype(dtype)))
            regions.append(region)
            offset += -(-region.nbytes // ALIGN) * ALIGN
        return cls(tuple(regions), max(offset, mmap.PAGESIZE))

    def region(self, name: str) -> Region:
        for region in self.regions:
            if region.name == name:
                return region
        raise RuntimeBackendError(
            f"the arena has no region {name!r} (it has: {', '.join(self.names)})"
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)


def _anonymous_fd(size: int) -> int:
    """A private, nameless, ``size``-byte shared-memory file descriptor (mode 0600)."""
    try:
        fd = os.memfd_create("molmoact2-arena", os.MFD_CLOEXEC)
        os.fchmod(fd, 0o600)
    except (AttributeError, OSError):
        import tempfile

        # O_EXCL | O_NOFOLLOW, mode 0600, unlinked at once: no name survives this function.
        shm = "/dev/shm"  # noqa: S108
        folder = shm if os.path.isdir(shm) else tempfile.gettempdir()
        path = os.path.join(folder, f"molmoact2-{os.getpid()}-{secrets.token_hex(8)}")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)
        os.unlink(path)  # nameless from here on: nothing to clean up on any exit path
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def _map(fd: int, size: int) -> mmap.mmap:
    """Map ``fd`` shared; on Python >= 3.13 without the private dup of the fd mmap keeps."""
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    try:
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot, trackfd=False)
    except TypeError:  # Python < 3.13: the dup lives as long as the mmap object (and views)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, prot)


class Arena:
    """The mapping plus its layout; ``view(name)`` gives a numpy array over a region."""

    def __init__(self, layout: ArenaLayout, mapping: mmap.mmap, fd: int | None) -> None:
        self.layout = layout
        self._mmap: mmap.mmap | None = mapping
        self._fd = fd
        self._views: dict[str, np.ndarray] = {}

    @classmethod
    def create(cls, layout: ArenaLayout) -> Arena:
        """Allocate a zeroed arena; the orchestrator keeps the fd to hand to (re)started workers."""
        fd = _anonymous_fd(layout.size)
        try:
            mapping = _map(fd, layout.size)
        except OSError:
            os.close(fd)
            raise
        return cls(layout, mapping, fd)

    @classmethod
    def attach(cls, layout: ArenaLayout, fd: int) -> Arena:
        """Map a received fd (a worker); the fd is closed, the mapping keeps the memory."""
        try:
            if os.fstat(fd).st_size < layout.size:
                raise RuntimeBackendError(
                    f"arena fd holds {os.fstat(fd).st_size} bytes, the layout needs {layout.size}"
                )
            mapping = _map(fd, layout.size)
        finally:
            os.close(fd)
        return cls(layout, mapping, None)

    def fileno(self) -> int:
        if self._fd is None:
            raise RuntimeBackendError("this arena was attached, it has no fd to share")
        return self._fd

    def view(self, name: str) -> np.ndarray:
        """A writable C-contiguous array over region ``name`` (cached; same object each time)."""
        view = self._views.get(name)
        if view is None:
            if self._mmap is None:
                raise RuntimeBackendError("the tensor arena is closed")
            region = self.layout.region(name)
            count = int(np.prod(region.shape, dtype=np.int64))
            view = np.frombuffer(self._mmap, region.dtype, count, region.offset)
            view = view.reshape(region.shape)
            self._views[name] = view
        return view

    def views(self, names: Iterable[str] | None = None) -> Mapping[str, np.ndarray]:
        return {n: self.view(n) for n in (names or self.layout.names)}

    @property
    def closed(self) -> bool:
        return self._mmap is None

    def close(self) -> None:
        """Close the fd and unmap; idempotent.

        Views handed out earlier keep the memory alive (and valid) until they are dropped;
        the mapping (and, before Python 3.13, mmap's private dup of the fd) goes with them.
        """
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        mapping, self._mmap = self._mmap, None
        self._views.clear()
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping dies with the last one
