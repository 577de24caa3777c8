"""One device-report section: a variant with one suffix choice, its steps (load, component
parity, the seed's end to end, the traces' end to end, latency) each guarded, so a failing
step is recorded with why and the next ones still run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..bundle.comparison import PARITY_DEFAULTS, ToleranceTable, load_tolerances, precision_of
from ..bundle.variants import ACTION_STEP, COMPONENTS, SET_GROUPS, SUFFIX_GROUPS
from ..errors import WorkerFailed
from .latency import chunk_latency
from .seed import FINAL_ACTION_MIN_COSINE, seed_conventions, seed_e2e
from .status import FAIL, NOT_RUN, PASS, error

STEPS = ("load", "component_parity", "seed_e2e", "e2e_parity", "latency")
#: Parity limits per precision (``bundle/comparison.py``, the one comparison every check uses;
#: a bundle's ``golden/tolerances.json`` refines them per component).
PARITY_LIMITS = {p: lim.to_json() for p, lim in PARITY_DEFAULTS.items()}




def parity_limit(component: str, suffix: str, table: ToleranceTable | None = None) -> float:
    """The minimum cosine of ``component``'s golden parity with context suffix ``suffix``."""
    return (table or ToleranceTable()).limits(component, precision_of("htp", suffix)).min_cosine


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


def _rows(rows) -> list[dict]:
    return [{"stage": r.stage, "tensor": r.tensor, "shape": list(r.shape), "cosine": r.cosine,
             "max_abs": r.max_abs, "within_tol": r.within_tol, "passed": r.passed,
             "note": r.note, "failed": r.failed,
             "limits": r.limits.to_json() if r.limits is not None else None}
            for r in rows]


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
            self.data[key] = {"status": FAIL, "error": error(exc)}
            if isinstance(exc, WorkerFailed) and pipeline is not None:
                try:
                    pipeline.restart()
                    self.data[key]["recovered"] = "the workers were restarted for the next steps"
                except Exception as again:
                    self.data[key]["recovered"] = f"restart failed: {error(again)}"
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
        section.step("latency", lambda: chunk_latency(pipeline, bundle.variant, opts["chunks"]),
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
            errors[component] = error(exc)
            rows.append(ParityRow(component, "(all)", (), float("nan"), float("inf"), 0.0,
                                  False, error(exc)))
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


