"""Keyword options of the resident HTP pipeline, validated once (``runtime.*`` parameters)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..errors import RuntimeBackendError
from .supervisor import LOAD_ORDERS


@dataclass(frozen=True)
class ResidentOptions:
    """Keyword options of ``ResidentPipeline.open`` (``pipeline_options`` of the policy)."""

    call_timeout_s: float = 30.0
    start_timeout_s: float = 300.0
    stop_timeout_s: float = 10.0
    max_sessions: int = 7
    device_ids: Mapping[str, int] = field(default_factory=dict)
    loader: str = "qnn"
    log_level: str = "ERROR"
    perf_profile: str = "BURST"
    install_signal_handlers: bool = False
    #: on stop, release every context too (off: perf vote, then os._exit; see worker.py)
    release_on_exit: bool = False
    #: "parallel" or "sequential" (largest context first, the next when it is ready)
    load_order: str = "parallel"
    #: at most this many restarts within restart_window_s (crashed cycles leak DSP sessions)
    max_restarts: int = 3
    restart_window_s: float = 600.0
    #: QNN runtime / DSP skel folders ("" = the bundle's qnn_libs/ and dsp_libs/ if present)
    qnn_libs: str = ""
    dsp_libs: str = ""
    #: use a bundle's own qnn_libs/ and dsp_libs/ (off: the wheel's runtime, e.g. for the
    #: seed workspace's QAIRT 2.47 folders under the 2.51.40 wheel)
    bundle_libs: bool = True
    #: ProfilingLevel of every worker ("OFF", "BASIC"): BASIC lets the latency table read the
    #: library's own NPU execute time per call, at the cost of an event walk per execute
    profiling: str = "OFF"
    #: folder for the restart record (restart times and whether a worker crashed), so the
    #: restart cap and the reboot hint survive a node restart ("" = in memory only)
    state_dir: str = ""

    @classmethod
    def from_kwargs(cls, options: Mapping[str, object]) -> ResidentOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise RuntimeBackendError(
                f"unknown htp pipeline options {unknown}; known: {sorted(known)}"
            )
        opts = cls(**options)  # type: ignore[arg-type]
        for name in ("call_timeout_s", "start_timeout_s", "stop_timeout_s", "restart_window_s"):
            if not float(getattr(opts, name)) > 0:
                raise RuntimeBackendError(f"{name} must be > 0, got {getattr(opts, name)}")
        if opts.load_order not in LOAD_ORDERS:
            raise RuntimeBackendError(
                f"load_order must be one of {', '.join(LOAD_ORDERS)}, got {opts.load_order!r}"
            )
        if str(opts.profiling).upper() not in ("OFF", "BASIC", "DETAILED"):
            raise RuntimeBackendError(
                f"profiling must be OFF, BASIC or DETAILED, got {opts.profiling!r}")
        if int(opts.max_restarts) < 0:
            raise RuntimeBackendError(f"max_restarts must be >= 0, got {opts.max_restarts}")
        return opts
