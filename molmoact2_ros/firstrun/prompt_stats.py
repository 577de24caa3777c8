"""Two things no parity check can show, for doctor, the device report and conventions: the
prompt budget (S, the fixed part, the tokens left for the task and, with LIBERO installed, how
many tasks of each suite fit) and whether the norm stats are valid and are the goldens' own."""

from __future__ import annotations

import numpy as np

from ..errors import MolmoActError
from .status import FAIL, PASS, SKIP

#: golden chunk vs its normalised actions de-normalised with the stats: relative to the range
GOLDEN_ACTION_TOL = 1e-3
#: how far outside [min, max] (in ranges) a golden state may lie before the stats are blamed
GOLDEN_STATE_MARGIN = 0.25


def budget_facts(bundle, *, suites: bool = True) -> dict:
    """The budget, and per LIBERO suite the tasks that fit, the longest and the S it needs."""
    from ..host.budget import budget_of, builder_for, suite_fits, table_lines

    try:
        builder = builder_for(bundle)
    except (MolmoActError, OSError) as exc:
        return {"status": SKIP, "why": f"no prompt to count ({exc})",
                "fix": "molmoact2 export-host CHECKPOINT BUNDLE writes host/"}
    budget = budget_of(builder)
    out = {"status": PASS, "budget": budget.to_json(), "line": budget.describe()}
    if budget.left <= 0:
        out.update(status=FAIL, fix="re-export the contexts with a longer S")
    instructions = None
    if suites:
        from ..sim.prompt_fit import libero_instructions

        instructions = libero_instructions()
    if instructions:
        fits = suite_fits(builder, instructions)
        out["suites"] = [f.to_json() for f in fits]
        out["table"] = table_lines(budget, fits)
    else:
        out["suites_why"] = "LIBERO is not installed (the sim extra): no per-suite table"
    return out


def budget_lines(bundle) -> list[str]:
    """The budget and, with LIBERO installed, the per-suite table (``conventions`` prints it)."""
    facts = budget_facts(bundle)
    return [f"prompt budget: {facts.get('line', facts.get('why'))}"
            + (f" ({facts['suites_why']})" if "suites_why" in facts else ""),
            *(f"   {line}" for line in facts.get("table", []))]


def budget_check(bundle, facts: dict | None = None):
    """Doctor's line: the budget, and the suites none of whose tasks fit."""
    from .machine import Check

    facts = facts or budget_facts(bundle)
    if facts["status"] == SKIP:
        return Check("prompt budget", SKIP, facts["why"])
    detail = facts["line"]
    none = [s["suite"] for s in facts.get("suites", []) if s["fit"] == 0]
    if facts.get("suites"):
        detail += "; LIBERO tasks that fit: " + ", ".join(
            f"{s['suite']} {s['fit']}/{s['tasks']}" for s in facts["suites"])
        need = max(s["seq_needed"] for s in facts["suites"])
        detail += f"; every suite fits S >= {need}"
    if none:
        detail += f" (no task of {', '.join(none)} fits: molmoact2 libero refuses them)"
    detail += "".join(f"\n      {line}" for line in facts.get("table", [])[:-1])
    return Check("prompt budget", facts["status"], detail, facts.get("fix", ""))


def norm_stats_facts(bundle) -> dict:
    """Valid (JSON, mode, mask, finite, the variant's widths, low <= high) and, where goldens
    exist, the goldens' own: their chunk is their normalised actions de-normalised with these
    stats, and their state lies in the stats' range."""
    path = bundle.norm_stats_path
    if not path.is_file():
        return {"status": FAIL, "path": str(path),
                "why": f"no norm_stats.json in {bundle.root} or {bundle.root / 'golden'}",
                "fix": "copy norm_stats.json from the checkpoint into the bundle (molmoact2 "
                "export-host does it): without it the node cannot normalise the state and "
                "de-normalise actions"}
    try:
        stats = bundle.norm_stats()
    except MolmoActError as exc:
        return {"status": FAIL, "path": str(path), "why": str(exc),
                "fix": "use the norm stats of the checkpoint the bundle was exported from "
                "(molmoact2 export-host writes them with their source)"}
    out = {"status": PASS, "path": str(path), "source": stats.source, "mode": stats.mode,
           "describe": stats.describe(), "golden": _golden_check(bundle, stats)}
    if out["golden"]["status"] == FAIL:
        out.update(status=FAIL, why=out["golden"]["why"],
                   fix="these are not the stats the goldens were made with: use the "
                   "checkpoint's own")
    return out


def _golden_check(bundle, stats) -> dict:
    from ..bundle.golden import TRACE_FILES, load_npz

    traces = [bundle.golden_path(t) for t in TRACE_FILES if bundle.golden_path(t).is_file()]
    if not traces:
        return {"status": SKIP, "why": "no golden/e2e_trace*.npz"}
    worst_action, worst_state, where = 0.0, 0.0, ""
    for trace_path in traces:
        trace = load_npz(trace_path)
        if "actions_normalized" in trace and "chunk" in trace:
            got = stats.action.denormalize(np.asarray(trace["actions_normalized"]))
            span = np.maximum(stats.action.q99 - stats.action.q01, 1e-6)
            err = float(np.max(np.abs(got - np.asarray(trace["chunk"])) / span))
            if err > worst_action:
                worst_action, where = err, trace_path.name
        if "state" in trace:
            s = np.asarray(trace["state"], np.float32).reshape(-1)
            if s.shape[0] == stats.state.width:
                lo, hi = stats.state.q01, stats.state.q99
                span = np.maximum(hi - lo, 1e-6)
                out = np.maximum(lo - s, s - hi) / span
                worst_state = max(worst_state, float(np.max(np.where(stats.state.mask, out, 0))))
    result = {"traces": len(traces), "action_error_of_range": round(worst_action, 6),
              "state_outside_range": round(max(worst_state, 0.0), 4)}
    if worst_action > GOLDEN_ACTION_TOL:
        return {**result, "status": FAIL,
                "why": f"{where}: its chunk differs from its normalised actions de-normalised "
                f"with these stats by {worst_action:.3g} of the range"}
    if worst_state > GOLDEN_STATE_MARGIN:
        return {**result, "status": FAIL,
                "why": f"the golden state lies {worst_state:.2f} ranges outside the stats'"}
    return {**result, "status": PASS}


def norm_stats_check(bundle, facts: dict | None = None):
    """Doctor's line for the norm stats."""
    from .machine import Check

    facts = facts or norm_stats_facts(bundle)
    if facts["status"] == FAIL:
        return Check("norm stats", FAIL, facts["why"], facts["fix"])
    golden = facts["golden"]
    tail = ("; goldens agree" if golden["status"] == PASS else f"; {golden['why']}")
    return Check("norm stats", PASS, facts["describe"] + tail)
