"""The resident HTP runtime: one spawned worker per session, a shared-memory arena, tiny messages.

Six processes hold the seven sessions (vision, llm_split0..3, and action_context +
action_step in the action worker). This process never imports qai_appbuilder: workers are
started with the ``spawn`` method and each initialises QNN itself (docs/runtime.md).
Tensors never cross a pipe on the hot path: the host writes its inputs into arena views
(``input_buffer``), vision writes ``image_embeds`` there, split *i* reads ``hidden_out{i-1}``
and writes ``hidden_out{i}`` plus its layer slice of the K/V buffers the action worker reads,
and the action worker runs the whole Euler loop locally. Requests are 9-byte frames.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import struct
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..bundle.conventions import Conventions
from ..bundle.variants import ACTION_CONTEXT, ACTION_STEP, COMPONENTS, VISION, VariantSpec
from ..errors import ContractError, RuntimeBackendError, WorkerFailed
from ..host.flow import DEFAULT_BETA, INPAINT_METHODS
from .arena import Arena
from .layout import plan_arena
from .libpaths import preflight
from .options import ResidentOptions
from .protocol import (
    OP_ACTION,
    OP_ATTACH,
    OP_CALL,
    OP_PING,
    OP_RUN,
    OP_STATS,
    RUN_HANDOFF,
    ST_HANDOFF,
    SessionSpec,
    WorkerSpec,
    dumps,
    loads,
)
from .session import TensorInfo, bind_contracts
from .supervisor import (
    LIVE,
    Resources,
    WorkerHandle,
    install_signal_handlers,
    start_workers,
)

LOG = logging.getLogger("molmoact2_ros.runtime")
#: the restart record under ``runtime.state_dir``
STATE_FILE = "htp_runtime_state.json"

if TYPE_CHECKING:
    from ..bundle.bundle import Bundle, Suffixes

ACTION_WORKER = "action"


def worker_groups(variant: VariantSpec) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Worker name → the components it holds (seven sessions, six processes)."""
    return (
        (VISION, (VISION,)),
        *((split, (split,)) for split in variant.llm_splits),
        (ACTION_WORKER, (ACTION_CONTEXT, ACTION_STEP)),
    )


class _Declared:
    """A loaded session as a worker declared it (enough for ``bind_contracts``)."""

    def __init__(self, name: str, inputs, outputs) -> None:
        self.name, self.inputs, self.outputs = name, tuple(inputs), tuple(outputs)


class ResidentPipeline:
    """``Pipeline`` over resident worker processes and a shared-memory arena."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        variant: VariantSpec,
        conventions: Conventions,
        options: ResidentOptions,
    ) -> None:
        self.variant = variant
        self.conventions = conventions
        self.options = options
        self.contracts = variant.contracts(euler_in_graph=conventions.euler_in_graph)
        sessions = sum(len(s.sessions) for s in specs)
        if sessions > options.max_sessions:
            raise RuntimeBackendError(
                f"the resident set needs {sessions} HTP sessions but max_sessions is "
                f"{options.max_sessions}; raise the cap only if the board holds them"
            )
        self._mp = multiprocessing.get_context("spawn")
        self._resources = Resources(options.stop_timeout_s)
        self._finalizer = weakref.finalize(self, self._resources.release)
        self._workers = [WorkerHandle(spec, i) for i, spec in enumerate(specs)]
        self._resources.workers = list(self._workers)
        self._owner = {c: w for w in self._workers for c in w.spec.components}
        self._state_path = (os.path.join(options.state_dir, STATE_FILE)
                            if options.state_dir else "")
        self._restarts, self._crashed = self._read_state()
        self.__failed: WorkerFailed | None = None
        # one caller at a time (inference thread vs lifecycle/diagnostics); reentrant so
        # a SIGTERM handler closing the pipeline mid-call does not deadlock
        self._lock = threading.RLock()
        self._timings: dict[str, float] = {}
        try:
            start_workers(self._workers, self._mp, self.options.start_timeout_s,
                          self.options.load_order)
            declared = self.declared
            self.geometry = bind_contracts(
                {c: _Declared(c, *declared[c]) for c in COMPONENTS}, self.contracts, variant
            )
            layout, self._bindings = plan_arena(declared, variant, self.geometry, len(specs))
            self._arena = Arena.create(layout)
            self._resources.arena = self._arena
            self._arena.view("status")[...] = -1
            self._attach(self._workers)
        except WorkerFailed as exc:
            self.close()
            if self._crashed:
                raise WorkerFailed(
                    f"{exc}; a worker crashed in an earlier run (recorded in "
                    f"{self._state_path}): the DSP may still hold its leaked sessions, and a "
                    "reboot may be needed", worker=exc.worker, session=exc.session) from None
            raise
        except BaseException:
            self.close()
            raise
        if self._crashed:
            self._crashed = False
            self._write_state()
        self._views = self._arena.views()
        self._x_shape = self._views["x0"].shape
        self._status = self._views["status"]
        LIVE.add(self)
        if options.install_signal_handlers:
            install_signal_handlers()

    # -- restart record ----------------------------------------------------------------------
    @property
    def _failed(self) -> WorkerFailed | None:
        return self.__failed

    @_failed.setter
    def _failed(self, exc: WorkerFailed | None) -> None:
        self.__failed = exc
        if exc is not None and not self._crashed:
            self._crashed = True  # a dead, hung or failing worker: kept for the reboot hint
            self._write_state()

    def _read_state(self) -> tuple[list[float], bool]:
        """Restart times (wall clock, within the window) and the crash flag of earlier runs."""
        if not self._state_path:
            return [], False
        try:
            with open(self._state_path, encoding="utf-8") as f:
                data = json.load(f)
            window = float(self.options.restart_window_s)
            now = time.time()
            restarts = [float(t) for t in data.get("restarts", []) if now - float(t) < window]
            return restarts, bool(data.get("crashed", False))
        except FileNotFoundError:
            return [], False
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            LOG.warning("ignoring the unreadable restart record %s (%s)", self._state_path, exc)
            return [], False

    def _write_state(self) -> None:
        if not self._state_path:
            return
        tmp = f"{self._state_path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self._state_path) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"restarts": self._restarts, "crashed": self._crashed}, f)
            os.replace(tmp, self._state_path)
        except OSError as exc:
            LOG.warning("could not write the restart record %s (%s)", self._state_path, exc)

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        bundle: Bundle,
        suffixes: Suffixes | None = None,
        *,
        conventions: Conventions | None = None,
        **options,
    ) -> ResidentPipeline:
        """Start the workers on a bundle's context binaries (``ctx/``) and verify them."""
        from ..bundle.bundle import Suffixes

        opts = ResidentOptions.from_kwargs(options)
        suffixes = suffixes or Suffixes()
        conventions = conventions or bundle.conventions()
        paths = {c: bundle.context_path(c, suffixes.for_component(c)) for c in COMPONENTS}
        own = bool(opts.bundle_libs)
        qnn_libs = opts.qnn_libs or (bundle.library_dir("qnn_libs") if own else "")
        dsp_libs = opts.dsp_libs or (bundle.library_dir("dsp_libs") if own else "")
        if opts.loader == "qnn":
            bundle.check_contexts(suffixes)  # every context binary present, none truncated
            try:
                preflight(qnn_libs, dsp_libs, bundle.variant.dsp_arch)
            except RuntimeBackendError as exc:
                if own and (qnn_libs, dsp_libs) != (opts.qnn_libs, opts.dsp_libs):
                    raise RuntimeBackendError(
                        f"{exc}; or leave the bundle's qnn_libs/ and dsp_libs/ unused "
                        "(--ignore-bundle-libs, runtime.bundle_libs: false) so the wheel's own "
                        "runtime serves it") from None
                raise
        specs = [
            WorkerSpec(
                worker=name,
                sessions=tuple(
                    SessionSpec(c, str(paths[c]), f"molmoact2-{paths[c].stem}",
                                float_io=bool(suffixes.for_component(c)))
                    for c in members
                ),
                variant=bundle.variant.name,
                conventions=conventions,
                loader=opts.loader,
                device_id=int(opts.device_ids.get(name, 0)),
                log_level=opts.log_level,
                perf_profile=opts.perf_profile,
                release_on_exit=bool(opts.release_on_exit),
                qnn_libs=qnn_libs,
                dsp_libs=dsp_libs,
                profiling=str(opts.profiling).upper(),
            )
            for name, members in worker_groups(bundle.variant)
        ]
        return cls(specs, bundle.variant, conventions, opts)

    @classmethod
    def open_null(
        cls, variant: VariantSpec, conventions: Conventions | None = None, **options
    ) -> ResidentPipeline:
        """The same workers with null sessions (real tensor sizes, no compute): the benchmark."""
        opts = ResidentOptions.from_kwargs({**options, "loader": "null"})
        conventions = conventions or Conventions()
        specs = [
            WorkerSpec(
                worker=name,
                sessions=tuple(SessionSpec(c, "", f"null-{c}") for c in members),
                variant=variant.name,
                conventions=conventions,
                loader="null",
            )
            for name, members in worker_groups(variant)
        ]
        return cls(specs, variant, conventions, opts)

    def _attach(self, workers: list[WorkerHandle]) -> None:
        """Hand the arena (fd over SCM_RIGHTS) and the slots to ``workers``."""
        for worker in workers:
            bindings = {c: self._bindings[c] for c in worker.spec.components}
            payload = dumps((self._arena.layout, bindings, worker.index))
            self._call(worker, OP_ATTACH, payload=payload, fd=self._arena.fileno(),
                       timeout=self.options.start_timeout_s, during_recovery=True)

    # -- Pipeline interface ----------------------------------------------------------------------
    @property
    def declared(self) -> dict[str, tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]]:
        """Every session's tensors exactly as its worker reported them after the load."""
        out: dict = {}
        for worker in self._workers:
            out.update(worker.declared)
        return out

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeBackendError("the resident pipeline is closed")

    def input_buffer(self, name: str) -> np.ndarray:
        from .pipeline import INPUT_BUFFERS

        self._check_open()
        if name not in INPUT_BUFFERS:
            raise RuntimeBackendError(f"{name!r} is not an input buffer ({INPUT_BUFFERS})")
        return self._views[name]

    @property
    def last_timings_ms(self) -> dict[str, float]:
        return dict(self._timings)

    def run_vision(self) -> np.ndarray:
        with self._lock:
            start = time.perf_counter()
            self._timings = {}
            (self._timings[VISION],) = self._run(self._owner[VISION], OP_RUN)
            self._timings["ipc"] = (time.perf_counter() - start) * 1e3 - self._timings[VISION]
            return self._views["image_embeds"]

    def run_action(
        self,
        x0: np.ndarray,
        num_steps: int,
        prefix: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        method: str = "pull",
        beta: float = DEFAULT_BETA,
    ) -> np.ndarray:
        steps = int(num_steps)
        if steps < 1:
            raise RuntimeBackendError(f"flow steps must be >= 1, got {num_steps}")
        with self._lock:
            self._check_open()
            start = time.perf_counter()
            np.copyto(self._views["x0"], np.asarray(x0, np.float32).reshape(self._x_shape))
            if weights is None or prefix is None:
                self._views["inpaint_weights"][...] = 0.0  # inpainting off
            else:
                np.copyto(self._views["inpaint_prefix"],
                          np.asarray(prefix, np.float32).reshape(self._x_shape))
                np.copyto(self._views["inpaint_weights"], np.asarray(weights, np.float32))
                self._views["inpaint_options"][...] = (INPAINT_METHODS.index(method), beta)
            worker_ms = self._run_splits()
            context_ms, steps_ms = self._run(self._owner[ACTION_CONTEXT], OP_ACTION, steps)
            self._timings[ACTION_CONTEXT] = context_ms
            self._timings[ACTION_STEP] = steps_ms
            wall_ms = (time.perf_counter() - start) * 1e3
            overhead = wall_ms - worker_ms - context_ms - steps_ms
            self._timings["ipc"] = self._timings.get("ipc", 0.0) + overhead
            return np.array(self._views["x_out"])

    def _run_splits(self) -> float:
        """Run the LLM splits in turn; returns their time on the critical path (ms).

        Split *i* answers ``ST_HANDOFF`` once its ``hidden_out`` is in the arena, and split
        *i + 1* starts then, while split *i* still copies its K/V layers (another core). Every
        split's final answer (all its outputs in the arena) is collected before the action
        worker, which reads every K/V layer, is asked to run.
        """
        splits = self.variant.llm_splits
        pending: list[tuple[str, WorkerHandle, int]] = []
        critical_ms = 0.0
        for split in splits[:-1]:
            worker = self._owner[split]
            seq = self._send(worker, OP_RUN, RUN_HANDOFF)
            status, payload = self._receive(worker, seq, OP_RUN, handoff=True)
            (ms,) = struct.unpack("<d", payload)
            critical_ms += ms
            if status == ST_HANDOFF:
                pending.append((split, worker, seq))
            else:  # already complete
                self._timings[split] = ms
        last = splits[-1]
        (self._timings[last],) = self._run(self._owner[last], OP_RUN)
        critical_ms += self._timings[last]
        # every split's K/V layers are in the arena before the action worker is asked to run
        for split, worker, seq in pending:
            (self._timings[split],) = struct.unpack("<d", self._receive(worker, seq, OP_RUN)[1])
        return critical_ms

    def run_component(self, component: str, feeds: Mapping[str, np.ndarray]) -> dict:
        """One session on given feeds (golden parity): arrays go through the pipe here."""
        worker = self._owner.get(component)
        if worker is None:
            raise RuntimeBackendError(f"unknown component {component!r}")
        payload = dumps((component, {k: np.asarray(v) for k, v in feeds.items()}))
        with self._lock:
            return loads(self._call(worker, OP_CALL, payload=payload))  # type: ignore[return-value]

    # -- health ------------------------------------------------------------------------------
    @property
    def failed(self) -> WorkerFailed | None:
        """The failure that put the pipeline down (``restart()`` clears it)."""
        return self._failed

    def worker_pids(self) -> dict[str, int]:
        return {w.name: w.pid for w in self._workers if w.pid is not None}

    def load_stats(self) -> dict[str, dict]:
        """Per worker: sessions, load time (s), peak RSS (MiB), fixed-point tensors."""
        return {
            w.name: {"sessions": w.sessions_label(), **w.stats} for w in self._workers
        }

    def session_timings(self) -> dict[str, list[tuple[float, float, int]]]:
        """Per session, every call since the last ask: (ms in the worker, ms inside the
        library's Inference, the library's NPU execute time in us, 0 without profiling)."""
        timings: dict[str, list] = {}
        with self._lock:
            for worker in self._workers:
                timings.update(loads(self._call(worker, OP_STATS)))
        return timings

    def ping(self) -> None:
        """Round trip to every worker (raises WorkerFailed for the first one that fails)."""
        with self._lock:
            for worker in self._workers:
                self._call(worker, OP_PING)

    def restart(self) -> None:
        """Respawn every dead, hung or failed worker and re-attach it to the same arena."""
        with self._lock:
            self._restart()

    def _restart(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeBackendError("the pipeline is closed; open a new one")
        now = time.time()  # wall clock: the record outlives this process
        window = float(self.options.restart_window_s)
        self._restarts = [t for t in self._restarts if now - t < window]
        if len(self._restarts) >= int(self.options.max_restarts):
            raise RuntimeBackendError(
                f"restart refused: {len(self._restarts)} restarts in the last {window:g} s "
                f"(max_restarts {self.options.max_restarts}); each crashed cycle may leave DSP "
                "sessions behind (the device holds about seven): close the pipeline, check the "
                "worker log, and reboot the board if loads start failing"
            )
        for worker in self._workers:
            if worker.healthy:
                try:
                    self._call(worker, OP_PING, timeout=min(5.0, self.options.call_timeout_s),
                               during_recovery=True)
                except WorkerFailed:
                    pass
        stale = [w for w in self._workers if not w.healthy]
        if stale:
            self._restarts.append(now)
            self._write_state()
        crashed = self._crashed or any(
            w.process is not None and w.process.exitcode not in (None, 0) for w in stale
        )
        try:
            self._respawn(stale)
        except WorkerFailed as exc:
            if crashed:
                exc = WorkerFailed(
                    f"{exc}; this load follows a crashed worker: the DSP may still hold its "
                    "leaked sessions (the device holds about seven), and a reboot may be needed",
                    worker=exc.worker, session=exc.session,
                )
            self._failed = exc
            self._crashed = True
            raise exc from None
        self._failed = None
        self._crashed = False
        self._write_state()

    def _respawn(self, stale: list[WorkerHandle]) -> None:
        if stale:
            self._resources.stop_workers(stale)
            fresh = [WorkerHandle(w.spec, w.index) for w in stale]
            for old, new in zip(stale, fresh):
                self._workers[old.index] = new
                self._resources.workers[self._resources.workers.index(old)] = new
                for component in new.spec.components:
                    self._owner[component] = new
            start_workers(fresh, self._mp, self.options.start_timeout_s, self.options.load_order)
            for old, new in zip(stale, fresh):
                if new.declared != old.declared and old.declared:
                    raise ContractError(
                        f"worker {new.name} came back with different tensors than before "
                        f"({new.declared} vs {old.declared}); the context files changed on disk: "
                        "close this pipeline and open a new one"
                    )
            for new in fresh:
                self._status[new.index] = -1
            self._attach(fresh)

    def close(self) -> None:
        """Stop the workers (perf vote and contexts released in each), free the arena."""
        LIVE.discard(self)
        with self._lock:
            self._finalizer()
        self._views = {}  # drop our views so the mapping goes as soon as the caller's do
        self._status = None

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> ResidentPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls -------------------------------------------------------------------------------
    def _run(self, worker: WorkerHandle, op: int, arg: int = 0) -> tuple[float, ...]:
        payload = self._call(worker, op, arg)
        return struct.unpack(f"<{len(payload) // 8}d", payload)

    def _send(self, worker: WorkerHandle, op: int, arg: int = 0) -> int:
        self._check_usable()
        try:
            return worker.send(op, arg, running=lambda: self._session_of(worker))
        except WorkerFailed as exc:
            self._failed = exc
            raise

    def _receive(
        self, worker: WorkerHandle, seq: int, op: int, *, handoff: bool = False
    ) -> tuple[int, bytes]:
        try:
            return worker.receive(seq, op, timeout=self.options.call_timeout_s,
                                  running=lambda: self._session_of(worker), handoff=handoff)
        except WorkerFailed as exc:
            self._failed = exc
            raise

    def _check_usable(self, during_recovery: bool = False) -> None:
        if not self._finalizer.alive:
            raise RuntimeBackendError("the resident pipeline is closed")
        if self._failed is not None and not during_recovery:
            raise WorkerFailed(
                f"the resident pipeline is down ({self._failed}); call restart()",
                worker=self._failed.worker,
                session=self._failed.session,
            )

    def _call(
        self,
        worker: WorkerHandle,
        op: int,
        arg: int = 0,
        *,
        payload: bytes = b"",
        fd: int | None = None,
        timeout: float | None = None,
        during_recovery: bool = False,
    ) -> bytes:
        """One request/reply; a failure marks the worker and puts the pipeline down."""
        self._check_usable(during_recovery)
        try:
            return worker.request(
                op,
                arg,
                payload=payload,
                fd=fd,
                timeout=self.options.call_timeout_s if timeout is None else timeout,
                running=lambda: self._session_of(worker),
            )
        except WorkerFailed as exc:
            self._failed = exc
            raise

    def _session_of(self, worker: WorkerHandle) -> str:
        """The session a worker was running (from its arena status word), else all it holds."""
        status = getattr(self, "_status", None)
        index = int(status[worker.index]) if status is not None else -1
        return COMPONENTS[index] if 0 <= index < len(COMPONENTS) else worker.sessions_label()
