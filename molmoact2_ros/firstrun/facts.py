"""The device report's facts: this machine and its QNN stack, and per bundle where the norm
stats are and which QNN libraries it ships."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import numpy as np

from .status import FAIL

#: glibc the qai-appbuilder 2.51.40 aarch64 wheels need: cp310 is tagged manylinux_2_35 (Ubuntu
#: 22.04 / Humble), cp311-cp313 manylinux_2_39 (Ubuntu 24.04 / Jazzy)
WHEEL_GLIBC = {(3, 10): (2, 35)}
WHEEL_GLIBC_DEFAULT = (2, 39)


def _os_release() -> str:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        return platform.platform()
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return fields.get("PRETTY_NAME", "").strip('"') or platform.platform()


def _glibc() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return ""


def platform_facts(probe: dict) -> dict:
    """What the report's reader needs to know about this machine and its QNN stack."""
    from ..runtime.libpaths import qnn_runtime_version

    glibc = _glibc()
    facts = {
        "os": _os_release(), "glibc": glibc, "kernel": platform.release(),
        "machine": platform.machine(), "python": platform.python_version(),
        "numpy": np.__version__,
    }
    from ..host import fp16, resample_jit

    facts["host_kernels"] = (f"preprocessing: {resample_jit.describe()}; fp16 sums: "
                             f"{fp16.kernel()}")
    try:
        number = tuple(int(p) for p in glibc.split()[-1].split(".")[:2])
    except (ValueError, IndexError):
        number = (0, 0)
    need = WHEEL_GLIBC.get(tuple(sys.version_info[:2]), WHEEL_GLIBC_DEFAULT)
    tag = f"manylinux_{need[0]}_{need[1]}"
    facts["wheel_glibc"] = (
        f"ok (this Python's 2.51.40 wheel is {tag})" if number >= need else
        f"{glibc or 'unknown glibc'} is older than {tag}, the tag of the 2.51.40 wheel for "
        f"Python {platform.python_version()}: it does not install here (Python 3.10's wheel "
        "needs glibc 2.35, the others 2.39)"
    )
    if "error" in probe:
        facts["qai_appbuilder"] = f"not importable ({probe['error']})"
        return facts
    fake = " (qai_appbuilder: test fake, no NPU behind it)" if probe.get("fake") else ""
    facts["qai_appbuilder"] = f"{probe['version']}{fake} at {probe['dir']}"
    lib = Path(probe["dir"]) / "libs" / "libQnnHtp.so"
    facts["qnn_runtime"] = (qnn_runtime_version(lib) or "no version string") if lib.is_file() \
        else f"{lib} missing"
    return facts



def norm_stats_facts(bundle) -> dict:
    """Where the norm stats came from, their mode and raw dimensions, whether they are valid
    and the goldens' own (``prompt_stats.norm_stats_facts``), or that they are missing."""
    from .prompt_stats import norm_stats_facts as checked

    if bundle.norm_stats_path.is_file():
        return checked(bundle)
    return {"status": FAIL, "path": str(bundle.norm_stats_path),
            "why": f"no norm_stats.json in {bundle.root} or "
            f"{bundle.root / 'golden'} (the published lp_vtp_sd and fused bundles ship none)",
            "fix": "copy norm_stats.json from the checkpoint into the bundle (molmoact2 "
            "export-host CHECKPOINT BUNDLE writes it when missing); the policy needs it to "
            "normalise the state and de-normalise actions"}


def library_facts(bundle, ignore: bool) -> dict:
    """The bundle's qnn_libs/dsp_libs, their QAIRT versions, and whether they are used."""
    from ..runtime.libpaths import qnn_runtime_version

    facts = {}
    for name in ("qnn_libs", "dsp_libs"):
        folder = bundle.root / name
        if not folder.is_dir():
            continue
        versions = sorted({qnn_runtime_version(p) or "no version" for p in folder.glob("*.so")})
        facts[name] = {"path": str(folder), "versions": versions,
                       "used": not ignore}
    return facts

