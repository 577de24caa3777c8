"""Orchestrator ↔ worker protocol: picklable specs for start-up, fixed-size frames on the hot path.

Every message is one ``send_bytes`` frame. Requests start with ``REQUEST`` (op, seq, arg: 9
bytes); replies with ``REPLY`` (status, seq: 5 bytes). Hot-path payloads are a few float64
timings; only start-up (``READY``/``ATTACH``) and ``CALL`` (golden parity) carry a pickle.
Pickles only ever travel between the orchestrator and the workers it spawned.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..bundle.conventions import Conventions

REQUEST = struct.Struct("<BII")
REPLY = struct.Struct("<BI")

# requests
OP_RUN = 1  # run the worker's session from arena inputs to arena outputs (arg: RUN_* flags)
OP_ACTION = 2  # action worker: action_context once, then arg Euler steps; x0 → x_out
OP_CALL = 3  # run one session on pickled feeds, reply pickled outputs (parity, doctor)
OP_ATTACH = 4  # pickled (layout, bindings, status index); the arena fd follows (SCM_RIGHTS)
OP_PING = 5
OP_STOP = 6  # release the perf vote and the contexts, reply, exit
OP_STATS = 7  # per-session call timings since the last OP_STATS (pickled), then cleared

#: OP_RUN flag: answer ST_HANDOFF as soon as the binding's hand-off outputs are in the arena,
#: then ST_OK once every output is (the next split starts while this one copies its K/V)
RUN_HANDOFF = 1

# replies
ST_OK = 1
ST_ERROR = 2  # payload: "<session>\0<message>" (utf-8)
ST_READY = 3  # payload: pickled ({component: (inputs, outputs)}, {"load_s", "peak_rss_mib"})
ST_LOAD_FAILED = 4  # payload: "<session>\0<message>"
ST_HANDOFF = 5  # RUN_HANDOFF: hand-off outputs are in the arena (payload: ms); ST_OK follows

OP_NAMES = {
    OP_RUN: "a run request",
    OP_ACTION: "the action loop",
    OP_CALL: "a component call",
    OP_ATTACH: "arena attach",
    OP_PING: "ping",
    OP_STOP: "stop",
    OP_STATS: "a timing request",
}


@dataclass(frozen=True)
class SessionSpec:
    """One session a worker loads: component, context path, a process-unique model name."""

    component: str
    path: str
    model_name: str
    #: load with float I/O (the library converts, with the tensors' own scale and offset):
    #: decided before the one load, for every context of a quantised suffix
    float_io: bool = False


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs to start; pickled into the spawned child."""

    worker: str
    sessions: tuple[SessionSpec, ...]
    variant: str
    conventions: Conventions
    loader: str = "qnn"
    device_id: int = 0
    log_level: str = "ERROR"
    perf_profile: str = "BURST"
    lifeline_grace_s: float = 2.0
    #: on STOP: release every context after the perf vote (off: ``os._exit`` right after the
    #: vote is released, like the reference bring-up, dodging the teardown crash)
    release_on_exit: bool = False
    #: the worker's environment from exec on (``LD_LIBRARY_PATH`` is read at process start):
    #: qnn_libs is prepended to LD_LIBRARY_PATH, dsp_libs becomes ADSP_LIBRARY_PATH
    qnn_libs: str = ""
    dsp_libs: str = ""
    #: ProfilingLevel name; BASIC makes the library keep each execute's events, so the worker
    #: can read the NPU execute time (getProfilingEvent) the latency table reports
    profiling: str = "OFF"

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(s.component for s in self.sessions)


@dataclass(frozen=True)
class Slot:
    """Arena region a tensor lives in; ``layers`` slices axis 0 (an LLM split's KV layers)."""

    region: str
    layers: tuple[int, int] | None = None


@dataclass(frozen=True)
class Binding:
    """Which of a session's inputs/outputs live in the arena (the rest stay worker-local).

    ``handoff`` names the outputs the next session waits for (a split's ``hidden_out``): they
    are copied into the arena first, and with ``RUN_HANDOFF`` the worker says so before it
    copies the others (its K/V layers, read only later by the action worker).
    """

    component: str
    inputs: Mapping[str, Slot] = field(default_factory=dict)
    outputs: Mapping[str, Slot] = field(default_factory=dict)
    handoff: tuple[str, ...] = ()


def request(op: int, seq: int, arg: int = 0, payload: bytes = b"") -> bytes:
    return REQUEST.pack(op, seq, arg) + payload


def reply(status: int, seq: int, payload: bytes = b"") -> bytes:
    return REPLY.pack(status, seq) + payload


def error_payload(session: str, message: str) -> bytes:
    return f"{session}\0{message}".encode("utf-8", "replace")


def split_error(payload: bytes) -> tuple[str, str]:
    session, _, message = payload.decode("utf-8", "replace").partition("\0")
    return session, message


def dumps(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> object:
    """Unpickle a frame from our own peer process (never data from files or the network)."""
    return pickle.loads(data)  # noqa: S301
