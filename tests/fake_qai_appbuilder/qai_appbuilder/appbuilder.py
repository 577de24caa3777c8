"""Fake of the pybind extension ``qai_appbuilder.appbuilder`` (the C++ side of 2.51.40).

It keeps the per-process model map (``sg_model_map``) keyed by ``model_name``, loads the
stand-in context files written by ``molmoact2_ros.synth.contexts`` and runs their ONNX graphs
with onnxruntime. Behaviour mirrored from the qai_appbuilder 2.51.40 C++ sources:

* a failed load does not raise: the object exists, its getters return ``""``/``[]``;
* a duplicate ``model_name`` fails to register, and the object then answers for the model
  that already holds that name;
* a missing backend/system library ends the process (``exitWithMessage`` → ``exit(1)``);
* ``Inference`` returns ``[]`` on a wrong input count or a bad graph index, but does **not**
  check input sizes: every input is copied into the tensor's own client buffer for the
  tensor's byte size, so a short buffer leaves stale bytes and a long one is cut (the real
  library reads out of bounds); only the caller's guard protects against that;
* per call, every input is copied into its persistent client buffer and every output is a
  fresh allocation (``STATE["input_copy_bytes"]``, ``STATE["output_alloc_bytes"]`` count them);
* native inputs are only byte-copied (a wrong dtype of the right size gives garbage);
* native outputs are flat and labelled like ``inferOutputNumpyDtype``: by bytes per element
  (int32 → "float32", uint16/ufp16 → "float16"), 1 byte → int8/bool/uint8 and 8 bytes →
  int64/float64/uint64 by the reported type;
* fixed-point tensors (``ufp16``/``ufp8``: ``quant`` in the context header) carry a scale and
  offset (``float = (q + offset) * scale``) that no getter exposes; float mode quantizes
  inputs and dequantizes outputs with them, native mode passes raw codes;
* signed fixed-point I/O (``sfp16``/``sfp8``) fails the load like ``IOTensor::allocateBuffer``
  ("Datatype not supported yet!" → "Setup Input and Output Tensors failure"): the model is
  not registered, so the getters answer empty;
* float mode converts every element on its own, as the library's scalar loops do on Linux
  (``floatToTfN``/``tfNToFloat``/``float32ToFloatN``, no vector path there): the cost per
  call grows with the element count (``STATE["float_elements"]`` counts them);
* ``getProfilingEvent(3)`` (``QNN_PROFILE_EVENTTYPE_EXECUTE``) gives the last graph
  execute's time in microseconds once ``ProfilingLevel`` is BASIC or DETAILED, 0 otherwise;
  the execute time covers the graph only, not the copies and conversions around it;
* ``set_perf_profile`` refuses until a model is initialised in the process, and
  ``rel_perf_profile`` refuses when no vote was set.

Failure injection (for the runtime tests), by graph name, from the environment at call time
or from marker files: ``FAKE_QAI_CRASH``, ``FAKE_QAI_HANG``, ``FAKE_QAI_FAIL_LOAD``,
``FAKE_QAI_FAIL_INFERENCE`` (also ``CRASH_LOAD``, ``HANG_LOAD``, ``CRASH_RELEASE``: during the
context load, or in ``ModelDestroy`` like the known teardown segfault) hold comma-separated
graph names; with ``FAKE_QAI_CONTROL_DIR`` set, a file ``<dir>/<graph>.crash`` (``.hang``,
``.fail_load``, ``.fail_inference``, ``.crash_load``, ...) does the same for already running
workers. A crash is a real SIGSEGV (core dumps disabled). With ``FAKE_QAI_EVENT_LOG`` set,
every load, perf vote/release and context destroy appends a line ``<pid> <time> <event>``
to that file (the runtime tests read the order of events across processes).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

try:  # the real ONNX Runtime, taken before the package replaces sys.modules["onnxruntime"]
    import onnxruntime as _REAL_ONNXRUNTIME
except ImportError:  # pragma: no cover - the fake needs it to run graphs
    _REAL_ONNXRUNTIME = None

MAGIC = b"MOLMOACT2-FAKE-QNN-CONTEXT/1\n"

_MODELS: dict[str, _Engine] = {}
STATE: dict[str, object] = {
    "log_level": 1,
    "profiling_level": 0,
    "perf_profile": None,
    "perf_votes": 0,
    "perf_releases": 0,
    "input_copy_bytes": 0,
    "output_alloc_bytes": 0,
    "float_elements": 0,
}
#: QnnProfile.h QNN_PROFILE_EVENTTYPE_EXECUTE
PROFILE_EVENT_EXECUTE = 3

_ONNX_TO_NATIVE = {
    "tensor(float)": "float", "tensor(float16)": "float16", "tensor(int32)": "int32",
    "tensor(int64)": "int32", "tensor(uint8)": "uint8", "tensor(bool)": "bool_",
}
_NUMPY = {
    "float32": np.float32, "float16": np.float16, "int32": np.int32, "uint8": np.uint8,
    "bool_": np.bool_, "int64": np.int64, "int8": np.int8,
    "ufp16": np.uint16, "ufp8": np.uint8, "sfp16": np.int16, "sfp8": np.int8,
}
_FIXED_POINT = {"ufp16", "ufp8", "sfp16", "sfp8"}
_NO_BUFFER_TYPE = {"sfp16", "sfp8", "sfp4", "sfp32"}  # IOTensor::allocateBuffer has no case
_ONNX_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32,
    "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


def output_label(itemsize: int, reported: str) -> np.dtype:
    """``inferOutputNumpyDtype`` of the pybind layer: the numpy dtype a native output gets."""
    t = reported.lower()
    if itemsize == 4:
        return np.dtype(np.float32)
    if itemsize == 2:
        return np.dtype(np.float16)
    if itemsize == 1:
        return np.dtype(np.int8 if t == "int8" else np.bool_ if t in ("bool", "bool_") else
                        np.uint8)
    by_name = {"float64": np.float64, "int64": np.int64, "uint64": np.uint64}
    return np.dtype(by_name.get(t, np.uint8))


def _log(message: str) -> None:
    print(f"[fake qai_appbuilder] {message}", file=sys.stderr, flush=True)


def _event(text: str) -> None:
    path = os.environ.get("FAKE_QAI_EVENT_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {time.time():.6f} {text}\n")


def set_log_level(log_level: int, log_path: str) -> None:
    STATE["log_level"] = int(log_level)


def set_profiling_level(profiling_level: int) -> None:
    STATE["profiling_level"] = int(profiling_level)


def set_perf_profile(perf_profile: str) -> bool:
    if not _MODELS:
        _log("SetPerfProfileGlobal::initialize one model before set perf profile!")
        return False
    STATE["perf_profile"] = perf_profile
    STATE["perf_votes"] = int(STATE["perf_votes"]) + 1  # type: ignore[call-overload]
    _event(f"perf_set {perf_profile}")
    return True


def rel_perf_profile() -> bool:
    if not _MODELS:
        _log("RelPerfProfileGlobal::initialize one model before release perf profile!")
        return False
    if STATE["perf_profile"] is None:
        _log("RelPerfProfileGlobal::no perf profile was set, nothing to release")
        return False
    STATE["perf_profile"] = None
    STATE["perf_releases"] = int(STATE["perf_releases"]) + 1  # type: ignore[call-overload]
    _event("perf_release")
    return True


def injected(kind: str, graph: str, context: str = "") -> bool:
    """Is failure ``kind`` requested for ``graph``, or for the context file named ``context``
    (its stem, e.g. ``vision_w4a16_socid77_archv73``: one suffix only), by the environment
    or a marker file?"""
    names = {n.strip() for n in os.environ.get(f"FAKE_QAI_{kind.upper()}", "").split(",")}
    if graph in names or (context and context in names):
        return True
    folder = os.environ.get("FAKE_QAI_CONTROL_DIR")
    return bool(folder) and any(
        os.path.exists(os.path.join(folder, f"{name}.{kind}")) for name in (graph, context)
        if name)


class _Tensor:
    def __init__(self, name: str, shape: list[int], onnx_type: str, float_io: str,
                 quant: dict | None = None) -> None:
        self.name = name
        self.shape = shape
        native = _ONNX_TO_NATIVE.get(onnx_type)
        if native is None:
            raise ValueError(f"tensor {name}: ONNX type {onnx_type} has no HTP native type")
        self.dtype = float_io if native == "float" else native
        self.scale, self.offset = 1.0, 0
        if quant is not None and native == "float":
            self.dtype = str(quant["dtype"])
            self.scale, self.offset = float(quant["scale"]), int(quant["offset"])
        self.np_dtype = np.dtype(_NUMPY[self.dtype])
        self.onnx_dtype = np.dtype(_ONNX_NUMPY[onnx_type])
        self.size = int(np.prod(shape, dtype=np.int64))
        self.nbytes = self.size * self.np_dtype.itemsize
        self.client = np.zeros(self.nbytes, np.uint8)  # the persistent QNN client buffer

    @property
    def fixed_point(self) -> bool:
        return self.dtype in _FIXED_POINT

    def quantize(self, values: np.ndarray) -> np.ndarray:
        """``floatToTfN``: codes = round(x / scale - offset), clamped to the type's range."""
        info = np.iinfo(self.np_dtype)
        with np.errstate(invalid="ignore", divide="ignore"):
            codes = np.rint(values.astype(np.float64) / self.scale - self.offset)
        codes = np.nan_to_num(codes, nan=info.min)  # a C cast of NaN is undefined; pick one
        return np.clip(codes, info.min, info.max).astype(self.np_dtype)

    def dequantize(self, codes: np.ndarray) -> np.ndarray:
        """``tfNToFloat``: x = (codes + offset) * scale."""
        return ((codes.astype(np.float64) + self.offset) * self.scale).astype(np.float32)

    def to_native_per_element(self, values: np.ndarray) -> np.ndarray:
        """float32 → the tensor's type, element by element (each value goes through a Python
        float: no vector path, like the library's scalar loop on Linux)."""
        scalars = np.array(values.tolist(), np.float64)  # one element at a time
        STATE["float_elements"] = int(STATE["float_elements"]) + values.size  # type: ignore[call-overload]
        if self.fixed_point:
            return self.quantize(scalars)
        return scalars.astype(self.np_dtype)

    def to_float_per_element(self, native: np.ndarray) -> np.ndarray:
        """The tensor's type → float32, element by element (``convertToFloat``)."""
        scalars = np.array(native.tolist(), np.float64)  # one element at a time
        STATE["float_elements"] = int(STATE["float_elements"]) + native.size  # type: ignore[call-overload]
        if self.fixed_point:
            return ((scalars + self.offset) * self.scale).astype(np.float32)
        return scalars.astype(np.float32)

    def fill(self, data: np.ndarray) -> np.ndarray:
        """memcpy of the tensor's byte size into its client buffer; no size check."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        count = min(raw.size, self.nbytes)
        self.client[:count] = raw[:count]
        STATE["input_copy_bytes"] = int(STATE["input_copy_bytes"]) + self.nbytes  # type: ignore[call-overload]
        return self.client.view(self.np_dtype)


class _Graph:
    def __init__(self, name: str, onnx_bytes: bytes, float_io: str,
                 quant: dict | None = None) -> None:
        ort = _REAL_ONNXRUNTIME

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.name = name
        self.session = ort.InferenceSession(
            onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"]
        )

        quant = quant or {}

        def tensors(args):
            shapes = [[d if isinstance(d, int) else -1 for d in a.shape] for a in args]
            return [_Tensor(a.name, s, a.type, float_io, quant.get(a.name))
                    for a, s in zip(args, shapes)]

        self.inputs = tensors(self.session.get_inputs())
        self.outputs = tensors(self.session.get_outputs())
        if any(t.dtype in _NO_BUFFER_TYPE for t in (*self.inputs, *self.outputs)):
            _log("Datatype not supported yet!")
            _log("Failure in setupTensors, cleaning up resources")
            raise _SetupFailed("Setup Input and Output Tensors failure")
        self.last_execute_us = 0


class _SetupFailed(Exception):
    """``setupInputAndOutputTensors`` failed: the model is not registered."""


class _Engine:
    """What ``QnnInferenceEngine`` holds after ``contextCreateFromBinary``: the graphs."""

    def __init__(self, graphs: list[_Graph], path: str = "") -> None:
        self.graphs = graphs
        self.context = _stem(path)


def _stem(model_path: str) -> str:
    return os.path.splitext(os.path.basename(str(model_path)))[0]


def _load(model_path: str, device_id: int, enable_graphs: list[str]) -> _Engine | None:
    try:
        with open(model_path, "rb") as f:
            data = f.read()
    except OSError as exc:
        _log(f"Failed to read context binary {model_path}: {exc}")
        return None
    if not data.startswith(MAGIC):
        _log(f"Could not create context from binary {model_path}: err 5000 (not a fake context)")
        return None
    header_end = data.index(b"\n", len(MAGIC))
    header = json.loads(data[len(MAGIC) : header_end])
    payload = data[header_end + 1 :]
    if not 0 <= int(device_id) <= 3:
        _log(f"deviceID {device_id} out of range: 0 for NSP; 1,2,3 for HPASS")
        return None
    graphs = []
    for entry in header["graphs"]:
        if enable_graphs and entry["name"] not in enable_graphs:
            continue
        _event(f"load_start {entry['name']}")
        _maybe_fail(entry["name"], "_load", _stem(model_path))
        if injected("fail_load", entry["name"], _stem(model_path)):
            _log(f"Context create from binary failed for {entry['name']}: err 1002 (injected)")
            return None
        onnx_bytes = payload[entry["offset"] : entry["offset"] + entry["size"]]
        try:
            graphs.append(_Graph(entry["name"], onnx_bytes, header.get("float_io", "float16"),
                                 entry.get("quant")))
        except _SetupFailed as exc:
            _log(str(exc))
            return None
        except Exception as exc:
            _log(f"Could not create context from binary {model_path}: {exc}")
            return None
        _event(f"load_end {entry['name']}")
    return _Engine(graphs, model_path) if graphs else None


class QNNContext:
    """The pybind ``QNNContext``: positional arguments exactly as ``qnncontext.py`` passes them."""

    def __init__(self, model_name, model_path, backend_lib_path, system_lib_path, is_async,
                 input_data_type, output_data_type, deviceID, coreIdsStr, enable_graphs) -> None:
        self._name = str(model_name)
        self._owner = False
        for lib in (backend_lib_path, system_lib_path):
            if not os.path.exists(lib):
                _log(f"Unable to load backend/system library {lib}")
                os._exit(1)  # exitWithMessage → std::exit(EXIT_FAILURE)
        if self._name in _MODELS:
            _log(f"ModelInitialize: model name {self._name} already exists, not registered")
            return
        engine = _load(str(model_path), deviceID, list(enable_graphs or []))
        if engine is not None:
            _MODELS[self._name] = engine
            self._owner = True
        self._pid = os.getpid()

    def _graph(self, graph_index: int) -> _Graph | None:
        engine = _MODELS.get(self._name)
        if engine is None:
            return None
        if not 0 <= int(graph_index) < len(engine.graphs):
            _log(f"getOutputShapes: invalid graphIdx: {graph_index}, graphsCount: "
                 f"{len(engine.graphs)}")
            return None
        return engine.graphs[int(graph_index)]

    def getGraphName(self, graph_index: int = 0) -> str:
        graph = self._graph(graph_index)
        return graph.name if graph else ""

    def getInputShapes(self, graph_index: int = 0) -> list[list[int]]:
        graph = self._graph(graph_index)
        return [list(t.shape) for t in graph.inputs if t.shape] if graph else []

    def getOutputShapes(self, graph_index: int = 0) -> list[list[int]]:
        graph = self._graph(graph_index)
        return [list(t.shape) for t in graph.outputs if t.shape] if graph else []

    def getInputDataType(self, graph_index: int = 0) -> list[str]:
        graph = self._graph(graph_index)
        return [t.dtype for t in graph.inputs] if graph else []

    def getOutputDataType(self, graph_index: int = 0) -> list[str]:
        graph = self._graph(graph_index)
        return [t.dtype for t in graph.outputs] if graph else []

    def getInputName(self, graph_index: int = 0) -> list[str]:
        graph = self._graph(graph_index)
        return [t.name for t in graph.inputs] if graph else []

    def getOutputName(self, graph_index: int = 0) -> list[str]:
        graph = self._graph(graph_index)
        return [t.name for t in graph.outputs] if graph else []

    def getProfilingEvent(self, event_type: int) -> int:
        """The value of the first event of this type of the last execute (0 when profiling is
        off, or for types the fake does not produce)."""
        engine = _MODELS.get(self._name)
        if engine is None or int(STATE["profiling_level"]) < 1:  # type: ignore[call-overload]
            return 0
        if int(event_type) == PROFILE_EVENT_EXECUTE:
            return max(g.last_execute_us for g in engine.graphs)
        return 0

    def Inference(self, inputs, perf_profile, graphIndex, input_data_type, output_data_type):
        graph = self._graph(graphIndex)
        if graph is None:
            _log(f"ModelInference: no model {self._name!r} or graph {graphIndex}")
            return []
        context = _MODELS[self._name].context
        _maybe_fail(graph.name, "", context)
        if injected("fail_inference", graph.name, context):
            _log(f"graphExecute failed for {graph.name}: err 1003 (injected)")
            return []
        if len(inputs) != len(graph.inputs):
            _log(f"ModelInference: {graph.name} expects {len(graph.inputs)} inputs, "
                 f"got {len(inputs)}")
            return []
        feeds = {}
        for array, tensor in zip(inputs, graph.inputs):
            if input_data_type == "native":
                raw = tensor.fill(array)
            else:  # copyFromFloatToNative: force-cast to float32, convert per tensor type
                values = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
                raw = tensor.fill(tensor.to_native_per_element(values))
            value = tensor.dequantize(raw) if tensor.fixed_point else raw
            feeds[tensor.name] = value.reshape(tensor.shape).astype(tensor.onnx_dtype)
        start = time.perf_counter()  # graphExecute: what the library's profile event times
        results = graph.session.run([t.name for t in graph.outputs], feeds)
        graph.last_execute_us = int((time.perf_counter() - start) * 1e6)
        outputs = []
        for result, tensor in zip(results, graph.outputs):
            values = np.asarray(result).reshape(-1)
            native = tensor.quantize(values) if tensor.fixed_point else values.astype(
                tensor.np_dtype)
            if output_data_type == "native":
                out = np.empty(tensor.nbytes, np.uint8)  # malloc per output per call
                out[...] = native.view(np.uint8)
                out = out.view(output_label(tensor.np_dtype.itemsize, tensor.dtype))
            else:
                out = tensor.to_float_per_element(native)
            STATE["output_alloc_bytes"] = int(STATE["output_alloc_bytes"]) + out.nbytes  # type: ignore[call-overload]
            outputs.append(out)
        return outputs

    def __del__(self) -> None:
        if getattr(self, "_owner", False) and getattr(self, "_pid", None) == os.getpid():
            engine = _MODELS.pop(self._name, None)  # ModelDestroyEx
            for graph in engine.graphs if engine else ():
                _event(f"destroy {graph.name}")
                _maybe_fail(graph.name, "_release")


def _maybe_fail(graph: str, stage: str = "", context: str = "") -> None:
    """Crash or hang if asked for this graph (or context file) at this stage ("" =
    graphExecute)."""
    if injected("crash" + stage, graph, context):
        _log(f"simulating a segfault in {stage[1:] or 'graphExecute'} of {graph}")
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, ValueError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(5)
        os._exit(139)
    if injected("hang" + stage, graph, context):
        _log(f"simulating a hung {stage[1:] or 'graphExecute'} of {graph}")
        while True:
            time.sleep(3600)
