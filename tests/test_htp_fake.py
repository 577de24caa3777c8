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
        assert good.Inference([np.zeros(5, np.float16), np.zeros(4, np.int32)]) == []  # size


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
    votes = appbuilder.STATE["perf_votes"]
    qai.PerfProfile.SetPerfProfileGlobal(qai.PerfProfile.BURST)
    assert appbuilder.STATE["perf_votes"] == votes + 1
    qai.PerfProfile.RelPerfProfileGlobal()
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
    from molmoact2_ros.host.conventions import Conventions
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
