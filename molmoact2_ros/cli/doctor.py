"""``molmoact2 doctor BUNDLE``: can this machine run the bundle on the HTP? One line per check.

Checks: platform, qai_appbuilder (probed in a subprocess: its import preloads QNN libraries
and may abort), the QNN runtime version it bundles, ``libcdsprpc.so`` and the FastRPC device
nodes, ``ADSP_LIBRARY_PATH``/``LD_LIBRARY_PATH`` against the runtime that will load, the DSP
architecture (``qnn-platform-validator``, when present), every context file, then — in
spawned workers, as the node runs them — each context's load and contract, golden parity
through the HTP backend and per-component latency. Every FAIL says how to fix it.
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..bundle.variants import COMPONENTS
from ..errors import MolmoActError
from ..runtime.libpaths import qnn_runtime_version

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
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


# -- bundle ----------------------------------------------------------------------------------
def check_context_files(bundle, suffixes) -> Iterator[Check]:
    from ..bundle.bundle import MIN_CONTEXT_BYTES

    for component in COMPONENTS:
        path = bundle.context_path(component, suffixes.for_component(component))
        name = f"context {component}"
        if not path.is_file():
            yield Check(name, FAIL, f"{path} is missing",
                        "download the bundle's ctx/ folder, or choose a suffix it ships")
        elif path.stat().st_size < MIN_CONTEXT_BYTES:
            yield Check(name, FAIL, f"{path.name} is {path.stat().st_size} bytes (truncated)",
                        "re-download the file")
        else:
            yield Check(name, PASS, f"{path.name} ({path.stat().st_size / 2**20:.1f} MiB)")


def _describe(infos) -> str:
    return ", ".join(f"{i.name}{list(i.shape)} {i.dtype}" for i in infos)


def check_pipeline(bundle, suffixes, timeout_s: float, repeats: int) -> Iterator[Check]:
    """Load every context in spawned workers, check contracts, parity and latency."""
    from ..bundle.comparison import load_tolerances, precision_of
    from ..bundle.golden import component_parity
    from ..runtime.htp_backend import ResidentPipeline

    try:
        pipeline = ResidentPipeline.open(
            bundle, suffixes, call_timeout_s=timeout_s, start_timeout_s=max(timeout_s, 300.0)
        )
    except MolmoActError as exc:
        yield Check("contexts load", FAIL, str(exc),
                    "run with the QNN log (log_level INFO) and check the QAIRT version the "
                    "contexts were built with against the QNN runtime line above")
        return
    with pipeline:
        for component, (inputs, outputs) in pipeline.declared.items():
            yield Check(f"load {component}", PASS,
                        f"in {_describe(inputs)} -> out {_describe(outputs)}")
        yield Check("contracts", PASS, f"seven sessions chain ({dict(pipeline.geometry.dims)})")
        golden = [c for c in COMPONENTS if bundle.golden_path(f"{c}_io.npz").is_file()]
        if golden:
            rows = component_parity(
                bundle.root / "golden", pipeline.run_component, pipeline.contracts,
                components=golden, table=load_tolerances(bundle.root / "golden"),
                precision=lambda c: precision_of("htp", suffixes.for_component(c)))
            bad = [r for r in rows if not r.passed]
            worst = min(r.cosine for r in rows)
            if bad:
                listed = ", ".join(f"{r.stage}.{r.tensor} ({r.failed})" for r in bad)
                yield Check("golden parity", FAIL, f"{len(bad)}/{len(rows)} rows fail: {listed}",
                            "the contexts do not compute what the goldens recorded: wrong "
                            "suffix or conventions, or a bad compile")
            else:
                yield Check("golden parity", PASS,
                            f"{len(rows)} rows over {len(golden)} components, min cosine "
                            f"{worst:.6f}")
        else:
            yield Check("golden parity", SKIP, "no golden/<component>_io.npz in the bundle")
        yield _latency(pipeline, bundle.variant, repeats)


def _latency(pipeline, variant, repeats: int) -> Check:
    x0 = np.zeros((1, variant.horizon, variant.max_action_dim), np.float32)
    samples: dict[str, list[float]] = {}
    for _ in range(repeats + 1):
        pipeline.run_vision()
        pipeline.run_action(x0, variant.default_flow_steps)
        for key, value in pipeline.last_timings_ms.items():
            samples.setdefault(key, []).append(value)
    parts = [f"{k} {np.median(v[1:]):.1f}" for k, v in samples.items()]
    return Check("latency (ms)", PASS,
                 f"median of {repeats}: " + ", ".join(parts)
                 + f" (action_step: all {variant.default_flow_steps} steps)")


def run_checks(bundle_dir: Path, variant: str | None, suffixes: dict[str, str],
               timeout_s: float, repeats: int) -> list[Check]:
    """Every check in order; later ones are skipped when what they need is missing."""
    checks = [check_platform()]
    probe = probe_qai_appbuilder()
    checks += [check_qai(probe), check_qnn_runtime(probe), check_cdsprpc(),
               check_fastrpc_nodes(), check_library_paths(probe), check_host_kernels(),
               check_numpy_for_ros()]
    try:
        from ..bundle.bundle import Bundle, Suffixes, resolve_bundles

        found = resolve_bundles(bundle_dir, variant)
        chosen = Suffixes.from_mapping(suffixes)
    except MolmoActError as exc:
        return checks + [Check("bundle", FAIL, str(exc), "give a variant's bundle folder, or a "
                               "root of variant folders (optionally with --variant)")]
    for name, folder in found:
        try:
            bundle = Bundle.open(folder, name)
        except MolmoActError as exc:
            checks.append(Check(f"bundle {name}", FAIL, str(exc), "fix or remove this folder"))
            continue
        checks += _bundle_checks(bundle, chosen, probe, timeout_s, repeats)
    return checks


def _bundle_checks(bundle, chosen, probe: dict, timeout_s: float, repeats: int) -> list[Check]:
    """One variant's bundle: its files, then (with qai_appbuilder) loads, parity, latency."""
    checks = [Check("bundle", PASS, f"{bundle.root} ({bundle.variant.name})"),
              check_dsp_arch(bundle.variant.dsp_arch)]
    files = list(check_context_files(bundle, chosen))
    checks += files
    if "error" in probe:
        checks.append(Check("contexts load", SKIP, "needs qai_appbuilder"))
    elif any(c.status == FAIL for c in files):
        checks.append(Check("contexts load", SKIP, "needs every context file"))
    else:
        checks += list(check_pipeline(bundle, chosen, timeout_s, repeats))
    return checks


def cmd_doctor(args: argparse.Namespace) -> int:
    folder = Path(args.bundle).expanduser()
    if not folder.exists():  # a typo, not a machine problem: bad input, exit 2
        raise MolmoActError(f"bundle path {folder} does not exist; give a variant's bundle "
                            "folder or a root of variant folders (molmoact2 tiny-bundle DIR "
                            "writes tiny ones)")
    try:
        checks = run_checks(Path(args.bundle), args.variant, dict(args.suffix or []),
                            args.timeout, args.repeats)
    except Exception as exc:  # doctor must never end in a traceback
        checks = [Check("doctor", FAIL, f"{type(exc).__name__}: {exc}", "report this")]
    for check in checks:
        print(check.format(), flush=True)
    failed = [c for c in checks if c.status == FAIL]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks pass or skip; "
          f"{len(failed)} fail" + (": " + ", ".join(c.name for c in failed) if failed else ""))
    return 1 if failed else 0


def register(subparsers) -> None:
    """Add ``molmoact2 doctor`` to the CLI."""
    from ..bundle.variants import VARIANTS
    from .args import example, float_in, int_in, parse_suffix

    p = subparsers.add_parser(
        "doctor", help="check this machine and a bundle for the HTP runtime",
        description="One PASS/FAIL/SKIP line per check, each FAIL with its fix: platform, "
        "qai_appbuilder and its QNN runtime,\nlibcdsprpc.so and the FastRPC nodes, library "
        "paths, host kernels, every context file, then in spawned\nworkers each context's "
        "load and contract, golden parity and latency. Exit 1 if a check fails,\n2 if the "
        "bundle path does not exist.",
        epilog=example("molmoact2 doctor /data/molmoact2/grid_sampler",
                       "molmoact2 --appbuilder fake doctor .cache/tiny-bundle --variant "
                       "grid_sampler"))
    p.add_argument("bundle", help="a variant's bundle folder, or a root of variant folders "
                   "(every variant found is checked)")
    p.add_argument("--variant", choices=list(VARIANTS),
                   help="check only this variant of a root")
    p.add_argument("--suffix", type=parse_suffix, action="append", metavar="GROUP=SUFFIX",
                   help="context suffix per group (vision, llm, action), e.g. llm=_w4a16")
    p.add_argument("--timeout", type=float_in(0.0, 3600.0, low_open=True), default=60.0,
                   help="deadline per call, seconds")
    p.add_argument("--repeats", type=int_in(1, 1000), default=5,
                   help="chunks timed for the latency line")
    p.set_defaults(func=cmd_doctor)
