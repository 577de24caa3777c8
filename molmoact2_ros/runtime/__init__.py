"""Runtime backends behind one seam: ``open_sessions`` / ``open_pipeline``.

Backends: ``onnx`` (ONNX Runtime, in-process), ``htp`` (qai_appbuilder in resident worker
processes; imported lazily so nothing here needs it), ``null`` (no compute, real sizes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..bundle.variants import COMPONENTS
from ..errors import RuntimeBackendError
from .session import Geometry, Session, SessionSet, TensorInfo

if TYPE_CHECKING:
    from ..bundle.bundle import Bundle, Suffixes
    from .pipeline import Pipeline

BACKENDS = ("onnx", "htp", "null")


def open_sessions(
    bundle: Bundle, backend: str = "onnx", suffixes: Suffixes | None = None
) -> SessionSet:
    """Load all seven sessions of a bundle in this process and validate that they chain."""
    from ..bundle.bundle import Suffixes

    suffixes = suffixes or Suffixes()
    conventions = bundle.conventions()
    if backend == "onnx":
        from .onnx_backend import OnnxSession

        bundle.check("onnx", suffixes)
        sessions: dict[str, Session] = {}
        try:
            for component in COMPONENTS:
                path = bundle.onnx_path(component, suffixes.for_component(component))
                sessions[component] = OnnxSession(component, path)
        except Exception:
            for s in sessions.values():
                s.close()
            raise
    elif backend == "null":
        from .null_backend import null_sessions

        sessions = null_sessions(bundle.variant, euler_in_graph=conventions.euler_in_graph)
    elif backend == "htp":
        raise RuntimeBackendError(
            "the htp backend runs sessions in resident workers; use open_pipeline(..., 'htp')"
        )
    else:
        raise RuntimeBackendError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return SessionSet(sessions, bundle.variant, euler_in_graph=conventions.euler_in_graph)


def open_pipeline(
    bundle: Bundle,
    backend: str = "onnx",
    suffixes: Suffixes | None = None,
    **options,
) -> Pipeline:
    """The pipeline the policy drives, for any backend."""
    conventions = bundle.conventions()
    if backend == "htp":
        try:
            from .htp_backend import ResidentPipeline
        except ImportError as exc:
            raise RuntimeBackendError(f"the htp backend is not available here ({exc})") from None
        return ResidentPipeline.open(bundle, suffixes, conventions=conventions, **options)
    from .pipeline import LocalPipeline

    return LocalPipeline(open_sessions(bundle, backend, suffixes), conventions)


__all__ = [
    "BACKENDS",
    "Geometry",
    "Session",
    "SessionSet",
    "TensorInfo",
    "open_pipeline",
    "open_sessions",
]
