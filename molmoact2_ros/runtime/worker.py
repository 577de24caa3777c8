"""The resident worker process: load its session(s), map the arena, serve byte-sized requests.

``worker_main`` is the ``multiprocessing`` (spawn) target. It runs the same code whatever the
session loader is (``qnn`` on the IQ-9075, ``null`` for the host-overhead benchmark). The
worker dies with the orchestrator in every state: ``PR_SET_PDEATHSIG`` = SIGKILL (which also
ends a SIGSTOPped worker; the supervisor spawns every worker from one long-lived thread,
because the signal fires when the *thread* that forked the worker exits), EOF on its control
socket when idle, and a lifeline watchdog thread when busy or hung.

STOP is answered before anything is torn down, so a teardown crash cannot hide the answer;
then the perf vote is released and, only with ``release_on_exit``, every context, and the
process ends with ``os._exit``.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import resource
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection

import numpy as np

from ..bundle.variants import ACTION_CONTEXT, ACTION_STEP, COMPONENTS
from ..host.flow import INPAINT_METHODS, run_flow
from .arena import Arena
from .loaders import InferenceFailed, LoadFailed, SessionLoader, WorkerSession, make_loader
from .protocol import (
    OP_ACTION,
    OP_ATTACH,
    OP_CALL,
    OP_PING,
    OP_RUN,
    OP_STATS,
    OP_STOP,
    REQUEST,
    RUN_HANDOFF,
    ST_ERROR,
    ST_HANDOFF,
    ST_LOAD_FAILED,
    ST_OK,
    ST_READY,
    Binding,
    Slot,
    WorkerSpec,
    dumps,
    error_payload,
    loads,
    reply,
)
from .session import NUMPY_DTYPES, TensorInfo, cast_feeds
from .spawn import apply_library_paths

EXIT_OK = 0
EXIT_LOAD_FAILED = 3
EXIT_ORPHANED = 70
PR_SET_PDEATHSIG = 1
#: glibc ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: the largest M_MMAP_THRESHOLD every 64-bit glibc accepts (older ones refuse more)
HEAP_MMAP_MAX = 32 << 20


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM: ru_maxrss would include the parent's at fork)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def die_with_parent() -> None:
    """SIGKILL this process when the thread that spawned it ends (Linux ``prctl``)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        print(f"molmoact2 worker: prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}",
              file=sys.stderr)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(EXIT_ORPHANED)  # the orchestrator died before prctl took effect


def keep_heap_warm() -> bool:
    """Make glibc reuse freed heap pages instead of returning them to the kernel.

    ``qai_appbuilder`` returns every output in a fresh allocation on every call, and the
    outputs are freed when the call is over. With glibc's defaults the freed block sits at the
    top of the heap, is larger than the trim threshold and goes back to the kernel, so the next
    call's outputs land on fresh pages: one minor page fault (and a page zeroed by the kernel)
    per 4 KiB of output, every call (about 1100 faults, 3-5 ms, per LLM split on the dev VM).
    A fixed mmap threshold of 32 MiB (the most every glibc accepts; it also stops the dynamic
    threshold) keeps blocks up to that size on the heap, and an unreachable trim threshold
    keeps the heap's pages mapped, so each call reuses the pages the previous one freed. The
    worker's RSS then holds its per-call peak, which every call needs again anyway. Returns
    whether glibc took both settings (False off glibc: nothing changes).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_MAX)) and bool(
        mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    )


def worker_main(spec: WorkerSpec, conn: Connection, lifeline: Connection) -> None:
    """Process entry point; never returns (``os._exit`` dodges the known teardown crash)."""
    die_with_parent()
    heap_warm = keep_heap_warm()
    # Ctrl-C reaches the whole process group; the orchestrator decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_lifeline(lifeline, spec.lifeline_grace_s)
    code = EXIT_OK
    server = None
    try:
        apply_library_paths(spec)  # this process's environment only, before QNN is imported
    except OSError as exc:
        print(f"molmoact2 worker {spec.worker}: cannot preload from qnn_libs {spec.qnn_libs}: "
              f"{exc}", file=sys.stderr)
    try:
        # keep ``server`` referenced until os._exit: dropping it would destroy every context
        # through refcounting (ModelDestroy), which release_on_exit=False must avoid
        server = _Server(spec, conn, heap_warm)
        code = server.serve()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if server is not None else EXIT_LOAD_FAILED)


def _watch_lifeline(lifeline: Connection, grace_s: float) -> None:
    """Exit when the orchestrator's end of the lifeline closes and we did not stop in time."""

    def watch() -> None:
        try:
            while True:
                lifeline.recv_bytes()
        except (EOFError, OSError):
            pass
        time.sleep(grace_s)
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="molmoact2-lifeline", daemon=True).start()


def _slot_view(arena: Arena, slot: Slot, info: TensorInfo) -> np.ndarray:
    view = arena.view(slot.region)
    if slot.layers is not None:
        view = view[slot.layers[0] : slot.layers[1]]
    if view.size != int(np.prod(info.shape, dtype=np.int64)):
        raise LoadFailed("", f"arena region {slot.region} does not fit {info.describe()}")
    return view.reshape(info.shape)


class BoundSession:
    """A session wired to the arena: inputs gathered without copies, outputs copied in place."""

    def __init__(self, session: WorkerSession, binding: Binding, arena: Arena,
                 record: Callable[[str, float, WorkerSession], None] | None = None) -> None:
        self.session = session
        self._record = record
        self.arrays: list[np.ndarray] = []
        self._casts: list[tuple[np.ndarray, np.ndarray]] = []
        self._local: dict[str, tuple[int, np.ndarray]] = {}
        for index, info in enumerate(session.inputs):
            dtype = np.dtype(NUMPY_DTYPES[info.dtype])
            slot = binding.inputs.get(info.name)
            if slot is None:
                array = np.zeros(info.shape, dtype)
                self._local[info.name] = (index, array)
            else:
                view = _slot_view(arena, slot, info)
                array = view if view.dtype == dtype else np.empty(info.shape, dtype)
                if array is not view:
                    self._casts.append((view, array))
            self.arrays.append(array)
        self.outputs = [
            _slot_view(arena, binding.outputs[o.name], o) if o.name in binding.outputs else None
            for o in session.outputs
        ]
        self.output_index = {o.name: i for i, o in enumerate(session.outputs)}
        # (arena view, output index): the hand-off outputs first, then the rest
        first = [self.output_index[n] for n in binding.handoff if n in self.output_index]
        rest = [i for i in range(len(self.outputs)) if i not in first]
        self._handoff = [(self.outputs[i], i) for i in first if self.outputs[i] is not None]
        self._rest = [(self.outputs[i], i) for i in rest if self.outputs[i] is not None]

    def write(self, name: str, value: np.ndarray | float) -> None:
        """Copy into a worker-local input (cast to its dtype)."""
        index, buffer = self._local[name]
        np.copyto(buffer, value, casting="unsafe")
        self.arrays[index] = buffer

    def adopt(self, name: str, array: np.ndarray) -> None:
        """Use ``array`` as a local input without a copy when dtype and shape already fit."""
        index, buffer = self._local[name]
        if array.dtype == buffer.dtype and array.shape == buffer.shape:
            self.arrays[index] = np.ascontiguousarray(array)
        else:
            self.write(name, array.reshape(buffer.shape))

    def run(self, handoff: Callable[[], None] | None = None) -> list[np.ndarray]:
        """Run once; outputs go into the arena, the hand-off ones first, then ``handoff()``
        (the next session may start), then the others."""
        start = time.perf_counter()
        for src, dst in self._casts:
            np.copyto(dst, src, casting="unsafe")
        outs = self.session.infer(self.arrays)
        for dst, index in self._handoff:
            np.copyto(dst, outs[index], casting="unsafe")
        if handoff is not None:
            handoff()
        for dst, index in self._rest:
            np.copyto(dst, outs[index], casting="unsafe")
        if self._record is not None:
            self._record(self.session.component, (time.perf_counter() - start) * 1e3,
                         self.session)
        return outs


class _Server:
    """One worker's state and request loop."""

    def __init__(self, spec: WorkerSpec, conn: Connection, heap_warm: bool = False) -> None:
        self.spec = spec
        self.heap_warm = heap_warm
        self.conn = conn
        self.loader: SessionLoader | None = None
        self.sessions: dict[str, WorkerSession] = {}
        self.bound: dict[str, BoundSession] = {}
        self.arena: Arena | None = None
        self.status: np.ndarray | None = None
        self.current = spec.components[0]
        #: per session since the last OP_STATS: (call ms, Inference ms, library execute us)
        self.timings: dict[str, list[tuple[float, float, int]]] = {}

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> bool:
        start = time.perf_counter()
        try:
            self.loader = make_loader(self.spec)
            for session_spec in self.spec.sessions:
                self.current = session_spec.component
                self.sessions[session_spec.component] = self.loader.load(session_spec)
            self.loader.boost()
        except LoadFailed as exc:
            payload = error_payload(exc.session or self.current, str(exc))
            self._send(reply(ST_LOAD_FAILED, 0, payload))
            return False
        except Exception as exc:  # QNNConfig raises ValueError when its libs are missing
            message = f"{type(exc).__name__}: {exc}"
            self._send(reply(ST_LOAD_FAILED, 0, error_payload(self.current, message)))
            return False
        declared = {c: (s.inputs, s.outputs) for c, s in self.sessions.items()}
        stats = {
            "load_s": time.perf_counter() - start,
            "peak_rss_mib": peak_rss_mib(),
            "heap_warm": self.heap_warm,
            "fixed_point": {
                c: getattr(s, "fixed_point", ()) for c, s in self.sessions.items()
            },
            "float_elements": {
                c: getattr(s, "float_elements", 0) for c, s in self.sessions.items()
            },
            "loaded": list(self.sessions),
        }
        self._send(reply(ST_READY, 0, dumps((declared, stats))))
        return True

    def shutdown(self, release_contexts: bool = True) -> None:
        """Release the perf vote, then (if asked) every context: the documented order."""
        if self.loader is not None:
            try:
                self.loader.shutdown()
            except Exception as exc:
                print(f"molmoact2 worker {self.spec.worker}: perf release: {exc}", file=sys.stderr)
        if not release_contexts:
            return  # os._exit follows; the driver frees the DSP sessions with the process
        for session in self.sessions.values():
            try:
                session.release()
            except Exception as exc:
                print(f"molmoact2 worker {self.spec.worker}: release: {exc}", file=sys.stderr)
        self.sessions.clear()

    def serve(self) -> int:
        if not self.start():
            # the contexts that did load stay loaded unless release_on_exit: destroying them
            # is the teardown path that can crash, and os._exit frees them with the process
            self.shutdown(release_contexts=self.spec.release_on_exit)
            return EXIT_LOAD_FAILED
        while True:
            try:
                frame = self.conn.recv_bytes()
            except (EOFError, OSError):  # the orchestrator is gone
                self.shutdown(release_contexts=self.spec.release_on_exit)
                return EXIT_OK
            op, seq, arg = REQUEST.unpack_from(frame)
            if op == OP_STOP:
                self._send(reply(ST_OK, seq))  # first: a teardown crash cannot hide it
                self.shutdown(release_contexts=self.spec.release_on_exit)
                return EXIT_OK
            try:
                answer = reply(ST_OK, seq, self.handle(op, arg, frame[REQUEST.size :], seq))
            except (LoadFailed, InferenceFailed) as exc:
                answer = reply(ST_ERROR, seq, error_payload(exc.session or self.current, str(exc)))
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                answer = reply(ST_ERROR, seq, error_payload(self.current, message))
            if self.status is not None:
                self.status[...] = -1  # idle again, before the orchestrator hears back
            self._send(answer)

    def _send(self, frame: bytes) -> None:
        try:
            self.conn.send_bytes(frame)
        except OSError:
            pass  # orchestrator gone; the next recv sees EOF

    # -- requests ----------------------------------------------------------------------------
    def handle(self, op: int, arg: int, payload: bytes, seq: int = 0) -> bytes:
        if op == OP_RUN:
            component = self.spec.components[0]
            start = time.perf_counter()

            def handoff() -> None:
                ms = (time.perf_counter() - start) * 1e3
                self._send(reply(ST_HANDOFF, seq, struct.pack("<d", ms)))

            self._bound(component).run(handoff if arg & RUN_HANDOFF else None)
            return struct.pack("<d", (time.perf_counter() - start) * 1e3)
        if op == OP_ACTION:
            return struct.pack("<dd", *self.run_action(arg))
        if op == OP_CALL:
            component, feeds = loads(payload)
            return dumps(self.call(component, feeds))
        if op == OP_ATTACH:
            self.attach(payload)
            return b""
        if op == OP_PING:
            return b""
        if op == OP_STATS:
            timings, self.timings = self.timings, {}
            return dumps(timings)
        raise ValueError(f"unknown request op {op}")

    def attach(self, payload: bytes) -> None:
        layout, bindings, status_index = loads(payload)
        fd = reduction.recv_handle(self.conn)
        self.arena = Arena.attach(layout, fd)
        self.status = self.arena.view("status")[status_index : status_index + 1]
        self.bound = {
            c: BoundSession(self.sessions[c], bindings[c], self.arena, self._record)
            for c in self.sessions
        }

    def _record(self, component: str, call_ms: float, session: WorkerSession) -> None:
        """Keep one call's times: the whole call here, the library's Inference and the NPU
        execute time the library reports (0 when profiling is off or it reports none)."""
        entry = (call_ms, float(getattr(session, "last_inference_ms", 0.0)),
                 int(getattr(session, "last_execute_us", 0)))
        self.timings.setdefault(component, []).append(entry)

    def _bound(self, component: str) -> BoundSession:
        if not self.bound:
            raise RuntimeError("the arena is not attached yet")
        self.current = component
        if self.status is not None:
            self.status[0] = COMPONENTS.index(component)
        return self.bound[component]

    def call(self, component: str, feeds: dict) -> dict[str, np.ndarray]:
        """Run one session on given feeds (golden parity): arrays through the pipe."""
        if component not in self.sessions:
            raise ValueError(f"worker {self.spec.worker} does not hold {component}")
        self.current = component
        if self.status is not None:
            self.status[0] = COMPONENTS.index(component)
        session = self.sessions[component]
        cast = cast_feeds(feeds, session.inputs)
        outs = session.infer([cast[i.name] for i in session.inputs])
        return {o.name: np.array(a) for o, a in zip(session.outputs, outs)}

    def run_action(self, num_steps: int) -> tuple[float, float]:
        """action_context once, then the whole Euler loop here; x_N goes to the arena."""
        if self.arena is None:
            raise RuntimeError("the arena is not attached yet")
        conv = self.spec.conventions
        t0 = time.perf_counter()
        context = self._bound(ACTION_CONTEXT)
        outs = context.run()
        step = self._bound(ACTION_STEP)
        for name, index in context.output_index.items():
            step.adopt(name, outs[index])
        t1 = time.perf_counter()
        out_index = step.output_index["next_trajectory" if conv.euler_in_graph else "velocity"]

        def run_step(x: np.ndarray, t: np.ndarray) -> np.ndarray:
            step.write("trajectory", x)
            step.write("timestep", t)
            return step.run()[out_index]

        pad = np.asarray(self.arena.view("action_dim_is_pad"), dtype=np.float32)
        x0 = np.array(self.arena.view("x0"), dtype=np.float32)
        weights = np.array(self.arena.view("inpaint_weights"), dtype=np.float32)
        prefix = np.array(self.arena.view("inpaint_prefix"), dtype=np.float32)
        method, beta = np.array(self.arena.view("inpaint_options"), dtype=np.float64)
        self.arena.view("x_out")[...] = run_flow(run_step, x0, pad, num_steps, conv,
                                                 prefix, weights, INPAINT_METHODS[int(method)],
                                                 float(beta))
        return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3
