"""The library-folder preflight: a QNN library of another QAIRT version is named, with the
variable that would bring it in, before any worker starts."""

from __future__ import annotations

import pytest
from htp_helpers import FAKE_PATH

from molmoact2_ros.errors import RuntimeBackendError
from molmoact2_ros.runtime.libpaths import preflight, qnn_runtime_version, wheel_libs


@pytest.fixture
def fake_wheel(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE_PATH))  # located with find_spec, never imported
    monkeypatch.delenv("ADSP_LIBRARY_PATH", raising=False)
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert qnn_runtime_version(wheel_libs() / "libQnnHtp.so") == "2.51.40.260930230134"


def _lib(folder, name, version):
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(b"\0ELF stand-in " + f"v{version}".encode() + b"\0")
    return folder


def test_matching_folders_pass(fake_wheel, tmp_path):
    qnn = _lib(tmp_path / "qnn_libs", "libQnnHtp.so", "2.51.40.1")
    dsp = _lib(tmp_path / "dsp_libs", "libQnnHtpV73Skel.so", "2.51.40.1")
    preflight(str(qnn), str(dsp), "v73")


@pytest.mark.parametrize(
    ("where", "name", "variable"),
    [
        ("dsp", "libQnnHtpV73Skel.so", "ADSP_LIBRARY_PATH (bundle dsp_libs)"),
        ("qnn", "libQnnHtp.so", "LD_LIBRARY_PATH (bundle qnn_libs)"),
        ("env_adsp", "libQnnHtpV73Skel.so", "ADSP_LIBRARY_PATH"),
        ("env_ld", "libQnnHtpV73Stub.so", "LD_LIBRARY_PATH"),
    ],
)
def test_a_mismatched_library_is_refused_naming_it(fake_wheel, tmp_path, monkeypatch, where,
                                                   name, variable):
    folder = _lib(tmp_path / where, name, "2.47.0.250101")
    qnn = str(folder) if where == "qnn" else ""
    dsp = str(folder) if where == "dsp" else ""
    if where == "env_adsp":
        monkeypatch.setenv("ADSP_LIBRARY_PATH", str(folder))
    if where == "env_ld":
        monkeypatch.setenv("LD_LIBRARY_PATH", str(folder))
    with pytest.raises(RuntimeBackendError) as err:
        preflight(qnn, dsp, "v73")
    text = str(err.value)
    assert f"{folder / name} is QAIRT v2.47.0.250101" in text
    assert "own QNN runtime v2.51.40.260930230134" in text and f"through {variable} " in text


def test_dsp_libs_without_the_skel_is_refused(fake_wheel, tmp_path):
    empty = tmp_path / "dsp_libs"
    empty.mkdir()
    with pytest.raises(RuntimeBackendError, match="has no libQnnHtpV73Skel.so"):
        preflight("", str(empty), "v73")


def test_inherited_adsp_path_without_the_skel_is_refused(fake_wheel, tmp_path, monkeypatch):
    """The wheel keeps an inherited ADSP_LIBRARY_PATH (2+ characters): one without the skel
    would leave the DSP with none, so it is refused at open, naming the variable."""
    empty = tmp_path / "old_sdk"
    empty.mkdir()
    monkeypatch.setenv("ADSP_LIBRARY_PATH", f"{empty};/vendor/dsp/cdsp")
    with pytest.raises(RuntimeBackendError, match=r"ADSP_LIBRARY_PATH=.*old_sdk;/vendor/dsp/"
                       r"cdsp \(inherited\) holds no libQnnHtpV73Skel.so.*unset ADSP_LIBRARY_PATH"):
        preflight("", "", "v73")
    monkeypatch.setenv("ADSP_LIBRARY_PATH", str(wheel_libs()))  # the wheel's own: fine
    preflight("", "", "v73")
