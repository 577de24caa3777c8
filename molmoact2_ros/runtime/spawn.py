"""How worker processes are started: one spawner thread, a hidden ``__main__``, their library paths
(set in the worker, never in this process).

Every worker is spawned from one long-lived daemon thread (``SPAWNER``): a worker's
``PR_SET_PDEATHSIG`` fires when the *thread* that forked it exits, so a short-lived reload
thread must never be that thread.
"""

from __future__ import annotations

import glob
import os
import queue
import sys
import threading
import types
from collections.abc import Callable

from .protocol import WorkerSpec


class _Spawner:
    """Runs callables on one daemon thread that lives as long as the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], object]) -> object:
        if threading.current_thread() is self._thread:
            return fn()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # first use, or after fork
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._loop, args=(self._jobs,), name="molmoact2-spawner", daemon=True
                )
                self._thread.start()
        done, box = threading.Event(), {}
        self._jobs.put((fn, done, box))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    @staticmethod
    def _loop(jobs: queue.SimpleQueue) -> None:
        while True:
            fn, done, box = jobs.get()
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                done.set()


SPAWNER = _Spawner()


class _HideParentMain:
    """While starting a worker, hide ``__main__`` so the spawned child does not re-run it.

    ``spawn`` re-imports the parent's main script in the child; a launcher without an
    ``if __name__ == "__main__"`` guard would then run the whole program again in every
    worker. Workers need nothing from ``__main__``, so they get an empty stand-in.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()
        self._main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")

    def __exit__(self, *exc: object) -> None:
        if self._main is not None:
            sys.modules["__main__"] = self._main
        self._lock.release()


PARENT_MAIN_HIDDEN = _HideParentMain()


#: the first bytes of an ELF file (a placeholder of another kind is not preloaded)
_ELF = b"\x7fELF"


def apply_library_paths(spec: WorkerSpec) -> list[str]:
    """In the worker, before QNN is imported: the bundle's QNN/DSP library folders.

    Only the worker's own environment changes; the orchestrator's never does (another of its
    threads may read it while workers spawn, and a C-level ``getenv`` racing ``setenv`` can
    crash). ``ADSP_LIBRARY_PATH`` is read by FastRPC when the DSP session opens, so setting it
    here is in time; ``LD_LIBRARY_PATH`` is read by the dynamic loader only at process start,
    so it is set here for the worker's own children (the library's service process) and the
    stub that ``libQnnHtp.so`` opens by name is preloaded from ``qnn_libs`` instead: a library
    opened by name is found among the loaded ones by its soname first. Returns what was
    preloaded.
    """
    import ctypes

    preloaded = []
    if spec.dsp_libs:
        os.environ["ADSP_LIBRARY_PATH"] = spec.dsp_libs
    if spec.qnn_libs:
        old = os.environ.get("LD_LIBRARY_PATH", "")
        os.environ["LD_LIBRARY_PATH"] = spec.qnn_libs + (os.pathsep + old if old else "")
        for path in sorted(glob.glob(os.path.join(spec.qnn_libs, "libQnnHtpV*Stub.so"))):
            with open(path, "rb") as f:
                if f.read(4) != _ELF:
                    continue
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            preloaded.append(path)
    return preloaded
