"""``molmoact2 device-report BUNDLE_ROOT``: one Markdown + JSON report of a first run on the board.

For whoever first has the IQ-9075: platform facts (OS, glibc, kernel, QNN and qai_appbuilder
versions), doctor's machine checks, then for every variant under BUNDLE_ROOT and every suffix
choice it ships (fp16; each quantised suffix for vision, the LLM and action_step alone; all
together): the load (time and peak RSS per worker, fixed-point tensors, NPU sessions opened),
per-component golden parity on the HTP against per-component limits, the seed workspace's own
end-to-end check (``trace.json`` + ``step0_boundary.npz``), end-to-end parity over the traces
when ``host/`` is there, and latency per component (the library's NPU execute time apart from
the copies and float conversions around it), then one A/B table per variant with the fastest
choice that passes parity marked.

The report is written before the first section and rewritten after every section, so a crash
leaves every finished section on disk; every section and step is guarded and a failure is
recorded with why. What cannot run here is marked "not run" with why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..bundle.comparison import PARITY_DEFAULTS, ToleranceTable, load_tolerances, precision_of
from ..bundle.variants import (
    ACTION_CONTEXT,
    ACTION_STEP,
    COMPONENTS,
    SET_GROUPS,
    SUFFIX_GROUPS,
)
from ..errors import BundleError, WorkerFailed

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "not run"
MIN_CHUNKS = 20
STEPS = ("load", "component_parity", "seed_e2e", "e2e_parity", "latency")
#: Parity limits per precision (``bundle/comparison.py``, the one comparison every check uses;
#: a bundle's ``golden/tolerances.json`` refines them per component).
PARITY_LIMITS = {p: lim.to_json() for p, lim in PARITY_DEFAULTS.items()}
#: The seed's end-to-end check passes when our final-action cosine is within this of the one
#: the reference runtime recorded in trace.json (or reaches the limit below without one).
FINAL_ACTION_MARGIN = 1e-3
FINAL_ACTION_MIN_COSINE = 0.999
SEED_TRACE, SEED_BOUNDARY = "trace.json", "step0_boundary.npz"


def parity_limit(component: str, suffix: str, table: ToleranceTable | None = None) -> float:
    """The minimum cosine of ``component``'s golden parity with context suffix ``suffix``."""
    return (table or ToleranceTable()).limits(component, precision_of("htp", suffix)).min_cosine
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


def run_replay_check(root: Path, bag: Path, golden_path: Path, probe: dict) -> dict:
    """Replay ``bag`` on the HTP with the golden run's settings and match every chunk with the
    golden chunk bag (made with ``replay --record`` on a workstation) by observation stamp."""
    if "error" in probe:
        return {"status": NOT_RUN,
                "why": f"qai_appbuilder is not importable here ({probe['error']})"}
    from ..bundle.bundle import bundle_parameters
    from ..control.params import Settings, validate_changes
    from ..replay.chunk_match import default_tolerance, match_chunks
    from ..replay.chunkbag import COMPARED_SETTINGS, action_scale, read_chunk_bag
    from ..replay.replay import replay

    golden = read_chunk_bag(golden_path)
    changes = {k: golden.settings[k] for k in COMPARED_SETTINGS if k in golden.settings}
    changes.update(bundle_parameters(root), backend="htp")
    ok, reason = validate_changes(changes, Settings())
    if not ok:
        raise BundleError(f"golden {golden_path}: {reason}")
    result = replay(bag, Settings().with_changes(changes))
    produced = {p.chunk.observation_stamp_ns: p.actions for p in result.published}
    summary = match_chunks(produced, golden.chunks, default_tolerance("htp"),
                           scale=action_scale(golden.settings, changes.get("variant"), root))
    return {"status": PASS if summary.ok else FAIL, "bag": str(bag), "golden": str(golden_path),
            "variant": changes.get("variant"), "drops": dict(result.drops),
            "summary": summary.to_json()}



def suffixes_in(bundle) -> list[str]:
    """Suffixes whose contexts exist for every suffix-selected component ("" first)."""
    found = set()
    for suffix in _suffix_candidates(bundle):
        grouped = [c for g in SET_GROUPS for c in SUFFIX_GROUPS[g]]
        if all(bundle.context_path(c, suffix).is_file() for c in grouped):
            found.add(suffix)
    return sorted(found, key=lambda s: (s != "", s))


def _suffix_candidates(bundle) -> set[str]:
    ctx = bundle.root / "ctx"
    found = {""}
    for group in SET_GROUPS:
        component = SUFFIX_GROUPS[group][0]
        tail = bundle.variant.context_file(component, "")[len(component):]
        for path in ctx.glob(f"{component}*{tail}") if ctx.is_dir() else ():
            found.add(path.name[len(component): -len(tail)])
    return found


def suffix_choices(bundle, mode: str = "all") -> list[tuple[str, dict[str, str]]]:
    """(label, {group: suffix}) per section: fp16, then per quantised suffix each group alone
    (vision, llm, action = action_step) and all together; ``mode`` "sets": fp16 and the whole
    sets only."""
    choices = [("fp16", {})]
    for suffix in sorted(s for s in _suffix_candidates(bundle) if s):
        present = [g for g in SET_GROUPS
                   if all(bundle.context_path(c, suffix).is_file() for c in SUFFIX_GROUPS[g])]
        if mode == "all":
            choices += [(f"{g}={suffix}", {g: suffix}) for g in present]
        if len(present) == len(SET_GROUPS):
            choices.append((f"all={suffix}", dict.fromkeys(SET_GROUPS, suffix)))
    return choices


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, np.float64)
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)),
            "p95": float(np.percentile(arr, 95)), "n": int(arr.size)}


def _rows(rows) -> list[dict]:
    return [{"stage": r.stage, "tensor": r.tensor, "shape": list(r.shape), "cosine": r.cosine,
             "max_abs": r.max_abs, "within_tol": r.within_tol, "passed": r.passed,
             "note": r.note, "failed": r.failed,
             "limits": r.limits.to_json() if r.limits is not None else None}
            for r in rows]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- the seed workspace -----------------------------------------------------------------------
def seed_conventions(folder: Path):
    """Conventions of a bundle without host/ (the seed workspace): the defaults, with whether
    Euler is inside action_step read off the action_step golden's output name."""
    from ..bundle.conventions import Conventions

    conv = Conventions()
    path = folder / "golden" / "action_step_io.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as data:
            if "velocity" in data.files and "next_trajectory" not in data.files:
                return Conventions(**{**conv.__dict__, "euler_in_graph": False})
    return conv


def _first(mapping, names: tuple[str, ...], what: str, path: Path):
    for name in names:
        if name in mapping:
            return mapping[name]
    held = ", ".join(sorted(mapping)) or "nothing"
    raise BundleError(f"{path} has no {what} (looked for {', '.join(names)}); it holds: {held}")


def seed_e2e(pipeline, folder: Path, conventions, variant, limit: float) -> dict:
    """The seed's own end-to-end check: from ``step0_boundary.npz`` (the action expert's inputs
    at the first step) through action_context and the whole flow loop on this runtime, the
    final actions against ``trace.json``'s, and our cosine against the reference runtime's."""
    from ..bundle.golden import compare, load_npz
    from ..host.flow import run_flow

    golden = folder / "golden"
    trace_path, boundary_path = golden / SEED_TRACE, golden / SEED_BOUNDARY
    missing = [p.name for p in (trace_path, boundary_path) if not p.is_file()]
    if missing:
        return {"status": NOT_RUN, "why": f"no golden/{' or golden/'.join(missing)} (the seed "
                "workspace's end-to-end check)"}
    try:
        trace = json.loads(trace_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{trace_path} is not readable JSON ({exc})") from None
    if not isinstance(trace, dict):
        raise BundleError(f"{trace_path} holds {type(trace).__name__}, not a JSON object")
    final = np.asarray(_first(trace, ("final_action", "final_actions", "actions_normalized"),
                              "final action", trace_path), np.float32)
    steps = int(trace.get("flow_steps", trace.get("num_flow_steps",
                                                  variant.default_flow_steps)))
    recorded = trace.get("final_action_cosine", trace.get("cosine"))
    boundary = load_npz(boundary_path, what="the seed's end-to-end check")
    noise = _first(boundary, ("noise", "x0", "trajectory"), "initial noise", boundary_path)
    enc = _first(boundary, ("encoder_attention_mask",), "encoder mask", boundary_path)
    pad = boundary.get("action_dim_is_pad")
    if pad is None:
        from ..host.prompt import action_dim_is_pad

        pad = action_dim_is_pad(variant.action_dim, variant.max_action_dim)
    if "k_ctx" in boundary and "v_ctx" in boundary:
        ctx = {"k_ctx": boundary["k_ctx"], "v_ctx": boundary["v_ctx"]}
    else:
        keys = _first(boundary, ("keys",), "keys (or k_ctx)", boundary_path)
        values = _first(boundary, ("values",), "values (or v_ctx)", boundary_path)
        ctx = pipeline.run_component(ACTION_CONTEXT, {"keys": keys, "values": values})
    out = "next_trajectory" if conventions.euler_in_graph else "velocity"
    pad = np.asarray(pad, np.float32).reshape(1, -1)

    def step(x: np.ndarray, t: np.ndarray) -> np.ndarray:
        feeds = {"trajectory": x, "timestep": t, "k_ctx": ctx["k_ctx"], "v_ctx": ctx["v_ctx"],
                 "encoder_attention_mask": enc, "action_dim_is_pad": pad}
        return np.asarray(pipeline.run_component(ACTION_STEP, feeds)[out], np.float32)

    x = run_flow(step, np.asarray(noise, np.float32).reshape(1, variant.horizon, -1), pad,
                 steps, conventions)
    actions = x[0, :, : final.shape[-1]]
    row = compare("seed e2e", "final action", actions, final, min_cosine=limit)
    threshold = limit if recorded is None else min(limit, float(recorded) - FINAL_ACTION_MARGIN)
    passed = bool(math.isfinite(row.cosine) and row.cosine >= threshold)
    return {"status": PASS if passed else FAIL, "cosine": row.cosine, "max_abs": row.max_abs,
            "reference_cosine": None if recorded is None else float(recorded),
            "threshold": threshold, "flow_steps": steps, "note": row.note}


def norm_stats_facts(bundle) -> dict:
    """Where the norm stats are, or that they are missing with the fix."""
    path = bundle.norm_stats_path
    if path.is_file():
        return {"status": PASS, "path": str(path)}
    return {"status": FAIL, "why": f"no norm_stats.json in {bundle.root} or "
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


# -- one section ------------------------------------------------------------------------------
class Section:
    """One variant with one suffix choice: steps guarded one by one."""

    def __init__(self, name: str, folder: Path, label: str, groups: dict[str, str]) -> None:
        self.data: dict = {"variant": name, "choice": label, "bundle": str(folder),
                           "suffixes": {g: groups.get(g, "") for g in SET_GROUPS},
                           "suffix": "(fp16)" if not groups else label, "status": "running"}
        self.data.update({k: {"status": NOT_RUN, "why": "not reached"} for k in STEPS})

    def step(self, key: str, fn: Callable[[], dict], pipeline=None) -> bool:
        """Run one step; an exception is that step's FAIL (with why); a worker failure is
        followed by a restart so the next steps can still run. Returns whether it passed."""
        try:
            self.data[key] = fn()
        except Exception as exc:  # every step is guarded: the report must keep going
            self.data[key] = {"status": FAIL, "error": _error(exc)}
            if isinstance(exc, WorkerFailed) and pipeline is not None:
                try:
                    pipeline.restart()
                    self.data[key]["recovered"] = "the workers were restarted for the next steps"
                except Exception as again:
                    self.data[key]["recovered"] = f"restart failed: {_error(again)}"
        return self.data[key].get("status") == PASS


def run_section(section: Section, bundle, probe: dict, opts: dict) -> None:
    """Load, parity (per component, the seed's end to end, the traces) and latency."""
    from ..bundle.bundle import HOST_FILES, Suffixes

    data = section.data
    if "error" in probe:
        why = f"qai_appbuilder is not importable here ({probe['error']})"
        data.update({k: {"status": NOT_RUN, "why": why} for k in STEPS})
        return
    suffixes = Suffixes(**data["suffixes"])
    folder = bundle.root
    host_ready = all((folder / "host" / f).is_file() for f in HOST_FILES)
    box: dict = {}

    def load() -> dict:
        from ..runtime.htp_backend import ResidentPipeline

        conventions = bundle.conventions() if (folder / "host" / "conventions.json").is_file() \
            else seed_conventions(folder)
        box["conventions"] = conventions
        box["pipeline"] = pipeline = ResidentPipeline.open(
            bundle, suffixes, conventions=conventions, call_timeout_s=opts["timeout_s"],
            bundle_libs=not opts["ignore_bundle_libs"], profiling="BASIC",
            perf_profile=opts["perf_profile"], load_order=opts["load_order"])
        stats = pipeline.load_stats()
        opened = sum(len(s.get("loaded", ())) for s in stats.values())
        return {"status": PASS, "workers": stats, "npu_sessions": opened,
                "perf_profile": opts["perf_profile"], "load_order": opts["load_order"],
                "kv_ctx_shape": pipeline.geometry.kv_ctx_shape or "5-D as declared",
                "peak_rss_mib_total": sum(s.get("peak_rss_mib", 0.0) for s in stats.values())}

    if not section.step("load", load):
        why = "the contexts did not load (see load)"
        data.update({k: {"status": NOT_RUN, "why": why} for k in STEPS[1:]})
        return
    pipeline = box["pipeline"]
    try:
        section.step("component_parity",
                     lambda: _component_parity(pipeline, folder, suffixes), pipeline)
        limit = min(parity_limit(ACTION_STEP, suffixes.action), FINAL_ACTION_MIN_COSINE)
        section.step("seed_e2e", lambda: seed_e2e(pipeline, folder, box["conventions"],
                                                  bundle.variant, limit), pipeline)
        if host_ready:
            section.step("e2e_parity", lambda: _trace_parity(bundle, pipeline, suffixes),
                         pipeline)
        else:
            data["e2e_parity"] = {"status": NOT_RUN, "why": "no complete host/ (tokenizer, "
                                  "embeddings, prompt, conventions): the traces start from raw "
                                  "observations; molmoact2 export-host CHECKPOINT BUNDLE adds it"}
        section.step("latency", lambda: _latency(pipeline, bundle.variant, opts["chunks"]),
                     pipeline)
    finally:
        pipeline.close()


def _component_parity(pipeline, folder: Path, suffixes) -> dict:
    """Every component with a golden, each against its own limit; one golden that does not
    fit (keys, sequence length) is that component's failing row, the others still run."""
    from ..bundle.golden import ParityRow, component_parity

    golden = [c for c in COMPONENTS if (folder / "golden" / f"{c}_io.npz").is_file()]
    if not golden:
        return {"status": NOT_RUN, "why": "no golden/<component>_io.npz in the bundle"}
    table = load_tolerances(folder / "golden")
    rows, limits, rules, errors = [], {}, {}, {}
    for component in golden:
        precision = precision_of("htp", suffixes.for_component(component))
        limits[component] = parity_limit(component, suffixes.for_component(component), table)
        rules[component] = table.limits(component, precision).describe()
        try:
            rows += component_parity(folder / "golden", pipeline.run_component,
                                     pipeline.contracts, components=[component], table=table,
                                     precision=precision)
        except Exception as exc:
            errors[component] = _error(exc)
            rows.append(ParityRow(component, "(all)", (), float("nan"), float("inf"), 0.0,
                                  False, _error(exc)))
            if isinstance(exc, WorkerFailed):
                pipeline.restart()
    return {"status": PASS if all(r.passed for r in rows) else FAIL, "rows": _rows(rows),
            "limits": limits, "rules": rules, "errors": errors}


def _trace_parity(bundle, pipeline, suffixes) -> dict:
    from ..bundle.golden import TRACE_FILES
    from ..policy import Policy, e2e_parity

    traces = [t for t in TRACE_FILES if (bundle.root / "golden" / t).is_file()]
    if not traces:
        return {"status": NOT_RUN, "why": "no golden/e2e_trace*.npz"}
    policy = Policy(bundle, pipeline, backend="htp", suffixes=suffixes)
    table = load_tolerances(bundle.root / "golden")
    rows = [r for t in traces
            for r in e2e_parity(policy, bundle.root / "golden" / t, table=table)]
    return {"status": PASS if all(r.passed for r in rows) else FAIL, "rows": _rows(rows),
            "limit": table.limits("e2e", policy.precision()).describe()}


def _latency(pipeline, variant, chunks: int) -> dict:
    """Per component over ``chunks`` chunks: the orchestrator's time, and inside the worker
    the library's NPU execute time apart from its copies/conversions and ours."""
    x0 = np.zeros((1, variant.horizon, variant.max_action_dim), np.float32)
    samples: dict[str, list[float]] = {}
    for i in range(chunks + 1):  # the first chunk warms up and is not counted
        if i == 1:
            pipeline.session_timings()  # drop the warm-up's calls
        start = time.perf_counter()
        pipeline.run_vision()
        pipeline.run_action(x0, variant.default_flow_steps)
        wall = (time.perf_counter() - start) * 1e3
        if i:
            for key, value in {**pipeline.last_timings_ms, "chunk": wall}.items():
                samples.setdefault(key, []).append(value)
    calls = {}
    stats = pipeline.load_stats()
    elements = {c: n for s in stats.values() for c, n in s.get("float_elements", {}).items()}
    for component, entries in pipeline.session_timings().items():
        arr = np.asarray(entries, np.float64)
        call, inference, execute = arr[:, 0], arr[:, 1], arr[:, 2] / 1e3
        reported = bool(np.any(execute > 0))
        library = inference - execute if reported else np.full_like(inference, np.nan)
        row = {
            "calls": int(arr.shape[0]),
            "worker_ms": float(np.median(call)),
            "library_ms": float(np.median(inference)),
            "npu_execute_ms": float(np.median(execute)) if reported else None,
            "library_copies_ms": float(np.median(library)) if reported else None,
            "our_copies_ms": float(np.median(call - inference)),
            "execute_constant": bool(reported and arr.shape[0] > 2 and np.ptp(execute) == 0),
            "float_elements": int(elements.get(component, 0)),
        }
        if row["float_elements"] and reported:
            # float I/O: the library's copies include its per-element conversion
            row["float_conversion_ms"] = row["library_copies_ms"]
            row["ns_per_element"] = 1e6 * row["library_copies_ms"] / row["float_elements"]
        calls[component] = row
    return {"status": PASS, "flow_steps": variant.default_flow_steps,
            "ms": {k: _stats(v) for k, v in samples.items()}, "calls": calls}


def ab_table(sections: list[dict]) -> list[dict]:
    """One row per suffix choice of a variant: parity, latency, load memory; the fastest
    choice whose parity passes is marked."""
    rows = []
    for s in sections:
        parity = [s[k]["status"] for k in ("component_parity", "seed_e2e", "e2e_parity")]
        ran = [p for p in parity if p != NOT_RUN]
        passed = bool(ran) and all(p == PASS for p in ran)
        ms = s["latency"].get("ms", {}).get("chunk")
        cosines = [r["cosine"] for r in s["component_parity"].get("rows", [])]
        rows.append({
            "choice": s["choice"], "suffixes": s["suffixes"],
            "parity": PASS if passed else (FAIL if ran else NOT_RUN),
            "min_cosine": min(cosines) if cosines else None,
            "final_action_cosine": s["seed_e2e"].get("cosine"),
            "chunk_p50_ms": ms["p50"] if ms else None, "chunk_p95_ms": ms["p95"] if ms else None,
            "peak_rss_mib": s["load"].get("peak_rss_mib_total"),
            "fastest_passing": False,
        })
    timed = [r for r in rows if r["parity"] == PASS and r["chunk_p50_ms"] is not None]
    if timed:
        min(timed, key=lambda r: r["chunk_p50_ms"])["fastest_passing"] = True
    return rows


# -- the whole report ---------------------------------------------------------------------------
class ReportFiles:
    """The Markdown file and its JSON twin (``OUT.json``), replaced atomically on each write."""

    def __init__(self, out: Path, force: bool) -> None:
        self.markdown = out
        self.json = out.with_name(out.name + ".json")
        if out.suffix.lower() == ".json":
            raise BundleError(f"--out {out} names the Markdown file (the JSON goes next to it as "
                              f"{self.json.name}); give e.g. {out.with_suffix('.md')}")
        if out.is_dir():
            raise BundleError(f"--out {out} is a folder; give a file name such as "
                              f"{out / 'device-report.md'}")
        parent = out.parent if str(out.parent) else Path(".")
        if not parent.is_dir():
            raise BundleError(f"--out {out}: the folder {parent} does not exist; create it "
                              "first")
        if not os.access(parent, os.W_OK):
            raise BundleError(f"--out {out}: the folder {parent} is not writable")
        existing = [str(p) for p in (self.markdown, self.json) if p.exists()]
        if existing and not force:
            raise BundleError(f"{' and '.join(existing)} already exist; give another --out or "
                              "--force to replace them")

    def write(self, report: dict) -> None:
        for path, text in ((self.json, json.dumps(report, indent=1, default=str)),
                           (self.markdown, to_markdown(report))):
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)


def build_report(root: Path, chunks: int = MIN_CHUNKS, timeout_s: float = 60.0, *,
                 bag: Path | None = None, golden: Path | None = None,
                 variant: str | None = None, ignore_bundle_libs: bool = False,
                 choices: str = "all", perf_profile: str = "BURST",
                 load_order: str = "parallel", files: ReportFiles | None = None,
                 progress: Callable[[str], None] | None = None) -> dict:
    from ..bundle.bundle import Bundle, resolve_bundles
    from .doctor import (
        check_cdsprpc,
        check_fastrpc_nodes,
        check_library_paths,
        check_numpy_for_ros,
        check_platform,
        check_qai,
        check_qnn_runtime,
        probe_qai_appbuilder,
    )

    say = progress or (lambda line: None)
    bundles = resolve_bundles(root, variant)  # the one resolver every command uses
    probe = probe_qai_appbuilder()
    checks = [check_platform(), check_qai(probe), check_qnn_runtime(probe), check_cdsprpc(),
              check_fastrpc_nodes(), check_library_paths(probe), check_numpy_for_ros()]
    opts = {"chunks": chunks, "timeout_s": timeout_s, "ignore_bundle_libs": ignore_bundle_libs,
            "perf_profile": perf_profile, "load_order": load_order}
    report = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "bundle_root": str(root),
        "settings": {**opts, "variant": variant, "choices": choices,
                     "parity_limits": PARITY_LIMITS},
        "platform": platform_facts(probe),
        "doctor": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix}
                   for c in checks],
        "variants": {},
        "sections": [],
        "ab": {},
        "replay": {"status": NOT_RUN, "why": "no golden chunk bag given; the end-to-end "
                   "checks in each section stand in for it"},
        "progress": "running",
    }
    plan = []
    for name, folder in bundles:
        bundle = Bundle.open(folder, name)
        picked = suffix_choices(bundle, choices)
        report["variants"][name] = {
            "bundle": str(folder), "choices": [label for label, _ in picked],
            "norm_stats": norm_stats_facts(bundle),
            "libraries": library_facts(bundle, ignore_bundle_libs)}
        plan += [(name, bundle, label, groups) for label, groups in picked]
    total = len(plan) + (1 if bag is not None else 0)

    def save() -> None:
        if files is not None:
            files.write(report)

    save()
    for index, (name, bundle, label, groups) in enumerate(plan, 1):
        section = Section(name, bundle.root, label, groups)
        report["sections"].append(section.data)
        say(f"[{index}/{total}] {name} {label}: load, parity, latency ...")
        start = time.perf_counter()
        try:
            run_section(section, bundle, probe, opts)
        except Exception as exc:  # outside any step: still recorded, the report goes on
            section.data["error"] = _error(exc)
            section.data["traceback"] = traceback.format_exc(limit=4)
        bad = [k for k in STEPS if section.data[k]["status"] == FAIL]
        section.data["status"] = FAIL if bad or "error" in section.data else PASS
        report["ab"] = {n: ab_table([s for s in report["sections"] if s["variant"] == n])
                        for n in report["variants"]}
        save()
        say(f"[{index}/{total}] {name} {label}: {section.data['status']}"
            + (f" ({', '.join(bad)} failed)" if bad else "")
            + (f" (section error: {section.data['error']})" if "error" in section.data else "")
            + f", {time.perf_counter() - start:.1f} s")
    if bag is not None and golden is not None:
        say(f"[{total}/{total}] replay {bag} against {golden} ...")
        try:
            report["replay"] = run_replay_check(root, bag, golden, probe)
        except Exception as exc:
            report["replay"] = {"status": FAIL, "error": _error(exc)}
        say(f"[{total}/{total}] replay: {report['replay']['status']}")
    report["progress"] = "complete"
    save()
    return report


def failed(report: dict) -> list[str]:
    """Names of everything that ran and failed (doctor lines, norm stats, section steps)."""
    bad = [f"doctor {c['name']}" for c in report["doctor"] if c["status"] == FAIL]
    for name, facts in report.get("variants", {}).items():
        if facts["norm_stats"]["status"] == FAIL:
            bad.append(f"{name} norm_stats.json")
    for s in report["sections"]:
        label = f"{s['variant']} {s['choice']}"
        if "error" in s:
            bad.append(f"{label} (section)")
        for key in STEPS:
            if s[key]["status"] == FAIL:
                bad.append(f"{label} {key}")
    if report["replay"]["status"] == FAIL:
        bad.append("replay against the golden chunk bag")
    return bad


def _fmt(value, spec: str = ".2f", none: str = "n/a") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return none
    return format(value, spec)


def _step_line(title: str, part: dict) -> str:
    why = part.get("error") or part.get("why") or ""
    extra = f"; {part['recovered']}" if part.get("recovered") else ""
    return f"- {title}: **{part['status']}** {why}{extra}".rstrip()


def _section_markdown(s: dict) -> list[str]:
    suffixes = ", ".join(f"{g}={v or 'fp16'}" for g, v in s["suffixes"].items())
    lines = ["", f"## {s['variant']} {s['choice']}", "", f"Suffixes: {suffixes}. Section: "
             f"**{s['status']}**" + (f" ({s['error']})" if "error" in s else ""), ""]
    load = s["load"]
    if load["status"] != PASS:
        lines.append(_step_line("load", load))
    else:
        lines += [f"NPU sessions opened: {load['npu_sessions']}; perf profile "
                  f"{load['perf_profile']}; load order {load['load_order']}; k_ctx/v_ctx "
                  f"{load['kv_ctx_shape']}", "",
                  "| worker | sessions | load (s) | peak RSS (MiB) | fixed-point I/O | float I/O "
                  "elements/call |", "|---|---|---|---|---|---|"]
        for w, st in load["workers"].items():
            fixed = ", ".join(f"{c}: {len(t)}" for c, t in st.get("fixed_point", {}).items()
                              if t) or "none"
            floats = ", ".join(f"{c}: {n}" for c, n in st.get("float_elements", {}).items()
                               if n) or "none (native)"
            lines.append(f"| {w} | {st['sessions']} | {_fmt(st.get('load_s'))} "
                         f"| {_fmt(st.get('peak_rss_mib'), '.1f')} | {fixed} | {floats} |")
        lines.append("")
    part = s["component_parity"]
    if "rows" in part:
        rows = part["rows"]
        worst = min(rows, key=lambda r: r["cosine"] if r["cosine"] == r["cosine"] else -1)
        lines.append(f"- component parity: **{part['status']}**, {sum(r['passed'] for r in rows)}"
                     f"/{len(rows)} rows, min cosine {_fmt(worst['cosine'], '.6f')} "
                     f"({worst['stage']} {worst['tensor']}); limits "
                     + ", ".join(f"{c} {v}" for c, v in part["limits"].items()))
        lines += [f"  - FAIL {r['stage']} {r['tensor']}: {r.get('failed') or r.get('note')} "
                  f"(cosine {_fmt(r['cosine'], '.6f')}, within {r['within_tol']:.1%})"
                  for r in rows if not r["passed"]]
    else:
        lines.append(_step_line("component parity", part))
    seed = s["seed_e2e"]
    if "cosine" in seed:
        ref = seed["reference_cosine"]
        lines.append(f"- seed end to end (trace.json + step0_boundary.npz, {seed['flow_steps']} "
                     f"flow steps): **{seed['status']}**, final-action cosine "
                     f"{_fmt(seed['cosine'], '.6f')} (reference runtime: {_fmt(ref, '.6f')}; "
                     f"needs >= {seed['threshold']:.6f})")
    else:
        lines.append(_step_line("seed end to end", seed))
    part = s["e2e_parity"]
    if "rows" in part:
        rows = part["rows"]
        lines.append(f"- end-to-end trace parity: **{part['status']}**, "
                     f"{sum(r['passed'] for r in rows)}/{len(rows)} rows")
        lines += [f"  - FAIL {r['stage']} {r['tensor']}: {r.get('failed') or r.get('note')} "
                  f"(cosine {_fmt(r['cosine'], '.6f')}, within {r['within_tol']:.1%})"
                  for r in rows if not r["passed"]]
    else:
        lines.append(_step_line("end-to-end trace parity", part))
    lat = s["latency"]
    if "ms" not in lat:
        lines.append(_step_line("latency", lat))
        return lines
    n = next(iter(lat["ms"].values()))["n"]
    lines += ["", f"Latency, ms over {n} chunks ({lat['flow_steps']} flow steps; action_step = "
              "all steps):", "", "| component | mean | p50 | p95 |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['mean']:.2f} | {v['p50']:.2f} | {v['p95']:.2f} |"
              for k, v in lat["ms"].items()]
    lines += ["", "Per call, median ms: the NPU execute time as the library reports it "
              "(getProfilingEvent EXECUTE), the library's copies and float conversions around "
              "it, and the worker's own copies:", "",
              "| session | calls | in worker | in library | NPU execute | library copies "
              "+ conversion | our copies | float elements | ns/element |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c, r in lat.get("calls", {}).items():
        note = " (constant: check the library's event)" if r.get("execute_constant") else ""
        lines.append(f"| {c} | {r['calls']} | {r['worker_ms']:.3f} | {r['library_ms']:.3f} | "
                     f"{_fmt(r['npu_execute_ms'], '.3f')}{note} | "
                     f"{_fmt(r['library_copies_ms'], '.3f')} | {r['our_copies_ms']:.3f} | "
                     f"{r['float_elements'] or '-'} | "
                     f"{_fmt(r.get('ns_per_element'), '.1f', '-')} |")
    return lines


def to_markdown(report: dict) -> str:
    lines = [f"# molmoact2 device report ({report['created']})", "",
             f"Bundle root: `{report['bundle_root']}`"
             + (" (in progress: sections still running or interrupted)"
                if report.get("progress") != "complete" else ""), "",
             "## Platform", "", "| fact | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report["platform"].items()]
    lines += ["", "## Doctor (machine)", "", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {c['detail']}"
              + (f" (fix: {c['fix']})" if c["status"] == FAIL and c["fix"] else "") + " |"
              for c in report["doctor"]]
    for name, facts in report.get("variants", {}).items():
        ns = facts["norm_stats"]
        lines += ["", f"## {name}: files", "",
                  f"- norm stats: {ns['path']}" if ns["status"] == PASS else
                  f"- norm stats: **missing**: {ns['why']}; fix: {ns['fix']}"]
        for lib, info in facts["libraries"].items():
            lines.append(f"- {lib}: {info['path']} (QAIRT {', '.join(info['versions'])}), "
                         + ("used" if info["used"] else "ignored (--ignore-bundle-libs): the "
                            "wheel's own runtime serves"))
        lines.append(f"- suffix choices: {', '.join(facts['choices'])}")
    for s in report["sections"]:
        lines += _section_markdown(s)
    for name, rows in report.get("ab", {}).items():
        if not rows:
            continue
        lines += ["", f"## {name}: suffix A/B", "",
                  "| choice | vision | llm | action_step | parity | min cosine | final-action "
                  "cosine | chunk p50 (ms) | chunk p95 (ms) | load peak RSS (MiB) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            mark = " **fastest passing**" if r["fastest_passing"] else ""
            sx = r["suffixes"]
            lines.append(f"| {r['choice']}{mark} | {sx['vision'] or 'fp16'} | "
                         f"{sx['llm'] or 'fp16'} | {sx['action'] or 'fp16'} | {r['parity']} | "
                         f"{_fmt(r['min_cosine'], '.6f')} | "
                         f"{_fmt(r['final_action_cosine'], '.6f')} | "
                         f"{_fmt(r['chunk_p50_ms'])} | {_fmt(r['chunk_p95_ms'])} | "
                         f"{_fmt(r['peak_rss_mib'], '.1f')} |")
    rep = report["replay"]
    if "summary" in rep:
        sm = rep["summary"]
        worst = sm["worst"] or {}
        lines += ["", "## Replay against a golden chunk bag", "",
                  f"`{rep['bag']}` against `{rep['golden']}` ({rep['variant']}, htp): "
                  f"**{rep['status']}**, {sm['passed']}/{sm['compared']} chunks pass, "
                  f"{sm['missing']} missing, {sm['extra']} extra"
                  + (f", worst cosine {worst.get('cosine', float('nan')):.6f}" if worst else ""),
                  ""]
    else:
        why = rep.get("why") or rep.get("error", "")
        lines += ["", f"Replay against a golden chunk bag: {rep['status']} ({why})", ""]
    bad = failed(report)
    lines.append(f"**{len(bad)} failed**: " + ", ".join(bad) if bad else "**Nothing failed.**")
    return "\n".join(lines) + "\n"


def cmd_device_report(args: argparse.Namespace) -> int:
    from ..bundle.bundle import resolve_bundles
    from .args import SUFFIX_ENV

    if (args.bag is None) != (args.golden is None):
        raise BundleError("give --bag and --golden together: the bag recorded on the robot and "
                          "the golden chunk bag made from it with 'replay --record'")
    # everything that can be wrong with the command line is found before the first section
    from .args import check_paths

    check_paths([("--out", args.out), ("--out JSON", Path(args.out).with_suffix(".json"))],
                [("bundle root", args.bundle_root), ("--bag", args.bag),
                 ("--golden", args.golden)])
    root = Path(args.bundle_root).expanduser()
    resolve_bundles(root, args.variant)
    files = ReportFiles(Path(args.out).expanduser(), args.force)
    bag = golden = None
    if args.bag is not None:
        from ..replay.chunkbag import read_chunk_bag

        bag, golden = Path(args.bag).expanduser(), Path(args.golden).expanduser()
        if not bag.exists():
            raise BundleError(f"--bag {bag} does not exist")
        read_chunk_bag(golden)  # a missing or unreadable golden is refused now, not at the end
    env = {v: os.environ[v] for v in SUFFIX_ENV if v in os.environ}
    if env:
        print("notice: " + ", ".join(f"{k}={v!r}" for k, v in env.items()) + " (the reference "
              "runtime's switches) are not needed here: the report runs every suffix choice "
              "(fp16, each group's quantised suffix alone, all together) and marks the fastest "
              "that passes; set it on the node with context_suffix.vision|llm|action",
              file=sys.stderr)

    def say(line: str) -> None:
        print(f"device-report {line}", file=sys.stderr, flush=True)

    report = build_report(root, args.chunks, args.timeout, bag=bag, golden=golden,
                          variant=args.variant, ignore_bundle_libs=args.ignore_bundle_libs,
                          choices=args.choices, perf_profile=args.perf_profile,
                          load_order=args.load_order, files=files, progress=say)
    bad = failed(report)
    print(f"wrote {files.markdown} and {files.json}: {len(report['sections'])} sections, "
          + (f"{len(bad)} failed: {', '.join(bad)}" if bad else "nothing failed"))
    return 1 if bad else 0


def register(subparsers) -> None:
    """Add ``molmoact2 device-report`` to the CLI."""
    from ..bundle.variants import VARIANTS
    from ..runtime.supervisor import LOAD_ORDERS
    from .args import example, float_in, int_at_least

    p = subparsers.add_parser(
        "device-report", help="one Markdown + JSON report of this machine and the bundles",
        description="For a first run on the board: platform facts, doctor's machine checks, "
        "then for every variant and\nsuffix choice under BUNDLE_ROOT (fp16, each group's "
        "quantised suffix alone, all together) the load,\ncomponent parity, the seed's and the "
        "traces' end-to-end checks and the latency table, and a\nsuffix A/B table; with "
        "--bag/--golden also a replay against a golden chunk bag. The report is\nwritten "
        "before the first section and after each; one status line per section on stderr.\n"
        "Exit 1 if anything that ran failed.",
        epilog=example("molmoact2 device-report /data/molmoact2 --out report.md",
                       "molmoact2 device-report SEED_WS --variant grid_sampler "
                       "--ignore-bundle-libs",
                       "molmoact2 --appbuilder fake device-report .cache/tiny-bundle"))
    p.add_argument("bundle_root", help="folder with one bundle per variant, or one bundle "
                   "(a seed workspace without bundle.json needs --variant)")
    p.add_argument("--variant", choices=list(VARIANTS), default=None,
                   help="the variant of a bundle folder without bundle.json, or the one variant "
                   "of a root to report on (default: every variant found)")
    p.add_argument("--out", default="device-report.md",
                   help="Markdown file; the JSON twin is OUT.json next to it")
    p.add_argument("--force", action="store_true",
                   help="replace OUT and OUT.json when they exist")
    p.add_argument("--ignore-bundle-libs", action="store_true",
                   help="leave a bundle's qnn_libs/ and dsp_libs/ unused (the wheel's own QNN "
                   "runtime serves), e.g. a seed workspace's QAIRT 2.47 folders under the "
                   "2.51.40 wheel")
    p.add_argument("--choices", choices=("all", "sets"), default="all",
                   help="suffix choices per variant: all (fp16, each group's quantised suffix "
                   "alone, all together) or sets (fp16 and whole quantised sets only)")
    p.add_argument("--chunks", type=int_at_least(MIN_CHUNKS), default=MIN_CHUNKS,
                   help="chunks timed per section (at least 20, for a p95)")
    p.add_argument("--timeout", type=float_in(0.0, 3600.0, low_open=True), default=60.0,
                   help="deadline per worker call, s")
    p.add_argument("--perf-profile", choices=("BURST", "HIGH_PERFORMANCE", "DEFAULT"),
                   default="BURST", help="the HTP performance vote of every worker")
    p.add_argument("--load-order", choices=list(LOAD_ORDERS), default="parallel",
                   help="how the workers load their contexts (sequential: largest first)")
    p.add_argument("--bag", help="a bag recorded on the robot, replayed on the HTP (with --golden)")
    p.add_argument("--golden", help="the golden chunk bag made from --bag on a workstation "
                   "('molmoact2 replay BAG --backend onnx --record GOLDEN')")
    p.set_defaults(func=cmd_device_report)
