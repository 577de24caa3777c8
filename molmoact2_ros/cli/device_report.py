"""``molmoact2 device-report BUNDLE_ROOT``: one Markdown + JSON report of a first run on the board.

For whoever first has the IQ-9075: platform facts (OS, glibc, kernel, QNN and qai_appbuilder
versions), doctor's machine checks, then for every variant under BUNDLE_ROOT and every context
suffix it ships: the load (time and peak RSS per worker, fixed-point tensors, NPU sessions),
per-component golden parity on the HTP, end-to-end parity over the traces, and per-component
latency (mean, p50, p95 over >= 20 chunks). What cannot run here is marked "not run" with why.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from ..bundle.variants import (
    ACTION_STEP,
    COMPONENTS,
    SET_GROUPS,
    SUFFIX_GROUPS,
    get_variant,
)
from ..errors import BundleError, MolmoActError

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "not run"
MIN_CHUNKS = 20
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
    from ..replay.chunkbag import COMPARED_SETTINGS, read_chunk_bag
    from ..replay.replay import replay

    golden = read_chunk_bag(golden_path)
    changes = {k: golden.settings[k] for k in COMPARED_SETTINGS if k in golden.settings}
    changes.update(bundle_parameters(root), backend="htp")
    ok, reason = validate_changes(changes, Settings())
    if not ok:
        raise BundleError(f"golden {golden_path}: {reason}")
    result = replay(bag, Settings().with_changes(changes))
    produced = {p.chunk.observation_stamp_ns: p.actions for p in result.published}
    summary = match_chunks(produced, golden.chunks, default_tolerance("htp"))
    return {"status": PASS if summary.ok else FAIL, "bag": str(bag), "golden": str(golden_path),
            "variant": changes.get("variant"), "drops": dict(result.drops),
            "summary": summary.to_json()}


def suffixes_in(bundle) -> list[str]:
    """Suffixes whose contexts exist for every suffix-selected component ("" first)."""
    found = set()
    ctx = bundle.root / "ctx"
    grouped = [c for g in SET_GROUPS for c in SUFFIX_GROUPS[g]]
    tail = bundle.variant.context_file(ACTION_STEP, "")[len(ACTION_STEP):]
    for path in ctx.glob(f"{ACTION_STEP}*{tail}") if ctx.is_dir() else ():
        suffix = path.name[len(ACTION_STEP) : -len(tail)]
        if all(bundle.context_path(c, suffix).is_file() for c in grouped):
            found.add(suffix)
    return sorted(found, key=lambda s: (s != "", s))


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, np.float64)
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)),
            "p95": float(np.percentile(arr, 95)), "n": int(arr.size)}


def _rows(rows) -> list[dict]:
    return [{"stage": r.stage, "tensor": r.tensor, "shape": list(r.shape), "cosine": r.cosine,
             "max_abs": r.max_abs, "within_tol": r.within_tol, "passed": r.passed}
            for r in rows]


def run_section(name: str, folder: Path, suffix: str, probe: dict, chunks: int,
                timeout_s: float) -> dict:
    """Load, parity and latency of one variant with one suffix on the HTP backend."""
    from ..bundle.bundle import Suffixes

    section: dict = {"variant": name, "suffix": suffix or "(fp16)", "bundle": str(folder)}
    steps = ("load", "component_parity", "e2e_parity", "latency")
    if "error" in probe:
        why = f"qai_appbuilder is not importable here ({probe['error']})"
        section.update({k: {"status": NOT_RUN, "why": why} for k in steps})
        return section
    from ..bundle.golden import TRACE_FILES, component_parity
    from ..policy import Policy, e2e_parity

    suffixes = Suffixes(vision=suffix, llm=suffix, action=suffix)
    try:
        policy = Policy.load(folder, name, backend="htp", suffixes=suffixes,
                             pipeline_options={"call_timeout_s": timeout_s})
    except MolmoActError as exc:
        section["load"] = {"status": FAIL, "error": str(exc)}
        section.update({k: {"status": NOT_RUN, "why": "the contexts did not load"}
                        for k in steps[1:]})
        return section
    with policy:
        pipeline = policy.pipeline
        stats = pipeline.load_stats()
        sessions = sum(len(s["sessions"].split("+")) for s in stats.values())
        section["load"] = {"status": PASS, "workers": stats, "npu_sessions": sessions}
        golden = [c for c in COMPONENTS if (folder / "golden" / f"{c}_io.npz").is_file()]
        if golden:
            rows = component_parity(folder / "golden", pipeline.run_component,
                                    pipeline.contracts, components=golden)
            section["component_parity"] = {
                "status": PASS if all(r.passed for r in rows) else FAIL, "rows": _rows(rows)}
        else:
            section["component_parity"] = {"status": NOT_RUN,
                                           "why": "no golden/<component>_io.npz in the bundle"}
        traces = [t for t in TRACE_FILES if (folder / "golden" / t).is_file()]
        if traces:
            rows = [r for t in traces for r in e2e_parity(policy, folder / "golden" / t)]
            section["e2e_parity"] = {
                "status": PASS if all(r.passed for r in rows) else FAIL, "rows": _rows(rows)}
        else:
            section["e2e_parity"] = {"status": NOT_RUN, "why": "no golden/e2e_trace*.npz"}
        section["latency"] = _latency(pipeline, get_variant(name), chunks)
    return section


def _latency(pipeline, variant, chunks: int) -> dict:
    x0 = np.zeros((1, variant.horizon, variant.max_action_dim), np.float32)
    samples: dict[str, list[float]] = {}
    for i in range(chunks + 1):  # the first chunk warms up and is not counted
        start = time.perf_counter()
        pipeline.run_vision()
        pipeline.run_action(x0, variant.default_flow_steps)
        wall = (time.perf_counter() - start) * 1e3
        if i:
            for key, value in {**pipeline.last_timings_ms, "chunk": wall}.items():
                samples.setdefault(key, []).append(value)
    return {"status": PASS, "flow_steps": variant.default_flow_steps,
            "ms": {k: _stats(v) for k, v in samples.items()}}


def build_report(root: Path, chunks: int = MIN_CHUNKS, timeout_s: float = 60.0, *,
                 bag: Path | None = None, golden: Path | None = None) -> dict:
    from ..bundle.bundle import resolve_bundles
    from .doctor import (
        check_cdsprpc,
        check_fastrpc_nodes,
        check_library_paths,
        check_platform,
        check_qai,
        check_qnn_runtime,
        probe_qai_appbuilder,
    )

    bundles = resolve_bundles(root)  # the one resolver every command uses
    from ..bundle.bundle import Bundle
    from ..util.progress import progress

    plan = [(name, folder, suffix) for name, folder in bundles
            for suffix in suffixes_in(Bundle.open(folder, name)) or [""]]
    steps = ["machine checks", *plan, *(["replay"] if bag is not None and golden is not None
                                        else [])]
    shown = progress(steps, "device-report", label=lambda s: s if isinstance(s, str) else
                     f"{s[0]} {s[2] or '(fp16)'}: load, parity, latency")
    next(shown)
    probe = probe_qai_appbuilder()
    checks = [check_platform(), check_qai(probe), check_qnn_runtime(probe), check_cdsprpc(),
              check_fastrpc_nodes(), check_library_paths(probe)]
    report = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "bundle_root": str(root),
        "platform": platform_facts(probe),
        "doctor": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix}
                   for c in checks],
        "sections": [],
        "replay": {"status": NOT_RUN, "why": "no golden chunk bag given; the end-to-end "
                   "trace comparison in each section stands in for it"},
    }
    for step in shown:
        if step == "replay":
            report["replay"] = run_replay_check(root, bag, golden, probe)
        else:
            name, folder, suffix = step
            report["sections"].append(run_section(name, folder, suffix, probe, chunks,
                                                  timeout_s))
    return report


def failed(report: dict) -> list[str]:
    """Names of everything that ran and failed (doctor lines, section steps)."""
    bad = [f"doctor {c['name']}" for c in report["doctor"] if c["status"] == FAIL]
    for s in report["sections"]:
        for key in ("load", "component_parity", "e2e_parity", "latency"):
            if s[key]["status"] == FAIL:
                bad.append(f"{s['variant']}{s['suffix']} {key}")
    if report["replay"]["status"] == FAIL:
        bad.append("replay against the golden chunk bag")
    return bad


def to_markdown(report: dict) -> str:
    lines = [f"# molmoact2 device report ({report['created']})", "",
             f"Bundle root: `{report['bundle_root']}`", "", "## Platform", "",
             "| fact | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report["platform"].items()]
    lines += ["", "## Doctor (machine)", "", "| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {c['detail']}"
              + (f" (fix: {c['fix']})" if c["status"] == FAIL and c["fix"] else "") + " |"
              for c in report["doctor"]]
    for s in report["sections"]:
        lines += ["", f"## {s['variant']} {s['suffix']}", ""]
        load = s["load"]
        if load["status"] != PASS:
            lines.append(f"- load: **{load['status']}** {load.get('error') or load.get('why')}")
        else:
            lines += [f"NPU sessions: {load['npu_sessions']}", "",
                      "| worker | sessions | load (s) | peak RSS (MiB) | fixed-point I/O |",
                      "|---|---|---|---|---|"]
            for w, st in load["workers"].items():
                fixed = ", ".join(f"{c}: {len(t)}" for c, t in st.get("fixed_point", {}).items()
                                  if t) or "none"
                lines.append(f"| {w} | {st['sessions']} | {st.get('load_s', float('nan')):.2f} "
                             f"| {st.get('peak_rss_mib', float('nan')):.1f} | {fixed} |")
        for key, title in (("component_parity", "component parity"),
                           ("e2e_parity", "end-to-end parity")):
            part = s[key]
            if "rows" not in part:
                lines.append(f"- {title}: {part['status']} ({part.get('why', '')})")
                continue
            rows = part["rows"]
            worst = min(rows, key=lambda r: r["cosine"])
            lines.append(f"- {title}: **{part['status']}**, {sum(r['passed'] for r in rows)}/"
                         f"{len(rows)} rows, min cosine {worst['cosine']:.6f} "
                         f"({worst['stage']} {worst['tensor']})")
            lines += [f"  - FAIL {r['stage']} {r['tensor']} cosine {r['cosine']:.6f}"
                      for r in rows if not r["passed"]]
        lat = s["latency"]
        if "ms" not in lat:
            lines.append(f"- latency: {lat['status']} ({lat.get('why', '')})")
        else:
            lines += ["", f"Latency, ms over {next(iter(lat['ms'].values()))['n']} chunks "
                      f"({lat['flow_steps']} flow steps; action_step = all steps):", "",
                      "| component | mean | p50 | p95 |", "|---|---|---|---|"]
            lines += [f"| {k} | {v['mean']:.2f} | {v['p50']:.2f} | {v['p95']:.2f} |"
                      for k, v in lat["ms"].items()]
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
        lines += ["", f"Replay against a golden chunk bag: {rep['status']} ({rep['why']})", ""]
    bad = failed(report)
    lines.append(f"**{len(bad)} failed**: " + ", ".join(bad) if bad else "**Nothing failed.**")
    return "\n".join(lines) + "\n"


def cmd_device_report(args: argparse.Namespace) -> int:
    if (args.bag is None) != (args.golden is None):
        raise BundleError("give --bag and --golden together: the bag recorded on the robot and "
                          "the golden chunk bag made from it with 'replay --record'")
    from .args import check_paths

    check_paths([("--out", args.out), ("--out JSON", Path(args.out).with_suffix(".json"))],
                [("bundle root", args.bundle_root), ("--bag", args.bag),
                 ("--golden", args.golden)])
    report = build_report(Path(args.bundle_root).expanduser(), args.chunks, args.timeout,
                          bag=args.bag and Path(args.bag), golden=args.golden and Path(args.golden))
    out = Path(args.out)
    out.write_text(to_markdown(report), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str),
                                        encoding="utf-8")
    bad = failed(report)
    print(f"wrote {out} and {out.with_suffix('.json')}: {len(report['sections'])} sections, "
          + (f"{len(bad)} failed: {', '.join(bad)}" if bad else "nothing failed"))
    return 1 if bad else 0


def register(subparsers) -> None:
    """Add ``molmoact2 device-report`` to the CLI."""
    from .args import example, float_in, int_at_least

    p = subparsers.add_parser(
        "device-report", help="one Markdown + JSON report of this machine and the bundles",
        description="For a first run on the board: platform facts, doctor's machine checks, "
        "then for every variant and\ncontext suffix under BUNDLE_ROOT the load, component and "
        "end-to-end parity on the HTP and the\nlatency table; with --bag/--golden also a "
        "replay against a golden chunk bag. One status line per\nstep on stderr (a bar on a "
        "terminal). Exit 1 if anything that ran failed.",
        epilog=example("molmoact2 device-report /data/molmoact2 --out report.md",
                       "molmoact2 --appbuilder fake device-report .cache/tiny-bundle"))
    p.add_argument("bundle_root", help="folder with one bundle per variant, or one bundle")
    p.add_argument("--out", default="device-report.md", help="Markdown file; JSON next to it")
    p.add_argument("--chunks", type=int_at_least(MIN_CHUNKS), default=MIN_CHUNKS,
                   help="chunks timed per section (at least 20, for a p95)")
    p.add_argument("--timeout", type=float_in(0.0, 3600.0, low_open=True), default=60.0,
                   help="deadline per worker call, s")
    p.add_argument("--bag", help="a bag recorded on the robot, replayed on the HTP (with --golden)")
    p.add_argument("--golden", help="the golden chunk bag made from --bag on a workstation "
                   "('molmoact2 replay BAG --backend onnx --record GOLDEN')")
    p.set_defaults(func=cmd_device_report)
