"""ONNX Runtime sessions: the off-device backend (workstations, CI, golden parity)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..bundle.variants import download_hint
from ..errors import BundleError, RuntimeBackendError
from ..util.threads import threads_from_env
from .session import TensorInfo, cast_feeds

_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def _import_ort():
    try:
        import onnxruntime
    except ImportError:
        raise RuntimeBackendError(
            "the onnx backend needs onnxruntime: pip install -e '.[onnx]' in the source "
            "checkout (or pip install onnxruntime)"
        ) from None
    return onnxruntime


def default_providers() -> list[str]:
    """CUDA when the installed onnxruntime has it, CPU always."""
    ort = _import_ort()
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


class OnnxSession:
    """A ``Session`` over one ONNX graph."""

    def __init__(
        self,
        name: str,
        path: Path,
        *,
        providers: Sequence[str] | None = None,
        intra_op_threads: int | None = None,
    ) -> None:
        ort = _import_ort()
        if intra_op_threads is None:
            intra_op_threads = threads_from_env()
        self.name = name
        self.path = Path(path)
        if not self.path.is_file():
            raise BundleError(f"{name}: ONNX graph {self.path} is missing")
        opts = ort.SessionOptions()
        if intra_op_threads:
            opts.intra_op_num_threads = intra_op_threads
        opts.log_severity_level = 3
        try:
            self._sess = ort.InferenceSession(
                str(self.path), sess_options=opts, providers=list(providers or default_providers())
            )
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise BundleError(
                f"{name}: cannot load {self.path} ({exc}); the file is truncated or not an "
                f"ONNX graph: {download_hint(None, 'the bundle')}"
            ) from None
        self.inputs = tuple(_info(a) for a in self._sess.get_inputs())
        self.outputs = tuple(_info(a) for a in self._sess.get_outputs())
        self._output_names = [o.name for o in self.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._sess is None:
            raise RuntimeBackendError(f"{self.name}: session is closed")
        cast = cast_feeds(feeds, self.inputs)
        results = self._sess.run(self._output_names, cast)
        return dict(zip(self._output_names, results, strict=False))

    def close(self) -> None:
        self._sess = None


def _info(arg) -> TensorInfo:
    dtype = _ORT_DTYPES.get(arg.type)
    if dtype is None:
        raise BundleError(f"tensor {arg.name} has unsupported type {arg.type}")
    shape = tuple(d if isinstance(d, int) else -1 for d in arg.shape)
    return TensorInfo(arg.name, shape, dtype)
