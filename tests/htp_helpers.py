"""Helpers for the HTP runtime tests: the fake on the path, fake contexts, leak snapshots."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from molmoact2_ros.bundle.variants import VARIANTS, get_variant

TESTS = Path(__file__).resolve().parent
FAKE_PATH = TESTS / "fake_qai_appbuilder"
REPO = TESTS.parent


def ensure_contexts(tiny_root: Path) -> None:
    """Give every tiny variant folder its ``ctx/`` stand-ins (synth may already have)."""
    from molmoact2_ros.synth.contexts import write_fake_contexts

    for name in VARIANTS:
        folder = tiny_root / name
        spec = get_variant(name)
        if folder.is_dir() and not (folder / "ctx" / spec.context_file("action_step")).is_file():
            write_fake_contexts(folder, spec)


def fake_env(mp: pytest.MonkeyPatch, control_dir: Path | None = None) -> None:
    """Make spawned workers (and subprocesses) import the fake ``qai_appbuilder``.

    ``spawn`` children take this process's ``sys.path`` (PYTHONPATH set now would not reach
    them); plain subprocesses take ``PYTHONPATH``. This process never imports the fake.
    """
    parts = [str(FAKE_PATH), str(REPO)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    mp.setenv("PYTHONPATH", os.pathsep.join(parts))
    mp.syspath_prepend(str(FAKE_PATH))
    # spawn starts multiprocessing's resource tracker once per process (a child and an fd
    # that live until exit): start it now so leak snapshots do not count it.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    if control_dir is not None:
        mp.setenv("FAKE_QAI_CONTROL_DIR", str(control_dir))
    for kind in ("CRASH", "HANG", "FAIL_LOAD", "FAIL_INFERENCE", "CRASH_LOAD", "HANG_LOAD",
                 "CRASH_RELEASE"):
        mp.delenv(f"FAKE_QAI_{kind}", raising=False)


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = stat.rsplit(")", 1)[1].split()[1]
        if ppid == me and b"resource_tracker" not in cmdline:
            found.add(int(entry))
    return found


def _own_fds() -> int:
    """Open fds, less ONNX Runtime's usage database (opened once per process by the library
    at its first session, never closed: not ours to leak)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own fd, closed by now
            continue
        count += ".onnxruntime" not in target
    return count


@dataclass(frozen=True)
class Snapshot:
    """Child processes, /dev/shm entries and open fds of this process."""

    children: frozenset[int]
    shm: frozenset[str]
    fds: int

    @classmethod
    def take(cls) -> Snapshot:
        # arena views caught in exception tracebacks (reference cycles) keep the mapping,
        # and before Python 3.13 mmap's private fd, until the cycle collector runs
        gc.collect()
        shm = frozenset(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else frozenset()
        return cls(frozenset(_children()), shm, _own_fds())

    def leaks_since(self, before: Snapshot) -> list[str]:
        problems = []
        if self.children - before.children:
            problems.append(f"child processes left: {sorted(self.children - before.children)}")
        if self.shm - before.shm:
            problems.append(f"/dev/shm entries left: {sorted(self.shm - before.shm)}")
        if self.fds > before.fds:
            problems.append(f"{self.fds - before.fds} more open fds")
        return problems


def leftover_threads(before: Iterable[threading.Thread]) -> list[str]:
    """Threads of this process that started after ``before`` and still run, the package's
    process-wide preprocessing pool apart. A Ray C++ thread that once called into Python stays
    in ``threading.enumerate()`` as a dummy after it exits (CPython 3.11 never drops dummies),
    so a dummy counts only while its OS thread is still in ``/proc/self/task``."""
    known = set(before)
    out = []
    for t in threading.enumerate():
        if t in known or not t.is_alive() or t.name.startswith("molmoact2-preprocess"):
            continue
        if isinstance(t, threading._DummyThread) and not os.path.exists(
                f"/proc/self/task/{t.native_id}"):
            continue
        out.append(t.name)
    return out


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (missing, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def marker_injector(control: Path) -> Iterator:
    """Body of the ``inject`` fixtures: ``inject("llm_split1", "hang")`` drops a marker the fake
    checks on every call; the markers are removed when the test ends."""
    made: list[Path] = []

    def _inject(graph: str, kind: str) -> Path:
        marker = control / f"{graph}.{kind}"
        marker.touch()
        made.append(marker)
        return marker

    yield _inject
    for marker in made:
        marker.unlink(missing_ok=True)
