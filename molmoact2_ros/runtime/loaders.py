"""Session loaders that run inside a worker process: qai_appbuilder (HTP) and null (bench).

The worker code is the same for both; only the loader differs. ``qai_appbuilder`` is imported
here, inside the spawned worker, never in the orchestrator.

Quantized I/O: no getter exposes a fixed-point tensor's scale/offset, so a context of a
quantised suffix (``_w4a16``...) is loaded once, with float I/O: the library quantizes and
dequantizes with its own parameters (per element, on the CPU: the latency table shows what
that costs) and this side exchanges float32 (a fixed-point tensor is declared float32 to the
contract check). The I/O mode is decided before the load because the library fixes it at
load time; loading native, looking, and loading again would run the destroy path between two
loads that the library's notes warn about. Signed fixed-point (``sfixed``) I/O is refused:
the library cannot allocate its buffers (``IOTensor::allocateBuffer``: "Datatype not
supported yet!") and fails the load.
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..bundle.variants import get_variant
from .protocol import SessionSpec, WorkerSpec
from .session import NUMPY_DTYPES, TensorInfo

#: ``getInputDataType()`` strings (QnnSampleApp ``dataTypeToString``) → our dtype names.
QNN_DTYPES = {
    "float16": "float16",
    "float32": "float32",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "bool_": "bool",
    "bool": "bool",
}
#: Fixed-point spellings of ``getInputDataType()`` (QnnSampleApp and QNN enum names).
_FIXED_POINT = re.compile(r"^(qnn_datatype_)?[us](fp|fixed_point_|fixed)(4|8|16|32)$")
_SIGNED_FIXED = re.compile(r"^(qnn_datatype_)?s(fp|fixed_point_|fixed)(4|8|16|32)$")
#: QnnProfile.h ``QNN_PROFILE_EVENTTYPE_EXECUTE``: the graph execute time, in microseconds
QNN_PROFILE_EVENTTYPE_EXECUTE = 3
#: what the library prints when a tensor's data type has no buffer type (sfixed I/O)
UNSUPPORTED_DTYPE_LOG = "Datatype not supported yet!"


def is_fixed_point(qnn_dtype: str) -> bool:
    """True for ufixed/sfixed tensor types (``ufp16``, ``ufixed_point_16``, ...)."""
    return bool(_FIXED_POINT.match(str(qnn_dtype).lower()))


def is_signed_fixed_point(qnn_dtype: str) -> bool:
    """True for sfixed tensor types (``sfp16``, ...), which the library cannot set up."""
    return bool(_SIGNED_FIXED.match(str(qnn_dtype).lower()))


class LoadFailed(Exception):
    """A session did not load or does not look like its contract."""

    def __init__(self, session: str, message: str) -> None:
        super().__init__(message)
        self.session = session


class InferenceFailed(Exception):
    """A session ran but produced nothing usable."""

    def __init__(self, session: str, message: str) -> None:
        super().__init__(message)
        self.session = session


class WorkerSession(Protocol):
    """One loaded graph in a worker: arrays in ``inputs`` order in, ``outputs`` order out."""

    component: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    def infer(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run once; ``arrays`` are C-contiguous, in the declared dtypes."""

    def release(self) -> None:
        """Free the session; idempotent."""


class SessionLoader(Protocol):
    """Process-wide runtime set-up, session loading, perf vote and its release."""

    def load(self, spec: SessionSpec) -> WorkerSession: ...

    def boost(self) -> None: ...

    def shutdown(self) -> None: ...


def make_loader(spec: WorkerSpec) -> SessionLoader:
    if spec.loader == "qnn":
        return QnnLoader(spec)
    if spec.loader == "null":
        return NullLoader(spec)
    raise LoadFailed(spec.worker, f"unknown session loader {spec.loader!r} (qnn, null)")


# -- qai_appbuilder ------------------------------------------------------------------------------
class QnnLoader:
    """``QNNConfig.Config`` once per process, native-I/O ``QNNContext``s, one global perf vote."""

    def __init__(self, spec: WorkerSpec) -> None:
        try:
            # worker process only: the orchestrator never loads the QNN runtime
            qai = importlib.import_module("qai_appbuilder")
        except Exception as exc:  # ImportError, or OSError from its ctypes preloads
            raise LoadFailed(
                spec.components[0],
                f"cannot import qai_appbuilder ({type(exc).__name__}: {exc}); install "
                "qai-appbuilder==2.51.40 on the aarch64 host (pip install qai-appbuilder==2.51.40)",
            ) from None
        self.qai = qai
        self.spec = spec
        self._voted = False
        qai.QNNConfig.Config(
            runtime=qai.Runtime.HTP,
            log_level=getattr(qai.LogLevel, spec.log_level.upper()),
            profiling_level=getattr(qai.ProfilingLevel, spec.profiling.upper()),
        )

    def load(self, spec: SessionSpec) -> QnnSession:
        return QnnSession(self.qai, spec, self.spec)

    def boost(self) -> None:
        perf = self.qai.PerfProfile
        perf.SetPerfProfileGlobal(getattr(perf, self.spec.perf_profile.upper()))
        self._voted = True

    def shutdown(self) -> None:
        if self._voted:
            self._voted = False
            self.qai.PerfProfile.RelPerfProfileGlobal()


class QnnSession:
    """One ``QNNContext``, verified after load (the library never raises).

    I/O is native unless a direction holds fixed-point tensors; that direction is then loaded
    in float mode (see the module docstring). ``infer`` checks every input's dtype and byte
    size first: the library copies the tensor's size from whatever buffer it gets.
    """

    def __init__(self, qai, spec: SessionSpec, worker: WorkerSpec) -> None:
        self.component = spec.component
        self.path = spec.path
        self._qai, self._spec, self._worker = qai, spec, worker
        mode = qai.DataType.FLOAT if spec.float_io else qai.DataType.NATIVE
        self.input_mode = self.output_mode = mode
        self._profiling = worker.profiling.upper() != "OFF"
        #: the last call: wall time of Inference (ms) and the library's execute time (us)
        self.last_inference_ms = 0.0
        self.last_execute_us = 0
        self._ctx = self._open(spec.model_name)  # the only load of this context
        try:
            raw_in, raw_out = self._verify()
            for name, _, t in (*raw_in, *raw_out):
                if is_signed_fixed_point(t):
                    raise LoadFailed(self.component, _sfixed_message(self.path, name, t))
            fixed = [(name, t) for name, _, t in (*raw_in, *raw_out) if is_fixed_point(t)]
            if fixed and not spec.float_io:
                raise LoadFailed(
                    self.component,
                    f"{self.path} has fixed-point I/O ({', '.join(f'{n}: {t}' for n, t in fixed)})"
                    " but was loaded with native I/O, whose scale and offset no getter exposes; "
                    "load it as a quantised set (a context suffix such as '_w4a16'), which "
                    "uses float I/O",
                )
            self.fixed_point = tuple(name for name, _ in fixed)
            self.inputs = _tensor_infos(self.component, "input", raw_in)
            self.outputs = _tensor_infos(self.component, "output", raw_out)
        except Exception:
            self.release()
            raise
        native = self.input_mode == qai.DataType.NATIVE
        #: what Inference gets: the declared dtype natively, float32 in float mode
        self._wire = [
            (np.dtype(NUMPY_DTYPES[i.dtype]) if native else np.dtype(np.float32),
             int(np.prod(i.shape, dtype=np.int64)))
            for i in self.inputs
        ]
        self._host = [np.dtype(NUMPY_DTYPES[i.dtype]) for i in self.inputs]
        self._out_dtypes = [np.dtype(NUMPY_DTYPES[o.dtype]) for o in self.outputs]
        #: elements the library converts to or from float32 on every call (float I/O only)
        self.float_elements = (
            sum(int(np.prod(i.shape, dtype=np.int64)) for i in self.inputs)
            + sum(int(np.prod(o.shape, dtype=np.int64)) for o in self.outputs)
        ) if spec.float_io else 0

    def _open(self, model_name: str):
        qai = self._qai
        return qai.QNNContext(
            model_name=model_name,
            model_path=self._spec.path,
            input_data_type=self.input_mode,
            output_data_type=self.output_mode,
            deviceID=self._worker.device_id,
        )

    def _verify(self) -> tuple[list, list]:
        """(name, shape, QNN dtype) of every input and output, after checking the load."""
        ctx, name = self._ctx, self.component
        graph = ctx.getGraphName(0)
        if not graph:
            raise LoadFailed(
                name,
                f"{self.path} did not load: the context reports no graph (qai_appbuilder "
                "logs the QNN error but does not raise). Usual causes: the binary was built "
                "with a newer QAIRT than the runtime in the wheel, for another SoC/arch, or "
                "the DSP ran out of memory; a QNN log line 'Datatype not supported yet!' means a "
                "tensor has signed fixed-point (sfixed) I/O, which the library cannot set up: "
                "re-export with ufixed or float I/O; run `molmoact2 doctor` and check the QNN log",
            )
        if graph != name:
            raise LoadFailed(
                name,
                f"{self.path} holds graph {graph!r}, not {name!r}; the file is misnamed or "
                "belongs to another component",
            )
        return (
            _raw_tensors(name, "input", ctx.getInputName(0), ctx.getInputShapes(0),
                         ctx.getInputDataType(0)),
            _raw_tensors(name, "output", ctx.getOutputName(0), ctx.getOutputShapes(0),
                         ctx.getOutputDataType(0)),
        )

    def check_inputs(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The project's guard: count, dtype and byte size of every input (float I/O: cast)."""
        if len(arrays) != len(self.inputs):
            raise InferenceFailed(
                self.component, f"got {len(arrays)} inputs, the graph has {len(self.inputs)}"
            )
        checked = []
        for array, info, host, (wire, size) in zip(arrays, self.inputs, self._host, self._wire):
            array = np.asarray(array)
            if array.dtype != host or array.size != size:
                raise InferenceFailed(
                    self.component,
                    f"input {info.name} is {array.dtype}[{array.size} elements, {array.nbytes} "
                    f"bytes] but the loaded graph takes {info.describe()} ({size * host.itemsize}"
                    " bytes); refused before Inference, which would read out of bounds",
                )
            checked.append(array if wire == host else array.astype(wire))
        return checked

    def infer(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        # Inference mutates the list it gets (items become flattened views): pass a fresh one.
        checked = self.check_inputs(arrays)
        start = time.perf_counter()
        out = self._ctx.Inference(checked)
        self.last_inference_ms = (time.perf_counter() - start) * 1e3
        if self._profiling:
            self.last_execute_us = int(self._ctx.getProfilingEvent(QNN_PROFILE_EVENTTYPE_EXECUTE))
        if not out:
            raise InferenceFailed(
                self.component,
                "Inference returned no outputs (qai_appbuilder reports failed inferences only "
                "in its log: wrong input count or size, or a DSP error)",
            )
        if len(out) != len(self.outputs):
            raise InferenceFailed(
                self.component,
                f"Inference returned {len(out)} outputs, expected {len(self.outputs)}",
            )
        if self.output_mode != self._qai.DataType.NATIVE:
            results = [
                np.asarray(arr, np.float32).reshape(info.shape).astype(dtype, copy=False)
                for arr, info, dtype in zip(out, self.outputs, self._out_dtypes)
            ]
            if self.fixed_point:
                self._check_finite(results)
            return results
        return [
            _native_output(self.component, arr, info, dtype)
            for arr, info, dtype in zip(out, self.outputs, self._out_dtypes)
        ]

    def _check_finite(self, results: list[np.ndarray]) -> None:
        """A fixed-point session's float outputs come from the library's dequantisation with
        a scale nobody can see: a NaN or infinite value (a broken scale) fails the call
        instead of turning into a finite wrong chunk downstream."""
        for arr, info in zip(results, self.outputs):
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
                raise InferenceFailed(
                    self.component,
                    f"output {info.name} has {bad} non-finite values out of {arr.size} (a "
                    "fixed-point session: the library's dequantisation scale or offset is "
                    "broken); the call counts as failed",
                )

    def release(self) -> None:
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx is not None:
            ctx.release()


def _raw_tensors(
    component: str, kind: str, names: Sequence[str], shapes: Sequence, dtypes: Sequence[str]
) -> list[tuple[str, tuple[int, ...], str]]:
    if not names or not (len(names) == len(shapes) == len(dtypes)):
        raise LoadFailed(
            component,
            f"the context reports {len(names)} {kind} names, {len(shapes)} shapes and "
            f"{len(dtypes)} dtypes; it did not load completely (rank-0 tensors are not supported)",
        )
    return [
        (str(n), tuple(int(d) for d in shape), str(t)) for n, shape, t in zip(names, shapes, dtypes)
    ]


def _sfixed_message(path: str, tensor: str, qnn_dtype: str) -> str:
    return (f"{path}: tensor {tensor} is {qnn_dtype}, signed fixed-point I/O, which "
            "qai_appbuilder cannot set up (no buffer type for sfixed; the load fails with "
            "'Datatype not supported yet!'); re-export the context with ufixed or float I/O")


def _tensor_infos(
    component: str, kind: str, raw: Sequence[tuple[str, tuple[int, ...], str]]
) -> tuple[TensorInfo, ...]:
    """TensorInfos as this side sees them: a fixed-point tensor is float32 (float I/O)."""
    infos = []
    for name, shape, qnn_dtype in raw:
        dtype = "float32" if is_fixed_point(qnn_dtype) else QNN_DTYPES.get(qnn_dtype)
        if dtype is None:
            raise LoadFailed(component, f"{kind} {name} has dtype {qnn_dtype}: unsupported")
        infos.append(TensorInfo(name, shape, dtype))
    return tuple(infos)


def _native_output(
    component: str, arr: np.ndarray, info: TensorInfo, dtype: np.dtype
) -> np.ndarray:
    """Re-view a native output by its declared dtype (int32 comes back labelled float32)."""
    if arr.dtype != dtype:
        if arr.dtype.itemsize != dtype.itemsize:
            raise InferenceFailed(
                component, f"output {info.name} came back as {arr.dtype}, declared {info.dtype}"
            )
        arr = arr.view(dtype)
    size = int(np.prod(info.shape, dtype=np.int64))
    if arr.size != size:
        raise InferenceFailed(
            component, f"output {info.name} has {arr.size} elements, {info.describe()} declared"
        )
    return arr.reshape(info.shape)


# -- null (host-overhead benchmark) -------------------------------------------------------------
class NullLoader:
    """No compute: outputs of the real tensor sizes, fp16 like the HTP, preallocated."""

    def __init__(self, spec: WorkerSpec) -> None:
        from .null_backend import null_sessions

        self._sessions = null_sessions(
            get_variant(spec.variant),
            euler_in_graph=spec.conventions.euler_in_graph,
            dtype="float16",
        )

    def load(self, spec: SessionSpec) -> NullWorkerSession:
        return NullWorkerSession(self._sessions[spec.component])

    def boost(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class NullWorkerSession:
    """A ``NullSession`` behind the worker interface, copying like qai_appbuilder does.

    Per call the library copies every input into its tensor's client buffer and returns every
    output in a fresh allocation; the benchmark counts both.
    """

    def __init__(self, session) -> None:
        self.component = session.name
        self.inputs = session.inputs
        self.outputs = session.outputs
        self._clients = [
            np.empty(int(np.prod(i.shape, dtype=np.int64)) * np.dtype(NUMPY_DTYPES[i.dtype])
                     .itemsize, np.uint8)
            for i in self.inputs
        ]
        self._out = [
            np.zeros(o.shape, NUMPY_DTYPES[o.dtype]) for o in self.outputs
        ]

    def infer(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise InferenceFailed(self.component, f"got {len(arrays)} inputs")
        for client, array in zip(self._clients, arrays):
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            client[: raw.size] = raw[: client.size]  # memcpy into the client buffer
        return [out.copy() for out in self._out]  # malloc + memcpy of every output

    def release(self) -> None:
        self._out = []
        self._clients = []
