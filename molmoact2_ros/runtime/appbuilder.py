"""Which ``qai_appbuilder`` the HTP workers import: the installed wheel or the test fake."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..errors import MolmoActError

#: ``molmoact2 --appbuilder fake`` or ``MOLMOACT2_APPBUILDER=fake``: run the HTP path off the board.
ENV = "MOLMOACT2_APPBUILDER"
CHOICES = ("installed", "fake")


def fake_path() -> Path:
    """Where a source checkout keeps the fake (``tests/fake_qai_appbuilder``)."""
    return Path(__file__).resolve().parents[2] / "tests" / "fake_qai_appbuilder"


def use_test_fake() -> Path:
    """Put the fake first on the path that spawned workers and subprocesses import from.

    Spawned workers inherit this process's ``sys.path``; subprocesses (doctor's probe)
    read ``PYTHONPATH``. This process itself never imports ``qai_appbuilder``.
    """
    path = fake_path()
    if not (path / "qai_appbuilder" / "__init__.py").is_file():
        raise MolmoActError(f"--appbuilder fake needs a source checkout: {path} is missing "
                            "(the fake is not installed with the package)")
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    parts = [str(path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p and p != str(path)]
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    return path


def using_test_fake() -> bool:
    """True when workers will import the test fake (chosen here, or by a test's path setup):
    the ``qai_appbuilder`` this path finds sits in a ``fake_qai_appbuilder`` folder. Found,
    not imported: this process never imports qai_appbuilder."""
    if str(fake_path()) in sys.path:
        return True
    try:
        spec = importlib.util.find_spec("qai_appbuilder")
    except (ImportError, ValueError):
        return False
    origin = getattr(spec, "origin", None) if spec is not None else None
    return bool(origin) and Path(origin).resolve().parents[1].name == "fake_qai_appbuilder"


def check_installed_for_htp() -> None:
    """Refuse ``--backend htp`` before any worker is spawned when no ``qai_appbuilder`` can
    be found (found, not imported), naming the wheel for the board and the fake for elsewhere."""
    if using_test_fake():
        return
    try:
        found = importlib.util.find_spec("qai_appbuilder") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MolmoActError(
            "--backend htp needs qai_appbuilder, which is not installed here: on the IQ-9075 "
            "pip install 'qai-appbuilder==2.51.40'; off the board, run the HTP path on the test "
            f"fake with molmoact2 --appbuilder fake ... (or {ENV}=fake), or use --backend onnx")


def describe(backend: str) -> str:
    """``onnx``, or ``htp (qai_appbuilder: test fake|installed)``: what outputs print."""
    if backend != "htp":
        return backend
    return "htp (qai_appbuilder: " + ("test fake" if using_test_fake() else "installed") + ")"
