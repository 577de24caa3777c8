"""How worker processes are started: one spawner thread, a hidden ``__main__``, their library paths.

Every worker is spawned from one long-lived daemon thread (``SPAWNER``): a worker's
``PR_SET_PDEATHSIG`` fires when the *thread* that forked it exits, so a short-lived reload
thread must never be that thread.
"""

from __future__ import annotations

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


class worker_environment:  # noqa: N801 (a context manager used like a function)
    """While one worker is spawned, give it the bundle's QNN/DSP library folders.

    Set here, in the spawner thread, because the dynamic loader reads ``LD_LIBRARY_PATH``
    only when the process starts; the variables are restored right after the spawn.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self._changes: dict[str, str] = {}
        if spec.qnn_libs:
            old = os.environ.get("LD_LIBRARY_PATH", "")
            self._changes["LD_LIBRARY_PATH"] = spec.qnn_libs + (os.pathsep + old if old else "")
        if spec.dsp_libs:
            self._changes["ADSP_LIBRARY_PATH"] = spec.dsp_libs

    def __enter__(self) -> None:
        self._saved = {k: os.environ.get(k) for k in self._changes}
        os.environ.update(self._changes)

    def __exit__(self, *exc: object) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
