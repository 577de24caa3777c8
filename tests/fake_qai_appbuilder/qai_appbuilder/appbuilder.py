"""Fake of the pybind extension ``qai_appbuilder.appbuilder`` (the C++ side of 2.51.40).

It keeps the per-process model map (``sg_model_map``) keyed by ``model_name``, loads the
stand-in context files written by ``molmoact2_ros.synth.contexts`` and runs their ONNX graphs
with onnxruntime. Behaviour mirrored from the qai_appbuilder 2.51.40 C++ sources:

* a failed load does not raise: the object exists, its getters return ``""``/``[]``;
* a duplicate ``model_name`` fails to register, and the object then answers for the model
  that already holds that name;
* a missing backend/system library ends the process (``exitWithMessage`` → ``exit(1)``);
* ``Inference`` returns ``[]`` on a wrong input count, a wrong byte size or a bad graph index;
* native inputs are only byte-copied (a wrong dtype of the right size gives garbage);
* native outputs are flat and labelled by bytes per element (int32 → "float32", ...);
* float mode casts inputs to float32 and outputs back to float32;
* ``set_perf_profile`` refuses until a model is initialised in the process.

Failure injection (for the runtime tests), by graph name, from the environment at call time
or from marker files: ``FAKE_QAI_CRASH``, ``FAKE_QAI_HANG``, ``FAKE_QAI_FAIL_LOAD``,
``FAKE_QAI_FAIL_INFERENCE`` hold comma-separated graph names; with ``FAKE_QAI_CONTROL_DIR``
set, a file ``<dir>/<graph>.crash`` (``.hang``, ``.fail_load``, ``.fail_inference``) does
the same for already running workers. A crash is a real SIGSEGV (core dumps disabled).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

MAGIC = b"MOLMOACT2-FAKE-QNN-CONTEXT/1\n"

_MODELS: dict[str, _Engine] = {}
STATE: dict[str, object] = {
    "log_level": 1,
    "profiling_level": 0,
    "perf_profile": None,
    "perf_votes": 0,
    "perf_releases": 0,
}

_ONNX_TO_NATIVE = {
    "tensor(float)": "float", "tensor(float16)": "float16", "tensor(int32)": "int32",
    "tensor(int64)": "int32", "tensor(uint8)": "uint8", "tensor(bool)": "bool_",
}
_NUMPY = {
    "float32": np.float32, "float16": np.float16, "int32": np.int32, "uint8": np.uint8,
    "bool_": np.bool_,
}
_ONNX_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32,
    "tensor(int64)": np.int64, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}
_LABEL_BY_ITEMSIZE = {4: np.float32, 2: np.float16, 1: np.uint8, 8: np.float64}


def _log(message: str) -> None:
    print(f"[fake qai_appbuilder] {message}", file=sys.stderr, flush=True)


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
    return True


def rel_perf_profile() -> bool:
    if not _MODELS:
        _log("RelPerfProfileGlobal::initialize one model before release perf profile!")
        return False
    STATE["perf_profile"] = None
    STATE["perf_releases"] = int(STATE["perf_releases"]) + 1  # type: ignore[call-overload]
    return True


def injected(kind: str, graph: str) -> bool:
    """Is failure ``kind`` requested for ``graph`` (environment or marker file)?"""
    names = os.environ.get(f"FAKE_QAI_{kind.upper()}", "")
    if graph in {n.strip() for n in names.split(",") if n.strip()}:
        return True
    folder = os.environ.get("FAKE_QAI_CONTROL_DIR")
    return bool(folder) and os.path.exists(os.path.join(folder, f"{graph}.{kind}"))


class _Tensor:
    def __init__(self, name: str, shape: list[int], onnx_type: str, float_io: str) -> None:
        self.name = name
        self.shape = shape
        native = _ONNX_TO_NATIVE.get(onnx_type)
        if native is None:
            raise ValueError(f"tensor {name}: ONNX type {onnx_type} has no HTP native type")
        self.dtype = float_io if native == "float" else native
        self.np_dtype = np.dtype(_NUMPY[self.dtype])
        self.onnx_dtype = np.dtype(_ONNX_NUMPY[onnx_type])
        self.size = int(np.prod(shape, dtype=np.int64))
        self.nbytes = self.size * self.np_dtype.itemsize


class _Graph:
    def __init__(self, name: str, onnx_bytes: bytes, float_io: str) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.name = name
        self.session = ort.InferenceSession(
            onnx_bytes, sess_options=options, providers=["CPUExecutionProvider"]
        )

        def tensors(args):
            shapes = [[d if isinstance(d, int) else -1 for d in a.shape] for a in args]
            return [_Tensor(a.name, s, a.type, float_io) for a, s in zip(args, shapes)]

        self.inputs = tensors(self.session.get_inputs())
        self.outputs = tensors(self.session.get_outputs())


class _Engine:
    """What ``QnnInferenceEngine`` holds after ``contextCreateFromBinary``: the graphs."""

    def __init__(self, graphs: list[_Graph]) -> None:
        self.graphs = graphs


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
        if injected("fail_load", entry["name"]):
            _log(f"Context create from binary failed for {entry['name']}: err 1002 (injected)")
            return None
        onnx_bytes = payload[entry["offset"] : entry["offset"] + entry["size"]]
        try:
            graphs.append(_Graph(entry["name"], onnx_bytes, header.get("float_io", "float16")))
        except Exception as exc:
            _log(f"Could not create context from binary {model_path}: {exc}")
            return None
    return _Engine(graphs) if graphs else None


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
        return 0

    def Inference(self, inputs, perf_profile, graphIndex, input_data_type, output_data_type):
        graph = self._graph(graphIndex)
        if graph is None:
            _log(f"ModelInference: no model {self._name!r} or graph {graphIndex}")
            return []
        _maybe_fail(graph.name)
        if injected("fail_inference", graph.name):
            _log(f"graphExecute failed for {graph.name}: err 1003 (injected)")
            return []
        if len(inputs) != len(graph.inputs):
            _log(f"ModelInference: {graph.name} expects {len(graph.inputs)} inputs, "
                 f"got {len(inputs)}")
            return []
        feeds = {}
        for array, tensor in zip(inputs, graph.inputs):
            if input_data_type == "native":
                array = np.ascontiguousarray(array).reshape(-1)
                if array.nbytes != tensor.nbytes:
                    _log(f"input {tensor.name}: {array.nbytes} bytes, the tensor has "
                         f"{tensor.nbytes}")
                    return []
                raw = array.view(np.uint8).view(tensor.np_dtype)
            else:
                array = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
                if array.size != tensor.size:
                    _log(f"input {tensor.name}: {array.size} elements, expected {tensor.size}")
                    return []
                raw = array.astype(tensor.np_dtype)
            feeds[tensor.name] = raw.reshape(tensor.shape).astype(tensor.onnx_dtype)
        results = graph.session.run([t.name for t in graph.outputs], feeds)
        outputs = []
        for result, tensor in zip(results, graph.outputs):
            native = np.ascontiguousarray(np.asarray(result).astype(tensor.np_dtype)).reshape(-1)
            if output_data_type == "native":
                label = _LABEL_BY_ITEMSIZE[native.dtype.itemsize]
                outputs.append(native.view(label) if native.dtype != label else native)
            else:
                outputs.append(native.astype(np.float32))
        return outputs

    def __del__(self) -> None:
        if getattr(self, "_owner", False) and getattr(self, "_pid", None) == os.getpid():
            _MODELS.pop(self._name, None)  # ModelDestroyEx


def _maybe_fail(graph: str) -> None:
    if injected("crash", graph):
        _log(f"simulating a segfault in graphExecute of {graph}")
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, ValueError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(5)
        os._exit(139)
    if injected("hang", graph):
        _log(f"simulating a hung graphExecute of {graph}")
        while True:
            time.sleep(3600)
