"""The fake qai_appbuilder reproduces the 2.51.40 quirks the worker code depends on."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from htp_helpers import FAKE_PATH

from molmoact2_ros.synth.contexts import fake_context_bytes

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _graph_bytes() -> bytes:
    """x float32[2,3] → z = 2x;  y int32[4] → w = y + 1."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Mul", ["x", "two"], ["z"]),
        helper.make_node("Add", ["y", "one"], ["w"]),
    ]
    graph = helper.make_graph(
        nodes,
        "quirks",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("y", TensorProto.INT32, [4]),
        ],
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("w", TensorProto.INT32, [4]),
        ],
        [
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(1, np.int32), "one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def qai():
    """The fake, imported in this test process only (the package never imports it here)."""
    sys.path.insert(0, str(FAKE_PATH))
    adsp = os.environ.get("ADSP_LIBRARY_PATH")  # Config sets it, like the real one
    ld_path = os.environ.get("LD_LIBRARY_PATH")  # the import prepends its folder
    ort = sys.modules.get("onnxruntime")  # the import replaces it with its look-alike
    try:
        import qai_appbuilder

        qai_appbuilder.QNNConfig.Config(runtime=qai_appbuilder.Runtime.HTP)
        yield qai_appbuilder
        qai_appbuilder.release_all()
    finally:
        sys.path.remove(str(FAKE_PATH))
        if adsp is None:
            os.environ.pop("ADSP_LIBRARY_PATH", None)
        else:
            os.environ["ADSP_LIBRARY_PATH"] = adsp
        for name in [m for m in sys.modules if m.split(".")[0] == "qai_appbuilder"]:
            del sys.modules[name]
        if ort is None:
            sys.modules.pop("onnxruntime", None)
        else:
            sys.modules["onnxruntime"] = ort
        if ld_path is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = ld_path


@pytest.fixture(scope="module")
def ctx_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fake-ctx") / "quirks_socid77_archv73.bin"
    path.write_bytes(fake_context_bytes("quirks", _graph_bytes()))
    return path


def _native(qai, path, name):
    return qai.QNNContext(
        model_name=name,
        model_path=str(path),
        input_data_type=qai.DataType.NATIVE,
        output_data_type=qai.DataType.NATIVE,
    )


def test_mirrors_the_public_api(qai):
    assert qai.__version__ == "2.51.40"
    assert (qai.Runtime.HTP, qai.DataType.NATIVE) == ("Htp", "native")
    assert qai.PerfProfile.BURST == "burst"
    assert (qai.LogLevel.ERROR, qai.ProfilingLevel.OFF) == (1, 0)
    with pytest.raises(ValueError, match="backend library does not exist"):
        qai.QNNConfig.Config("/opt/qnn/lib", qai.Runtime.HTP)  # the positional pitfall
    qai.QNNConfig.Config(runtime=qai.Runtime.HTP)


def test_native_io_and_getters(qai, ctx_path):
    with _native(qai, ctx_path, "getters") as ctx:
        assert ctx.getGraphName() == "quirks"
        assert ctx.getInputName() == ["x", "y"] and ctx.getOutputName(0) == ["z", "w"]
        assert ctx.getInputShapes() == [[2, 3], [4]]
        assert ctx.getInputDataType() == ["float16", "int32"]
        assert ctx.getOutputDataType() == ["float16", "int32"]
        x = np.arange(6, dtype=np.float16).reshape(2, 3)
        y = np.arange(4, dtype=np.int32)
        inputs = [x, y]
        z, w = ctx.Inference(inputs)
        assert inputs[0].shape == (6,) and np.shares_memory(inputs[0], x)  # mutated in place
        assert z.dtype == np.float16 and z.shape == (2, 3)
        np.testing.assert_array_equal(z, 2 * x)
        assert w.dtype == np.float32  # int32 output labelled float32 by bytes per element
        np.testing.assert_array_equal(w.view(np.int32), y + 1)
        assert ctx.getGraphName(1) == ""  # no such graph index


def test_failures_do_not_raise(qai, ctx_path, tmp_path):
    garbage = tmp_path / "broken_socid77_archv73.bin"
    garbage.write_bytes(b"\0" * 8192)
    ctx = _native(qai, garbage, "broken")
    assert ctx.getGraphName() == "" and ctx.getInputShapes() == []
    assert ctx.Inference([np.zeros(6, np.float16)]) == []
    ctx.release()
    with _native(qai, ctx_path, "wrong-input") as good:
        assert good.Inference([np.zeros(6, np.float16)]) == []  # wrong count


def test_no_size_check_per_call_copies_and_fresh_outputs(qai, ctx_path):
    """Like the real library: a wrong-sized input is not refused, inputs are copied into the
    tensor's client buffer on every call and every output is a new allocation."""
    from qai_appbuilder import appbuilder

    with _native(qai, ctx_path, "copies") as ctx:
        x = np.full(6, 3, np.float16)
        copied = appbuilder.STATE["input_copy_bytes"]
        first = ctx.Inference([x, np.zeros(4, np.int32)])
        assert appbuilder.STATE["input_copy_bytes"] - copied == 6 * 2 + 4 * 4
        second = ctx.Inference([x, np.zeros(4, np.int32)])
        assert not np.shares_memory(first[0], second[0])
        assert not np.shares_memory(first[0], x)
        short = ctx.Inference([np.ones(2, np.float16), np.zeros(4, np.int32)])
        # 2 fresh values, the other 4 are whatever the client buffer held (the previous call)
        np.testing.assert_array_equal(short[0].reshape(-1), [2, 2, 6, 6, 6, 6])


def test_output_labels_follow_the_pybind_rules(qai):
    from qai_appbuilder.appbuilder import output_label

    assert output_label(8, "int64") == np.int64 and output_label(1, "bool_") == np.bool_
    assert output_label(4, "int32") == np.float32 and output_label(2, "ufp16") == np.float16
    assert output_label(1, "int8") == np.int8 and output_label(1, "uint8") == np.uint8


def test_import_replaces_onnxruntime_and_extends_ld_library_path(qai):
    assert getattr(sys.modules["onnxruntime"], "QAI_APPBUILDER_ONNXWRAPPER", False)
    assert os.environ["LD_LIBRARY_PATH"].split(os.pathsep)[0] == os.path.dirname(qai.__file__)


def test_float_mode_and_duplicate_names(qai, ctx_path, tmp_path):
    with qai.QNNContext(model_name="floaty", model_path=str(ctx_path)) as ctx:
        z, w = ctx.Inference([np.ones((2, 3)), np.arange(4)])
        assert z.dtype == np.float32 and w.dtype == np.float32
        np.testing.assert_array_equal(w, np.arange(4) + 1)
        other = tmp_path / "other_socid77_archv73.bin"
        other.write_bytes(fake_context_bytes("other", _graph_bytes()))
        twin = _native(qai, other, "floaty")  # the name is taken: it answers for "quirks"
        assert twin.getGraphName() == "quirks"
        twin.release()


def test_release_and_perf_vote(qai, ctx_path):
    from qai_appbuilder import appbuilder

    ctx = _native(qai, ctx_path, "released")
    votes, releases = appbuilder.STATE["perf_votes"], appbuilder.STATE["perf_releases"]
    assert appbuilder.rel_perf_profile() is False  # nothing set yet: refused
    qai.PerfProfile.SetPerfProfileGlobal(qai.PerfProfile.BURST)
    assert appbuilder.STATE["perf_votes"] == votes + 1
    qai.PerfProfile.RelPerfProfileGlobal()
    assert appbuilder.STATE["perf_releases"] == releases + 1
    ctx.release()
    ctx.release()
    assert ctx.is_released
    with pytest.raises(RuntimeError, match="released"):
        ctx.getGraphName()


def test_missing_backend_library_exits_the_process(ctx_path):
    code = (
        "import qai_appbuilder as q\n"
        f"q.QNNContext(model_name='m', model_path={str(ctx_path)!r},"
        " backend_lib_path='/nonexistent/libQnnHtp.so', system_lib_path='/nonexistent/x.so')\n"
        "print('survived')\n"
    )
    env_path = f"{FAKE_PATH}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1 and "survived" not in result.stdout


def test_worker_loader_verifies_the_load(qai, ctx_path, tmp_path):
    """QnnSession (runs in workers) refuses empty loads and wrong graph names, re-views int32."""
    from molmoact2_ros.bundle.conventions import Conventions
    from molmoact2_ros.runtime.loaders import LoadFailed, QnnLoader
    from molmoact2_ros.runtime.protocol import SessionSpec, WorkerSpec

    spec = WorkerSpec("vision", (), "grid_sampler", Conventions())
    loader = QnnLoader(spec)
    garbage = tmp_path / "vision_socid77_archv73.bin"
    garbage.write_bytes(b"\0" * 8192)
    with pytest.raises(LoadFailed, match="did not load"):
        loader.load(SessionSpec("vision", str(garbage), "v-empty"))
    with pytest.raises(LoadFailed, match="holds graph 'quirks'"):
        loader.load(SessionSpec("vision", str(ctx_path), "v-wrong"))
    session = loader.load(SessionSpec("quirks", str(ctx_path), "q-ok"))
    z, w = session.infer([np.ones((2, 3), np.float16), np.arange(4, dtype=np.int32)])
    assert w.dtype == np.int32 and list(w) == [1, 2, 3, 4]
    loader.boost()
    loader.shutdown()
    session.release()


@pytest.fixture(scope="module")
def quant_ctx_path(tmp_path_factory):
    """The quirks graph with ufp16 x and z (scale 1/1000, zero at code 20000)."""
    from molmoact2_ros.synth.contexts import ufp16_params

    quant = {"x": ufp16_params(-20.0, 45.535), "z": ufp16_params(-40.0, 91.07)}
    path = tmp_path_factory.mktemp("fake-ctx") / "quirks_w4a16_socid77_archv73.bin"
    path.write_bytes(fake_context_bytes("quirks", _graph_bytes(), quant=quant))
    return path


def test_quantized_io_travels_as_raw_codes_natively(qai, quant_ctx_path):
    with _native(qai, quant_ctx_path, "raw-codes") as ctx:
        assert ctx.getInputDataType() == ["ufp16", "int32"]
        assert ctx.getOutputDataType() == ["ufp16", "int32"]
        codes = np.full(6, 20000 + 1500, np.uint16)  # 1.5 with offset -20000, scale 1e-3
        z, _ = ctx.Inference([codes, np.zeros(4, np.int32)])
        assert z.dtype == np.float16  # ufp16 codes come back labelled float16
        z_codes = z.view(np.uint16).astype(np.int64)
        np.testing.assert_allclose((z_codes + ufp16_offset(-40.0, 91.07)) * (131.07 / 65535),
                                   3.0, atol=2e-3)


def ufp16_offset(low: float, high: float) -> int:
    from molmoact2_ros.synth.contexts import ufp16_params

    return ufp16_params(low, high)["offset"]


def test_worker_loads_quantized_io_in_float_mode(qai, quant_ctx_path):
    """Fixed-point I/O: loaded once with float I/O, declared float32, values dequantized;
    the same context loaded native is refused (its scale and offset are not exposed)."""
    from molmoact2_ros.bundle.conventions import Conventions
    from molmoact2_ros.runtime.loaders import LoadFailed, QnnLoader
    from molmoact2_ros.runtime.protocol import SessionSpec, WorkerSpec

    loader = QnnLoader(WorkerSpec("quirks", (), "grid_sampler", Conventions()))
    with pytest.raises(LoadFailed, match=r"has fixed-point I/O \(x: ufp16, z: ufp16\) but "
                       "was loaded with native I/O"):
        loader.load(SessionSpec("quirks", str(quant_ctx_path), "q-native"))
    session = loader.load(SessionSpec("quirks", str(quant_ctx_path), "q-quant", float_io=True))
    try:
        assert (session.input_mode, session.output_mode) == ("float", "float")
        assert session.fixed_point == ("x", "z")
        assert [i.dtype for i in session.inputs] == ["float32", "int32"]
        assert [o.dtype for o in session.outputs] == ["float32", "int32"]
        x = np.linspace(-3, 7, 6, dtype=np.float32).reshape(2, 3)
        z, w = session.infer([x, np.arange(4, dtype=np.int32)])
        np.testing.assert_allclose(z, 2 * x, atol=2e-3)  # 16-bit codes, not fp16 garbage
        assert w.dtype == np.int32 and list(w) == [1, 2, 3, 4]
    finally:
        session.release()


def test_wrong_sized_input_is_refused_by_the_worker_guard(qai, ctx_path):
    """The fake (like the library) would run a short buffer; the worker's guard refuses it."""
    from molmoact2_ros.bundle.conventions import Conventions
    from molmoact2_ros.runtime.loaders import InferenceFailed, QnnLoader
    from molmoact2_ros.runtime.protocol import SessionSpec, WorkerSpec

    loader = QnnLoader(WorkerSpec("quirks", (), "grid_sampler", Conventions()))
    session = loader.load(SessionSpec("quirks", str(ctx_path), "q-guard"))
    try:
        short = [np.ones(5, np.float16), np.arange(4, dtype=np.int32)]
        assert len(session._ctx.Inference(list(short))) == 2  # the fake runs it regardless
        with pytest.raises(InferenceFailed, match=r"input x is float16\[5 elements, 10 bytes\]"
                           r" but the loaded graph takes x\[2,3\] float16 \(12 bytes\)"):
            session.infer(short)
        with pytest.raises(InferenceFailed, match="input y is int64"):
            session.infer([np.ones((2, 3), np.float16), np.arange(4, dtype=np.int64)])
        with pytest.raises(InferenceFailed, match="got 1 inputs, the graph has 2"):
            session.infer([np.ones((2, 3), np.float16)])
    finally:
        session.release()


_ORCHESTRATOR_IMPORTS = """
import sys
import numpy as np
from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.policy import Policy
from molmoact2_ros.runtime.htp_backend import ResidentPipeline
root = sys.argv[1]
with Policy.load(root, backend="onnx") as onnx_policy:  # needs ONNX Runtime in this process
    pass
with ResidentPipeline.open(Bundle.open(root), call_timeout_s=60) as pipe:  # fake in workers
    pipe.run_vision()
import onnxruntime
print("qai_appbuilder" in sys.modules, hasattr(onnxruntime, "QAI_APPBUILDER_ONNXWRAPPER"),
      hasattr(onnxruntime, "InferenceSession"))
"""


def test_no_process_that_needs_onnxruntime_imports_qai_appbuilder(tiny_root):
    """The library replaces sys.modules["onnxruntime"] on import: the orchestrator (which runs
    the ONNX backend) must never import it, only the spawned HTP workers do."""
    from htp_helpers import REPO, ensure_contexts

    ensure_contexts(tiny_root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE_PATH), str(REPO)])}
    result = subprocess.run(
        [sys.executable, "-c", _ORCHESTRATOR_IMPORTS, str(tiny_root / "lp_vtp_sd")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False", "True"]


def _quirks_with(tmp_path, name, quant):
    path = tmp_path / f"{name}_w4a16_socid77_archv73.bin"
    path.write_bytes(fake_context_bytes("quirks", _graph_bytes(), quant=quant))
    return path


def test_sfixed_io_fails_the_load_and_the_loader_says_why(qai, tmp_path, capfd):
    """The library has no buffer type for signed fixed-point I/O: setupTensors fails, the
    model is not registered (no exception, empty getters); the loader refuses naming sfixed."""
    from molmoact2_ros.bundle.conventions import Conventions
    from molmoact2_ros.runtime.loaders import LoadFailed, QnnLoader
    from molmoact2_ros.runtime.protocol import SessionSpec, WorkerSpec

    quant = {"x": {"dtype": "sfp16", "scale": 1e-3, "offset": 0}}
    path = _quirks_with(tmp_path, "signed", quant)
    with _native(qai, path, "sfixed") as ctx:
        assert ctx.getGraphName() == "" and ctx.getInputName() == []
    assert "Datatype not supported yet!" in capfd.readouterr().err
    loader = QnnLoader(WorkerSpec("quirks", (), "grid_sampler", Conventions()))
    with pytest.raises(LoadFailed, match="Datatype not supported yet!' means a tensor has "
                       r"signed fixed-point \(sfixed\) I/O"):
        loader.load(SessionSpec("quirks", str(path), "q-sfixed", float_io=True))


def test_non_finite_output_of_a_fixed_point_session_fails_the_call(qai, tmp_path):
    """A broken output scale dequantizes to NaN: the call fails instead of a finite wrong
    chunk downstream."""
    from molmoact2_ros.bundle.conventions import Conventions
    from molmoact2_ros.runtime.loaders import InferenceFailed, QnnLoader
    from molmoact2_ros.runtime.protocol import SessionSpec, WorkerSpec
    from molmoact2_ros.synth.contexts import ufp16_params

    quant = {"x": ufp16_params(-20.0, 45.535),
             "z": {"dtype": "ufp16", "scale": float("nan"), "offset": 0}}
    path = _quirks_with(tmp_path, "nanscale", quant)
    loader = QnnLoader(WorkerSpec("quirks", (), "grid_sampler", Conventions()))
    session = loader.load(SessionSpec("quirks", str(path), "q-nan", float_io=True))
    try:
        with pytest.raises(InferenceFailed, match="output z has 6 non-finite values out of 6"):
            session.infer([np.ones((2, 3), np.float32), np.arange(4, dtype=np.int32)])
    finally:
        session.release()


def test_execute_time_is_reported_only_with_profiling(qai, ctx_path):
    """getProfilingEvent(QNN_PROFILE_EVENTTYPE_EXECUTE) needs ProfilingLevel BASIC or more."""
    feeds = [np.ones((2, 3), np.float16), np.arange(4, dtype=np.int32)]
    with _native(qai, ctx_path, "no-profile") as ctx:
        ctx.Inference(list(feeds))
        assert ctx.getProfilingEvent(3) == 0
    qai.QNNConfig.Config(runtime=qai.Runtime.HTP, profiling_level=qai.ProfilingLevel.BASIC)
    try:
        with _native(qai, ctx_path, "profiled") as ctx:
            ctx.Inference(list(feeds))
            assert ctx.getProfilingEvent(3) > 0 and ctx.getProfilingEvent(7) == 0
    finally:
        qai.QNNConfig.Config(runtime=qai.Runtime.HTP)
