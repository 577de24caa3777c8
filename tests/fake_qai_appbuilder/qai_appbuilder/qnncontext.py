"""Fake of ``qai_appbuilder/qnncontext.py`` 2.51.40: same names, signatures and defaults.

Mirrors the Python layer of the wheel: keyword defaults of ``QNNConfig.Config`` (no
``qnn_lib_path``; a positional path ends up as ``runtime`` and raises ``ValueError``), the
``ADSP_LIBRARY_PATH`` default, ``PerfProfile`` Set/Rel being no-ops before ``Config``,
``QNNContext`` with the ten constructor arguments, getters taking ``graph_index``,
``Inference`` flattening the caller's list in place and reshaping outputs to
``getOutputShapes(graphIndex)`` (a failed reshape is only printed), ``release()`` /
``is_released`` / context manager / ``release_all()``, and the fork guard.

Not mirrored: ``QNNContextProc``, ``QNNShareMemory``, ``QNNLoraContext``, Genie, the
``.onnx``/``.tflite`` model routes and the onnxruntime look-alike.
"""

from __future__ import annotations

import os
import threading
import weakref

from . import appbuilder

g_backend_lib_path = "None"
g_system_lib_path = "None"
g_runtime = None

_active_contexts: weakref.WeakSet = weakref.WeakSet()
_active_lock = threading.RLock()


def release_all() -> None:
    """Release every live context (opt-in, like the wheel's)."""
    with _active_lock:
        contexts = list(_active_contexts)
    for ctx in contexts:
        try:
            ctx.release()
        except Exception as exc:
            print(f"[WARN] release_all: failed to release a context: {exc}")


def reshape_input(input):
    for i in range(len(input)):
        try:
            input[i] = input[i].reshape(-1,)
        except (ValueError, TypeError, IndexError, AttributeError) as exc:
            print(f"reshape {input[i]} error:{exc}")
    return input


def reshape_output(output, outputshape_list):
    for i in range(len(output)):
        try:
            output[i] = output[i].reshape(outputshape_list[i])
        except (ValueError, TypeError, IndexError) as exc:
            print(f"reshape {outputshape_list[i]} error:{exc}")
    return output


class LogLevel:
    ERROR = 1
    WARN = 2
    INFO = 3
    VERBOSE = 4
    DEBUG = 5

    @staticmethod
    def SetLogLevel(log_level, log_path):
        appbuilder.set_log_level(log_level, log_path)


class ProfilingLevel:
    OFF = 0
    BASIC = 1
    DETAILED = 2
    INVALID = 3

    @staticmethod
    def SetProfilingLevel(profiling_level):
        appbuilder.set_profiling_level(profiling_level)


class Runtime:
    CPU = "Cpu"
    HTP = "Htp"
    GPU = "Gpu"


class DataType:
    FLOAT = "float"
    NATIVE = "native"


class PerfProfile:
    DEFAULT = "default"
    HIGH_PERFORMANCE = "high_performance"
    BURST = "burst"

    @staticmethod
    def SetPerfProfileGlobal(perf_profile):
        if g_runtime is None or g_runtime == Runtime.GPU:
            return
        try:
            appbuilder.set_perf_profile(perf_profile)
        except Exception as exc:
            print(f"[WARN] Failed to set perf profile: {exc}")

    @staticmethod
    def RelPerfProfileGlobal():
        if g_runtime is None or g_runtime == Runtime.GPU:
            return
        try:
            appbuilder.rel_perf_profile()
        except Exception as exc:
            print(f"[WARN] Failed to release perf profile: {exc}")


class QNNConfig:
    @staticmethod
    def Config(runtime: str = Runtime.HTP, log_level: int = LogLevel.ERROR,
               profiling_level: int = ProfilingLevel.OFF, log_path: str = "None"):
        global g_backend_lib_path, g_system_lib_path, g_runtime
        g_runtime = runtime
        libs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libs")
        adsp = os.environ.get("ADSP_LIBRARY_PATH")
        if adsp is None or len(adsp) < 2:
            os.environ["ADSP_LIBRARY_PATH"] = libs
        name = "QnnGpu" if runtime == Runtime.GPU else "Qnn" + str(runtime)
        g_backend_lib_path = os.path.join(libs, f"lib{name}.so")
        g_system_lib_path = os.path.join(libs, "libQnnSystem.so")
        if not os.path.exists(g_backend_lib_path):
            raise ValueError(f"backend library does not exist: {g_backend_lib_path}")
        if not os.path.exists(g_system_lib_path):
            raise ValueError(f"system library does not exist: {g_system_lib_path}")
        LogLevel.SetLogLevel(log_level, log_path)
        ProfilingLevel.SetProfilingLevel(profiling_level)
        appbuilder._event(f"config ADSP_LIBRARY_PATH={os.environ.get('ADSP_LIBRARY_PATH', '')} "
                          f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}")


class _QNNContextBase:
    def __init__(self):
        self._released = False
        self._creator_pid = os.getpid()

    def _validate_model_path(self):
        if self.model_path == "None":
            raise ValueError("model_path must be specified!")
        if not os.path.exists(self.model_path):
            raise ValueError(f"Model path does not exist: {self.model_path}")

    def _resolve_lib_paths(self, backend_lib_path, system_lib_path):
        if backend_lib_path == "None":
            backend_lib_path = g_backend_lib_path
        if system_lib_path == "None":
            system_lib_path = g_system_lib_path
        return backend_lib_path, system_lib_path

    def _ensure_live(self, op):
        if self._creator_pid is not None and os.getpid() != self._creator_pid:
            raise RuntimeError(
                f"Cannot perform '{op}': this QNN context was created in process "
                f"{self._creator_pid} and inherited via fork() into child process {os.getpid()}."
            )
        if self._released or getattr(self, "m_context", None) is None:
            raise RuntimeError(
                f"Cannot perform '{op}': context '{getattr(self, 'model_name', '<unknown>')}' "
                "has been released."
            )

    def _call_ctx_getter(self, method_name, graph_index=0):
        self._ensure_live(method_name)
        return getattr(self.m_context, method_name)(graph_index)

    def getInputShapes(self, graph_index: int = 0):
        return self._call_ctx_getter("getInputShapes", graph_index)

    def getOutputShapes(self, graph_index: int = 0):
        return self._call_ctx_getter("getOutputShapes", graph_index)

    def getInputDataType(self, graph_index: int = 0):
        return self._call_ctx_getter("getInputDataType", graph_index)

    def getOutputDataType(self, graph_index: int = 0):
        return self._call_ctx_getter("getOutputDataType", graph_index)

    def getGraphName(self, graph_index: int = 0):
        return self._call_ctx_getter("getGraphName", graph_index)

    def getInputName(self, graph_index: int = 0):
        return self._call_ctx_getter("getInputName", graph_index)

    def getOutputName(self, graph_index: int = 0):
        return self._call_ctx_getter("getOutputName", graph_index)

    def getProfilingEvent(self, eventType):
        self._ensure_live("getProfilingEvent")
        return self.m_context.getProfilingEvent(eventType)

    def _inference_and_reshape(self, input, infer_fn, graph_index=0):
        self._ensure_live("Inference")
        input = reshape_input(input)
        output = infer_fn(input)
        return reshape_output(output, self.getOutputShapes(graph_index))

    @property
    def is_released(self) -> bool:
        return self._released or getattr(self, "m_context", None) is None

    def release(self):
        if self._released:
            return
        self._released = True
        m_context = getattr(self, "m_context", None)
        self.m_context = None
        if m_context is not None and os.getpid() == self._creator_pid:
            del m_context
        with _active_lock:
            _active_contexts.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.release()
        return False


class QNNContext(_QNNContextBase):
    def __init__(self, model_name: str = "None", model_path: str = "None",
                 backend_lib_path: str = "None", system_lib_path: str = "None",
                 is_async: bool = False, input_data_type: str = DataType.FLOAT,
                 output_data_type: str = DataType.FLOAT, deviceID: int = 0,
                 coreIdsStr: str = "None", enable_graphs=None) -> None:
        super().__init__()
        self.model_path = model_path
        self.model_name = model_name
        self.input_data_type = input_data_type
        self.output_data_type = output_data_type
        self._validate_model_path()
        backend_lib_path, system_lib_path = self._resolve_lib_paths(
            backend_lib_path, system_lib_path
        )
        self.m_context = appbuilder.QNNContext(
            model_name, model_path, backend_lib_path, system_lib_path, is_async,
            input_data_type, output_data_type, deviceID, coreIdsStr,
            list(enable_graphs) if enable_graphs else [],
        )
        with _active_lock:
            _active_contexts.add(self)

    def Inference(self, input, perf_profile=PerfProfile.DEFAULT, graphIndex=0):
        return self._inference_and_reshape(
            input,
            lambda _in: self.m_context.Inference(
                _in, perf_profile, graphIndex, self.input_data_type, self.output_data_type
            ),
            graph_index=graphIndex,
        )

    def getProviderMode(self):
        return "qnn"

