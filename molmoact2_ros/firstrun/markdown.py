"""The device report as Markdown, and the list of everything in it that ran and failed."""

from __future__ import annotations

import math

from .sections import STEPS
from .status import FAIL, PASS


def _failed_rows(rows: list[dict]) -> list[str]:
    """One bullet per parity row that failed: stage, tensor, why, cosine and share in tol."""
    return [f"  - FAIL {r['stage']} {r['tensor']}: {r.get('failed') or r.get('note')} "
            f"(cosine {_fmt(r['cosine'], '.6f')}, within {r['within_tol']:.1%})"
            for r in rows if not r["passed"]]


def failed(report: dict) -> list[str]:
    """Names of everything that ran and failed (doctor lines, norm stats, section steps)."""
    bad = [f"doctor {c['name']}" for c in report["doctor"] if c["status"] == FAIL]
    for name, facts in report.get("variants", {}).items():
        if facts["norm_stats"]["status"] == FAIL:
            bad.append(f"{name} norm_stats.json")
        if facts.get("prompt_budget", {}).get("status") == FAIL:
            bad.append(f"{name} prompt budget")
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
        lines += _failed_rows(rows)
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
        lines += _failed_rows(rows)
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
                  f"- norm stats: {ns.get('describe', ns['path'])}"
                  + (f"; goldens: {ns['golden']['status']}" if "golden" in ns else "")
                  if ns["status"] == PASS else
                  f"- norm stats: **FAIL**: {ns['why']}; fix: {ns['fix']}"]
        budget = facts.get("prompt_budget")
        if budget:
            lines.append(f"- prompt budget: {budget.get('line', budget.get('why'))}"
                         + (f" ({budget['suites_why']})" if "suites_why" in budget else ""))
            if budget.get("table"):
                lines += ["", *budget["table"], ""]
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


