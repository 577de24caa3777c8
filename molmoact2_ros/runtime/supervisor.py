"""Worker process supervision: spawn, stop, kill and reap the resident workers; signal hooks.

Workers are started through ``spawn.py`` (one long-lived spawner thread, see there). Every
exit status and signal of a worker is logged (logger ``molmoact2_ros.runtime``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import wait
from typing import Protocol

from ..errors import RuntimeBackendError, WorkerFailed
from .arena import Arena
from .protocol import (
    OP_NAMES,
    OP_STOP,
    REPLY,
    ST_ERROR,
    ST_HANDOFF,
    ST_LOAD_FAILED,
    ST_READY,
    WorkerSpec,
    loads,
    request,
    split_error,
)
from .spawn import PARENT_MAIN_HIDDEN, SPAWNER
from .worker import worker_main

LOG = logging.getLogger("molmoact2_ros.runtime")
LOAD_ORDERS = ("parallel", "sequential")


class Closable(Protocol):
    def close(self) -> None: ...


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


class WorkerHandle:
    """Parent-side handle of one worker process."""

    def __init__(self, spec: WorkerSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.name = spec.worker
        self.process: multiprocessing.process.BaseProcess | None = None
        self.conn = None
        self.lifeline = None
        self.declared: dict = {}
        self.stats: dict = {}
        self.healthy = False
        self.seq = 0
        self.stop_answered = False
        self._exit_logged = False

    def start(self, mp: multiprocessing.context.SpawnContext) -> None:
        parent, child = mp.Pipe(duplex=True)
        life_r, life_w = mp.Pipe(duplex=False)
        self.conn, self.lifeline = parent, life_w
        self.process = mp.Process(
            target=worker_main,
            args=(self.spec, child, life_r),
            name=f"molmoact2-{self.name}",
            daemon=True,
        )
        process = self.process

        def start() -> None:
            with PARENT_MAIN_HIDDEN:
                process.start()

        try:
            SPAWNER.run(start)
        finally:
            child.close()
            life_r.close()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def sessions_label(self) -> str:
        return "+".join(self.spec.components)

    def exit_status(self, wait_s: float = 1.0) -> str:
        if self.process is None:
            return "never started"
        self.process.join(wait_s)
        self.log_exit()
        return describe_exit(self.process.exitcode)

    def log_exit(self) -> None:
        """Log this worker's exit status or signal once, as soon as it is known."""
        process = self.process
        if self._exit_logged or process is None or process.exitcode is None:
            return
        self._exit_logged = True
        code = process.exitcode
        level = logging.INFO if code == 0 else logging.WARNING
        answered = "answered stop, then " if self.stop_answered else ""
        LOG.log(level, "worker %s (sessions %s, pid %s) %s%s", self.name, self.sessions_label(),
                process.pid, answered, describe_exit(code))

    @property
    def context_bytes(self) -> int:
        """Total size of this worker's context files (the sequential load order's key)."""
        total = 0
        for session in self.spec.sessions:
            try:
                total += os.path.getsize(session.path)
            except OSError:
                pass
        return total

    def kill(self) -> None:
        if self.process is not None and self.process.exitcode is None:
            self.process.kill()
            self.process.join(5.0)

    def failure(self, message: str, session: str = "") -> WorkerFailed:
        """Mark this worker unhealthy and build the error that names it."""
        self.healthy = False
        return WorkerFailed(message, worker=self.name, session=session or self.sessions_label())

    def request(
        self,
        op: int,
        arg: int = 0,
        *,
        payload: bytes = b"",
        fd: int | None = None,
        timeout: float,
        running: Callable[[], str] | None = None,
    ) -> bytes:
        """One request/reply with a deadline; a dead, hung or failing worker raises WorkerFailed.

        ``running`` names the session the worker was in (for the action worker's two).
        """
        seq = self.send(op, arg, payload=payload, fd=fd, running=running)
        return self.receive(seq, op, timeout=timeout, running=running)[1]

    def send(
        self,
        op: int,
        arg: int = 0,
        *,
        payload: bytes = b"",
        fd: int | None = None,
        running: Callable[[], str] | None = None,
    ) -> int:
        """Send one request; returns its sequence number for ``receive``."""
        conn, process = self.conn, self.process
        if conn is None or process is None:
            raise self.failure(f"worker {self.name} is not running; call restart()")
        self.seq += 1
        try:
            conn.send_bytes(request(op, self.seq, arg, payload))
            if fd is not None:
                reduction.send_handle(conn, fd, process.pid)
        except OSError:
            raise self._died(OP_NAMES.get(op, str(op)), running) from None
        return self.seq

    def receive(
        self,
        seq: int,
        op: int,
        *,
        timeout: float,
        running: Callable[[], str] | None = None,
        handoff: bool = False,
    ) -> tuple[int, bytes]:
        """Wait for the reply to request ``seq``: (status, payload).

        With ``handoff`` the first of ``ST_HANDOFF`` or ``ST_OK`` is returned; without it a
        ``ST_HANDOFF`` is skipped and only the final answer counts. Replies to older requests
        (the late answers of interrupted calls) are skipped.
        """
        what = OP_NAMES.get(op, str(op))
        conn, process = self.conn, self.process
        if conn is None or process is None:
            raise self.failure(f"worker {self.name} is not running; call restart()")
        deadline = time.monotonic() + timeout
        while True:
            # a reply already waiting needs no wait() (a selector per call)
            ready = [conn] if conn.poll() else wait(
                [conn, process.sentinel], max(0.0, deadline - time.monotonic())
            )
            if not ready:
                session = running() if running else self.sessions_label()
                self.kill()
                raise self.failure(
                    f"worker {self.name} (session {session}, pid {self.pid}) did not answer "
                    f"{what} within {timeout:g} s and was killed; call restart() to respawn it",
                    session,
                )
            if conn not in ready:
                raise self._died(what, running)
            try:
                frame = conn.recv_bytes()
            except (EOFError, OSError):
                raise self._died(what, running) from None
            status, reply_seq = REPLY.unpack_from(frame)
            if reply_seq != seq or (status == ST_HANDOFF and not handoff):
                continue  # a late answer of an interrupted call, or a hand-off not waited for
            if status == ST_ERROR:
                session, message = split_error(frame[REPLY.size :])
                raise self.failure(
                    f"worker {self.name} (session {session}) failed {what}: {message}", session
                )
            return status, frame[REPLY.size :]

    def _died(self, what: str, running: Callable[[], str] | None) -> WorkerFailed:
        session = running() if running else self.sessions_label()
        return self.failure(
            f"worker {self.name} (session {session}, pid {self.pid}) {self.exit_status()} "
            f"during {what}; call restart() to respawn it",
            session,
        )

    def send_stop(self) -> bool:
        if self.conn is None or self.process is None or self.process.exitcode is not None:
            return False
        try:
            self.seq += 1
            self.conn.send_bytes(request(OP_STOP, self.seq))
            return True
        except OSError:
            return False

    def finish(self, deadline: float) -> None:
        """Wait for a requested stop until ``deadline``, kill if needed, free every handle."""
        if self.process is not None and self.process.pid is None:
            self.process = None  # never started
        if self.process is not None:
            # at least a short grace: a worker that just replied to STOP is exiting
            self.process.join(max(0.5, deadline - time.monotonic()))
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(5.0)
            self.log_exit()
            if self.process.exitcode is not None:
                self.process.close()
            self.process = None
        for handle in (self.conn, self.lifeline):
            if handle is not None:
                handle.close()
        self.conn = self.lifeline = None
        self.healthy = False


def start_workers(
    workers: list[WorkerHandle],
    mp: multiprocessing.context.SpawnContext,
    timeout_s: float,
    load_order: str = "parallel",
) -> None:
    """Spawn ``workers`` and collect the sessions each declares once loaded.

    ``parallel`` starts them all at once; ``sequential`` starts the largest context first and
    the next one when the previous is ready (lower peak host memory and DSP load pressure).
    Each worker's load time and peak RSS land in ``worker.stats``.
    """
    if load_order not in LOAD_ORDERS:
        raise RuntimeBackendError(f"load_order must be one of {LOAD_ORDERS}, got {load_order!r}")
    if load_order == "sequential":
        for worker in sorted(workers, key=lambda w: -w.context_bytes):
            _start_and_wait([worker], mp, timeout_s)
    else:
        _start_and_wait(workers, mp, timeout_s)
    for worker in workers:
        LOG.info("worker %s (%s) loaded in %.2f s, peak RSS %.1f MiB", worker.name,
                 worker.sessions_label(), worker.stats.get("load_s", float("nan")),
                 worker.stats.get("peak_rss_mib", float("nan")))


def _start_and_wait(
    workers: list[WorkerHandle], mp: multiprocessing.context.SpawnContext, timeout_s: float
) -> None:
    for worker in workers:
        worker.start(mp)
    deadline = time.monotonic() + timeout_s
    pending = {w.conn: w for w in workers}
    sentinels = {w.process.sentinel: w for w in workers if w.process is not None}
    while pending:
        waiting = [*pending, *(s for s, w in sentinels.items() if w.conn in pending)]
        ready = wait(waiting, max(0.0, deadline - time.monotonic()))
        if not ready:
            worker = next(iter(pending.values()))
            worker.kill()
            raise worker.failure(
                f"worker {worker.name} (session {worker.sessions_label()}) did not finish "
                f"loading within {timeout_s:g} s and was killed (raise start_timeout_s for "
                "very large contexts)"
            )
        for handle in ready:
            worker = pending.get(handle) or sentinels[handle]
            if worker.conn in pending:
                _collect_ready(worker)
                del pending[worker.conn]


def _collect_ready(worker: WorkerHandle) -> None:
    try:
        frame = worker.conn.recv_bytes()
    except (EOFError, OSError):
        raise worker.failure(
            f"worker {worker.name} (session {worker.sessions_label()}) "
            f"{worker.exit_status()} while loading (a failed dlopen of the QNN libraries "
            "exits the process; see its log above and run `molmoact2 doctor`)"
        ) from None
    status, _ = REPLY.unpack_from(frame)
    payload = frame[REPLY.size :]
    if status == ST_LOAD_FAILED:
        session, message = split_error(payload)
        raise worker.failure(
            f"worker {worker.name}: session {session} did not load: {message}", session
        )
    if status != ST_READY:
        raise worker.failure(f"worker {worker.name} answered {status} instead of ready")
    declared, stats = loads(payload)  # type: ignore[misc]
    worker.declared = dict(declared)
    worker.stats = dict(stats)
    worker.healthy = True


class Resources:
    """What must be released on close, GC or interpreter exit (no reference to the pipeline)."""

    def __init__(self, stop_timeout_s: float) -> None:
        self.workers: list[WorkerHandle] = []
        self.arena: Arena | None = None
        self.stop_timeout_s = stop_timeout_s

    def stop_workers(self, workers: list[WorkerHandle]) -> None:
        asked = [w for w in workers if w.send_stop()]
        deadline = time.monotonic() + self.stop_timeout_s
        for worker in asked:
            conn = worker.conn
            while conn is not None and conn.poll(max(0.0, deadline - time.monotonic())):
                try:
                    frame = conn.recv_bytes()
                except (EOFError, OSError):
                    break
                if REPLY.unpack_from(frame)[1] == worker.seq:  # not a late answer of a call
                    worker.stop_answered = True
                    break
        for worker in workers:
            worker.finish(deadline)

    def release(self) -> None:
        workers, self.workers = self.workers, []
        try:
            self.stop_workers(workers)
        finally:
            if self.arena is not None:
                self.arena.close()
                self.arena = None


LIVE: weakref.WeakSet[Closable] = weakref.WeakSet()
_PREVIOUS_HANDLERS: dict[int, object] = {}


def _on_terminate(signum: int, frame) -> None:
    """Close every live pipeline, then do what the previous handler would have done."""
    for pipeline in list(LIVE):
        pipeline.close()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install_signal_handlers() -> None:
    """Close resident pipelines on SIGTERM/SIGHUP (SIGINT already unwinds to atexit)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeBackendError("install_signal_handlers must be called from the main thread")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if sig not in _PREVIOUS_HANDLERS:
            _PREVIOUS_HANDLERS[sig] = signal.signal(sig, _on_terminate)
