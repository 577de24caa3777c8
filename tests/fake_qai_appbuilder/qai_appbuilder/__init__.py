"""Test fake of ``qai_appbuilder`` 2.51.40 (the PyPI wheel): HTP calls run on onnxruntime.

Put ``tests/fake_qai_appbuilder`` on ``PYTHONPATH`` (before spawning workers) and
``import qai_appbuilder`` finds this package. The Python layer (``qnncontext.py``) mirrors the
wheel's names, signatures and defaults; ``appbuilder.py`` stands in for the pybind extension
and reproduces the documented native quirks (see its docstring, and
the project notes on qai_appbuilder, §2).

Differences from the real package: it loads only the stand-in context files written by
``molmoact2_ros.synth.contexts`` (ONNX inside, executed by onnxruntime on the CPU, float
tensors presented as fp16), not QNN context binaries; there is no DSP, no FastRPC and no
real perf vote (Set/Rel are counted in ``appbuilder.STATE``); the import preloads nothing
(``libs/*.so`` are text placeholders carrying the runtime version string) but has the wheel's
other side effects: it prepends its folder to ``LD_LIBRARY_PATH`` and replaces
``sys.modules["onnxruntime"]`` with its look-alike (``onnxwrapper``), so a process that
needs ONNX Runtime must never import it; ``QNNContextProc``,
``QNNShareMemory``, LoRA, Genie and the ``.onnx``/``.tflite`` routes are absent; it can
crash, hang or fail a load or an inference on demand (``appbuilder.injected``).
"""

import os
import sys

__version__ = "2.51.40"
#: Marker of the test fake: ``molmoact2 doctor`` / ``device-report`` print "test fake".
FAKE = True

g_base_path = os.path.dirname(os.path.abspath(__file__))
_ld = os.environ.get("LD_LIBRARY_PATH", "")
os.environ["LD_LIBRARY_PATH"] = g_base_path + (os.pathsep + _ld if _ld else "")

from . import onnxwrapper  # noqa: E402
from .qnncontext import *  # noqa: E402,F403

sys.modules["onnxruntime"] = onnxwrapper
