"""Optional dependencies: import one, or fail with one line naming the extra that installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingDependencyError

#: import name -> (distribution, extra of setup.py that installs it)
EXTRAS = {
    "onnx": ("onnx", "synth"),
    "onnxruntime": ("onnxruntime", "onnx"),
    "rosbags": ("rosbags", "replay"),
    "safetensors": ("safetensors", "export"),
    "matplotlib": ("matplotlib", "plot"),
    "ray": ("ray", "cluster"),
}


def install_hint(module: str) -> str:
    """The pip command that installs ``module``: the extra from the source checkout (the
    package is not on PyPI), or the distribution alone."""
    dist, extra = EXTRAS[module]
    return f"pip install -e '.[{extra}]' in the source checkout (or pip install {dist})"


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise ``MissingDependencyError`` saying what needs it and the fix."""
    try:
        return importlib.import_module(module)
    except ImportError:
        dist, _ = EXTRAS[module]
        raise MissingDependencyError(
            f"{purpose} needs the Python package {dist!r}, which is not installed: "
            f"{install_hint(module)}") from None
