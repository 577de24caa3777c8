"""``molmoact2 doctor``: clean failures without qai_appbuilder, full checks with the fake."""

from __future__ import annotations

import importlib.util

import pytest
from htp_helpers import ensure_contexts, fake_env

from molmoact2_ros.cli.app import main

#: Checks that fail on any machine without the IQ-9075 hardware, fake or not.
MACHINE_CHECKS = {"platform", "libcdsprpc.so", "FastRPC devices", "DSP arch"}


def _failed(out: str) -> set[str]:
    return {line[6:30].strip() for line in out.splitlines() if line.startswith("FAIL  ")}


@pytest.mark.skipif(importlib.util.find_spec("qai_appbuilder") is not None,
                    reason="a qai_appbuilder is installed here")
def test_without_qai_appbuilder_fails_cleanly(tiny_root, monkeypatch, capsys):
    ensure_contexts(tiny_root)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert main(["doctor", str(tiny_root / "grid_sampler")]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "FAIL  qai_appbuilder" in out and "pip install qai-appbuilder==2.51.40" in out
    assert "SKIP  contexts load" in out and "PASS  context action_step" in out


def test_missing_bundle_path_is_bad_input(tmp_path, capsys):
    """A path that does not exist is a typo, not a machine problem: one line, exit 2."""
    assert main(["doctor", str(tmp_path / "nowhere"), "--variant", "fused"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "does not exist" in err and "Traceback" not in err


def test_with_the_fake_everything_but_the_hardware_passes(tiny_root, monkeypatch, capsys):
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    code = main(["doctor", str(tiny_root / "lp_vtp_sd"), "--suffix", "llm=_w4a16",
                 "--repeats", "1"])
    out, _ = capsys.readouterr()
    assert "PASS  qai_appbuilder           2.51.40 (qai_appbuilder: test fake" in out
    assert "PASS  QNN runtime              QAIRT v2.51.40" in out
    for line in ("PASS  load action_step", "PASS  contracts", "PASS  golden parity",
                 "PASS  latency (ms)", "llm_split0_w4a16_socid77_archv73.bin"):
        assert line in out
    assert _failed(out) <= MACHINE_CHECKS
    assert code == (1 if _failed(out) else 0)


def test_a_context_that_does_not_load(tiny_root, monkeypatch, capsys):
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    monkeypatch.setenv("FAKE_QAI_FAIL_LOAD", "action_context")
    assert main(["doctor", str(tiny_root / "grid_sampler"), "--repeats", "1"]) == 1
    out, err = capsys.readouterr()
    assert "FAIL  contexts load" in out and "action_context did not load" in out
    assert "Traceback" not in out + err


def test_numpy_2_under_humble_is_named_with_the_pin():
    """pip pulls numpy 2 with qai-appbuilder (numpy>=1.22); Humble's cv_bridge needs numpy 1."""
    from molmoact2_ros.firstrun.machine import check_numpy_for_ros

    bad = check_numpy_for_ros("2.2.6", {"ROS_DISTRO": "humble"})
    assert bad.status == "FAIL" and "numpy>=1.22,<2" in bad.fix
    assert check_numpy_for_ros("1.26.4", {"ROS_DISTRO": "humble"}).status == "PASS"
    assert check_numpy_for_ros("2.2.6", {"ROS_DISTRO": "jazzy"}).status == "PASS"
