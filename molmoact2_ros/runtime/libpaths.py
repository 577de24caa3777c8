"""QNN/DSP library folders of a bundle and the version check run before any worker starts.

The wheel preloads its own QNN runtime (``qai_appbuilder/libs``) and sets ``ADSP_LIBRARY_PATH``
only when it is unset, so a ``dsp_libs/`` skel of another QAIRT version next to the wheel's
stub fails on the DSP with the generic "did not load". ``preflight`` finds that first and
names the library, both versions and the variable. It never imports qai_appbuilder: the
package is located with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from ..errors import RuntimeBackendError

_VERSION = re.compile(rb"v(2\.\d+\.\d+(?:\.\d+)?)")


def qnn_runtime_version(lib: Path) -> str | None:
    """The ``v2.x.y.z`` build string inside a QNN library (like ``strings | grep v2.``)."""
    tail = b""
    with open(lib, "rb") as f:
        while chunk := f.read(1 << 20):
            match = _VERSION.search(tail + chunk)
            if match:
                return match.group(1).decode()
            tail = chunk[-64:]
    return None


def _release(version: str) -> str:
    return ".".join(version.split(".")[:3])


def wheel_libs() -> Path | None:
    """``qai_appbuilder/libs`` of the installed package, without importing it."""
    try:
        spec = importlib.util.find_spec("qai_appbuilder")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "libs"


def preflight(qnn_libs: str, dsp_libs: str, dsp_arch: str) -> None:
    """Refuse, with the specific reason, library folders whose QNN version does not match."""
    libs = wheel_libs()
    runtime_lib = libs / "libQnnHtp.so" if libs is not None else None
    if runtime_lib is None or not runtime_lib.is_file():
        return  # no wheel (or no runtime in it): the worker reports the import failure
    runtime = qnn_runtime_version(runtime_lib)
    if runtime is None:
        return
    skel_name = f"libQnnHtp{dsp_arch.upper()}Skel.so"
    if dsp_libs:
        folder = Path(dsp_libs)
        if not (folder / skel_name).is_file():
            raise RuntimeBackendError(
                f"dsp_libs {folder} has no {skel_name} (Hexagon {dsp_arch}); ADSP_LIBRARY_PATH "
                f"would point the DSP at it: copy {skel_name} of QAIRT v{runtime} there from "
                f"{libs}, or remove dsp_libs"
            )
        _same(folder / skel_name, runtime, runtime_lib, "ADSP_LIBRARY_PATH (bundle dsp_libs)")
    else:
        inherited = os.environ.get("ADSP_LIBRARY_PATH", "")
        for entry in re.split(r"[;:]", inherited):
            if entry and (Path(entry) / skel_name).is_file():
                _same(Path(entry) / skel_name, runtime, runtime_lib, "ADSP_LIBRARY_PATH")
                break
        else:
            if len(inherited) >= 2:  # QNNConfig.Config keeps any value of 2+ characters
                raise RuntimeBackendError(
                    f"ADSP_LIBRARY_PATH={inherited} (inherited) holds no {skel_name}: the wheel "
                    f"keeps an inherited value, so the DSP would find no skel and the contexts "
                    f"fail to load; unset ADSP_LIBRARY_PATH, or add {libs} to it"
                )
    # libQnnHtp.so dlopen()s its stub by name: the first one on LD_LIBRARY_PATH wins
    stub_name = f"libQnnHtp{dsp_arch.upper()}Stub.so"
    search = [(qnn_libs, "LD_LIBRARY_PATH (bundle qnn_libs)")] if qnn_libs else []
    search += [(d, "LD_LIBRARY_PATH")
               for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for folder, variable in search:
        for name in ("libQnnHtp.so", stub_name):
            lib = Path(folder) / name
            if lib.is_file() and lib.resolve() != (libs / name).resolve():
                _same(lib, runtime, runtime_lib, variable)


def _same(lib: Path, runtime: str, runtime_lib: Path, variable: str) -> None:
    version = qnn_runtime_version(lib)
    if version is None:
        raise RuntimeBackendError(
            f"{lib} carries no QAIRT version string; it is truncated or not a QNN library "
            f"({variable} points at it)"
        )
    if _release(version) != _release(runtime):
        raise RuntimeBackendError(
            f"{lib} is QAIRT v{version} but qai_appbuilder loads its own QNN runtime "
            f"v{runtime} ({runtime_lib}); through {variable} the two would meet and the "
            f"contexts fail to load ('Stub lib id mismatch' / transport error 1008): use the "
            f"v{_release(runtime)} libraries there, or remove that folder"
        )
