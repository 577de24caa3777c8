"""Fake of ``qai_appbuilder/onnxwrapper.py``: an onnxruntime look-alike over ``QNNContext``.

The package installs this module as ``sys.modules["onnxruntime"]`` at import, like the wheel;
code that imports ``onnxruntime`` afterwards in the same process gets this instead of ONNX
Runtime. Only the names needed to recognise it are here.
"""

from __future__ import annotations

QAI_APPBUILDER_ONNXWRAPPER = True
__version__ = "qai_appbuilder-onnxwrapper"


def get_available_providers() -> list[str]:
    return ["QNNExecutionProvider"]


class SessionOptions:
    """Accepted and ignored, like the wrapper's."""


class InferenceSession:
    """Routes ``.onnx`` models to QNN in the wheel; the fake cannot run them."""

    def __init__(self, path_or_bytes, sess_options=None, providers=None, **kwargs) -> None:
        raise RuntimeError(
            "qai_appbuilder's onnxruntime look-alike replaced ONNX Runtime in this process "
            "(fake: it cannot run ONNX graphs)"
        )
