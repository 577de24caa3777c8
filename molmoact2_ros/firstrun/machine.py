"""Doctor's machine checks: platform, qai_appbuilder (probed in a subprocess: its import
preloads QNN libraries and may abort), the QNN runtime it bundles, ``libcdsprpc.so`` and the
FastRPC device nodes, ``ADSP_LIBRARY_PATH``/``LD_LIBRARY_PATH`` against the runtime that will
load, the DSP architecture, host kernels and numpy under ROS. Every FAIL says how to fix it.
"""

from __future__ import annotations

import ctypes.util
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..runtime.libpaths import qnn_runtime_version
from .status import FAIL, PASS, SKIP

TESTED_WHEEL = "2.51.40"
_CDSPRPC_DIRS = ("/usr/lib", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/vendor/lib64",
                 "/lib/aarch64-linux-gnu", "/odm/lib64")
_PROBE = """
import importlib, json, os, sys
try:
    q = importlib.import_module("qai_appbuilder")  # in this probe subprocess only
except BaseException as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
try:
    from importlib.metadata import version
    v = version("qai_appbuilder")
except Exception:
    v = getattr(q, "__version__", "unknown")
print(json.dumps({"version": v, "dir": os.path.dirname(os.path.abspath(q.__file__)),
                  "fake": bool(getattr(q, "FAKE", False))}))
"""


@dataclass(frozen=True)
class Check:
    """One doctor line."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def format(self) -> str:
        line = f"{self.status:<4}  {self.name:<24} {self.detail}"
        return line + (f"\n      fix: {self.fix}" if self.status == FAIL and self.fix else "")


# -- machine ---------------------------------------------------------------------------------
def check_host_kernels() -> Check:
    """Which compiled host kernels this install uses: both paths are exact, the numpy ones
    slower (preprocessing about 3x), so this informs rather than fails."""
    from ..host import fp16, resample_jit

    return Check("host kernels", PASS, f"preprocessing: {resample_jit.describe()}; fp16 sums: "
                 f"{fp16.kernel()}")


def check_numpy_for_ros(numpy_version: str | None = None, environ=None) -> Check:
    """ROS 2 Humble's cv_bridge (Ubuntu 22.04 apt) is built against numpy 1.x; installing
    qai-appbuilder (numpy>=1.22,<=2.4.4) with pip pulls numpy 2 unless it is pinned, and
    cv_bridge then fails to import ("compiled using NumPy 1.x")."""
    import os

    import numpy as np

    environ = os.environ if environ is None else environ
    version = numpy_version or np.__version__
    distro = environ.get("ROS_DISTRO", "")
    major = int(version.split(".")[0])
    if distro == "humble" and major >= 2:
        return Check("numpy for cv_bridge", FAIL,
                     f"numpy {version} under ROS 2 Humble, whose cv_bridge is built for numpy 1",
                     "pip install 'numpy>=1.22,<2' (the pin in docs/runtime.md), then install "
                     "qai-appbuilder with that numpy in place")
    where = f"ROS_DISTRO={distro}" if distro else "no ROS_DISTRO set"
    return Check("numpy for cv_bridge", PASS, f"numpy {version} ({where})")


def check_platform() -> Check:
    machine, system = platform.machine(), platform.system()
    if system == "Linux" and machine in ("aarch64", "arm64"):
        return Check("platform", PASS, f"{system} {machine}, Python {platform.python_version()}")
    return Check("platform", FAIL, f"{system} {machine}: the HTP runtime needs Linux aarch64",
                 "run on the IQ-9075 (QCS9075) with Ubuntu 24.04; use --backend onnx elsewhere")


def probe_qai_appbuilder(timeout_s: float = 120.0) -> dict:
    """Import qai_appbuilder in a child interpreter; returns version/dir or an error."""
    try:
        result = subprocess.run(  # noqa: S603 (fixed argv: this interpreter, our probe)
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"import did not finish within {timeout_s:.0f} s"}
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the import crashed (exit {result.returncode}: {tail})"}
    return json.loads(lines[-1])


def check_qai(probe: dict) -> Check:
    if "error" in probe:
        return Check("qai_appbuilder", FAIL, f"not importable ({probe['error']})",
                     f"pip install qai-appbuilder=={TESTED_WHEEL} (its Linux aarch64 wheel for "
                     "Python 3.10 needs glibc 2.35 / Ubuntu 22.04, those for 3.11-3.13 glibc "
                     "2.39 / Ubuntu 24.04; on older images build it against your QAIRT)")
    note = " (qai_appbuilder: test fake, no NPU behind it)" if probe.get("fake") else ""
    other = "" if probe["version"] == TESTED_WHEEL else f"; tested with {TESTED_WHEEL}"
    return Check("qai_appbuilder", PASS, f"{probe['version']}{note} at {probe['dir']}{other}")


def check_qnn_runtime(probe: dict) -> Check:
    if "error" in probe:
        return Check("QNN runtime", SKIP, "needs qai_appbuilder")
    lib = Path(probe["dir"]) / "libs" / "libQnnHtp.so"
    if not lib.is_file():
        return Check("QNN runtime", FAIL, f"{lib} is missing",
                     "reinstall the wheel: it bundles its QNN runtime in qai_appbuilder/libs")
    version = qnn_runtime_version(lib)
    if version is None:
        return Check("QNN runtime", FAIL, f"no v2.x version string in {lib}",
                     "reinstall qai-appbuilder; the library looks truncated")
    wheel = str(probe.get("version", ""))
    match = "" if version.startswith(wheel) else f" (wheel {wheel}: a self-built wheel?)"
    return Check("QNN runtime", PASS, f"QAIRT v{version} in {lib.parent}{match}; contexts "
                 "must be built with this QAIRT version or older")


def check_cdsprpc() -> Check:
    found = ctypes.util.find_library("cdsprpc")
    candidates = [Path(d) / "libcdsprpc.so" for d in _CDSPRPC_DIRS]
    present = [str(p) for p in candidates if p.exists()]
    if found or present:
        return Check("libcdsprpc.so", PASS, found or present[0])
    return Check("libcdsprpc.so", FAIL, "the FastRPC user library is not installed",
                 "it comes with the board OS image (Qualcomm Linux / Ubuntu for IQ-9075: the "
                 "fastrpc packages); qai_appbuilder does not ship it")


def check_fastrpc_nodes() -> Check:
    nodes = sorted(glob.glob("/dev/fastrpc-cdsp*") + glob.glob("/dev/adsprpc-smd"))
    if not nodes:
        return Check("FastRPC devices", FAIL, "no /dev/fastrpc-cdsp* node",
                     "load the fastrpc kernel driver (board image) and check udev permissions")
    unusable = [n for n in nodes if not os.access(n, os.R_OK | os.W_OK)]
    if len(unusable) == len(nodes):
        return Check("FastRPC devices", FAIL, f"{', '.join(nodes)} not accessible",
                     "add the user to the group owning the nodes (e.g. 'render' or 'fastrpc')")
    return Check("FastRPC devices", PASS, ", ".join(nodes))


def _dirs(value: str) -> list[str]:
    return [d for d in re.split(r"[;:]", value) if d]


def check_library_paths(probe: dict) -> Check:
    if "error" in probe:
        return Check("library paths", SKIP, "needs qai_appbuilder")
    libs = os.path.realpath(Path(probe["dir"]) / "libs")
    problems = []
    adsp = os.environ.get("ADSP_LIBRARY_PATH", "")
    if len(adsp) >= 2:
        entries = _dirs(adsp)
        skels = [d for d in entries if glob.glob(os.path.join(d, "libQnnHtpV*Skel.so"))]
        foreign = [d for d in skels if os.path.realpath(d) != libs]
        ours = any(os.path.realpath(d) == libs for d in entries)
        if foreign or not (skels or ours):
            where = ", ".join(foreign) if foreign else "no directory with a libQnnHtpV*Skel.so"
            problems.append(f"ADSP_LIBRARY_PATH has {where}")
    for d in _dirs(os.environ.get("LD_LIBRARY_PATH", "")):
        if os.path.isfile(os.path.join(d, "libQnnHtp.so")) and os.path.realpath(d) != libs:
            problems.append(f"LD_LIBRARY_PATH has another QNN runtime in {d}")
    if problems:
        return Check("library paths", FAIL, "; ".join(problems),
                     f"unset ADSP_LIBRARY_PATH/LD_LIBRARY_PATH or point them at {libs}: mixed "
                     "runtimes fail with 'Stub lib id mismatch' / transport error 1008")
    state = "ADSP_LIBRARY_PATH unset (Config sets it)" if len(adsp) < 2 else "consistent"
    return Check("library paths", PASS, f"{state}; runtime from {libs}")


def check_dsp_arch(want: str) -> Check:
    exe = shutil.which("qnn-platform-validator")
    if exe is None:
        return Check("DSP arch", SKIP, "qnn-platform-validator not on PATH (ships with QAIRT)")
    try:
        result = subprocess.run(  # noqa: S603 (fixed argv, no shell)
            [exe, "--backend", "dsp", "--coreVersion", "--testBackend"],
            capture_output=True, text=True, timeout=120, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("DSP arch", FAIL, f"qnn-platform-validator failed ({exc})",
                     "check the FastRPC setup (libcdsprpc.so, /dev/fastrpc-cdsp*)")
    found = re.search(r"\b[Vv](6[5-9]|7\d|8\d)\b", result.stdout + result.stderr)
    if not found:
        return Check("DSP arch", FAIL, "the validator reported no Hexagon version",
                     "run it by hand: qnn-platform-validator --backend dsp --coreVersion")
    got = f"v{found.group(1)}"
    if got != want:
        return Check("DSP arch", FAIL, f"Hexagon {got}, the contexts are built for {want}",
                     "use context binaries compiled for this SoC")
    return Check("DSP arch", PASS, f"Hexagon {got}")


def machine_checks(probe: dict, *, host_kernels: bool = False) -> list[Check]:
    """The machine's checks in their order (doctor and device-report list the same ones):
    platform, qai_appbuilder, QNN runtime, FastRPC, library paths, [host kernels], numpy."""
    checks = [check_platform(), check_qai(probe), check_qnn_runtime(probe), check_cdsprpc(),
              check_fastrpc_nodes(), check_library_paths(probe)]
    if host_kernels:
        checks.append(check_host_kernels())
    return checks + [check_numpy_for_ros()]
