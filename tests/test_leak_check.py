"""The suite's thread-leak check: a foreign (non-``threading``) thread counts while its OS
thread runs and stops counting once it has exited, though CPython keeps its dummy entry."""

from __future__ import annotations

import _thread
import os
import threading
import time

from htp_helpers import leftover_threads

WAIT_S = 60.0


def test_a_foreign_thread_counts_only_while_it_runs():
    before = set(threading.enumerate())
    registered, release = threading.Event(), threading.Event()
    native: list[int] = []

    def foreign() -> None:  # like a C++ thread calling into Python: threading makes a dummy
        native.append(threading.current_thread().native_id)
        registered.set()
        release.wait(WAIT_S)

    _thread.start_new_thread(foreign, ())
    assert registered.wait(WAIT_S)
    dummies = [t for t in threading.enumerate() if isinstance(t, threading._DummyThread)
               and t.native_id == native[0]]
    assert dummies and leftover_threads(before) == [dummies[0].name]
    release.set()
    deadline = time.monotonic() + WAIT_S
    while os.path.exists(f"/proc/self/task/{native[0]}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert leftover_threads(before) == []


def test_a_python_thread_counts_until_joined():
    before = set(threading.enumerate())
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, args=(WAIT_S,), name="left-behind")
    t.start()
    assert leftover_threads(before) == ["left-behind"]
    stop.set()
    t.join(WAIT_S)
    assert leftover_threads(before) == []
