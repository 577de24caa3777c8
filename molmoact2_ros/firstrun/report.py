"""The whole device report: platform facts, doctor's machine checks, every section, the A/B
table per variant and the optional replay against a golden chunk bag, written to Markdown and
JSON before the first section and after each, so a crash leaves every finished section."""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from ..errors import BundleError
from ..util.outputs import check_file, write_file
from .facts import library_facts, norm_stats_facts, platform_facts
from .markdown import failed, to_markdown
from .prompt_stats import budget_facts
from .sections import PARITY_LIMITS, STEPS, Section, run_section, suffix_choices
from .status import FAIL, NOT_RUN, PASS, error

__all__ = ["MIN_CHUNKS", "ReportFiles", "STEPS", "ab_table", "build_report", "failed",
           "run_replay_check"]

MIN_CHUNKS = 20


def golden_changes(root: Path, golden_path: Path):
    """The golden chunk bag and the settings its replay runs with, checked: the variant it was
    recorded with must be one the bundle root holds. Called before the first section too."""
    from ..bundle.bundle import bundle_parameters
    from ..control.params import Settings, validate_changes
    from ..replay.chunkbag import COMPARED_SETTINGS, read_chunk_bag

    golden = read_chunk_bag(golden_path)
    changes = {k: golden.settings[k] for k in COMPARED_SETTINGS if k in golden.settings}
    folders = bundle_parameters(root)
    variant = changes.get("variant")
    if variant and f"bundle.{variant}" not in folders:
        held = ", ".join(k.removeprefix("bundle.") for k in folders)
        raise BundleError(f"--golden {golden_path} was recorded with variant {variant}, which "
                          f"the bundle root {root} does not hold (it holds {held}); give the "
                          f"root that holds {variant}, or a golden recorded with {held}")
    changes.update(folders, backend="htp")
    ok, reason = validate_changes(changes, Settings())
    if not ok:
        raise BundleError(f"golden {golden_path}: {reason}")
    return golden, changes


def run_replay_check(root: Path, bag: Path, golden_path: Path, probe: dict) -> dict:
    """Replay ``bag`` on the HTP with the golden run's settings and match every chunk with the
    golden chunk bag (made with ``replay --record`` on a workstation) by observation stamp."""
    if "error" in probe:
        return {"status": NOT_RUN,
                "why": f"qai_appbuilder is not importable here ({probe['error']})"}
    from ..control.params import Settings
    from ..replay.chunk_match import default_tolerance, match_chunks
    from ..replay.chunkbag import action_scale
    from ..replay.replay import replay

    golden, changes = golden_changes(root, golden_path)
    result = replay(bag, Settings().with_changes(changes))
    produced = {p.chunk.observation_stamp_ns: p.actions for p in result.published}
    summary = match_chunks(produced, golden.chunks, default_tolerance("htp"),
                           scale=action_scale(golden.settings, changes.get("variant"), root))
    return {"status": PASS if summary.ok else FAIL, "bag": str(bag), "golden": str(golden_path),
            "variant": changes.get("variant"), "drops": dict(result.drops),
            "summary": summary.to_json()}





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
        for path in (self.markdown, self.json):  # only an earlier report of this package
            check_file(path, force=True, what="--out")

    def write(self, report: dict) -> None:
        for path, text in ((self.json, json.dumps(report, indent=1, default=str)),
                           (self.markdown, to_markdown(report))):
            write_file(path, text, what="--out")


def build_report(root: Path, chunks: int = MIN_CHUNKS, timeout_s: float = 60.0, *,
                 bag: Path | None = None, golden: Path | None = None,
                 variant: str | None = None, ignore_bundle_libs: bool = False,
                 choices: str = "all", perf_profile: str = "BURST",
                 load_order: str = "parallel", files: ReportFiles | None = None,
                 progress: Callable[[str], None] | None = None) -> dict:
    from ..bundle.bundle import Bundle, resolve_bundles
    from .machine import machine_checks, probe_qai_appbuilder

    say = progress or (lambda line: None)
    bundles = resolve_bundles(root, variant)  # the one resolver every command uses
    probe = probe_qai_appbuilder()
    checks = machine_checks(probe)
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
            "prompt_budget": budget_facts(bundle),
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
            section.data["error"] = error(exc)
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
            report["replay"] = {"status": FAIL, "error": error(exc)}
        say(f"[{total}/{total}] replay: {report['replay']['status']}")
    report["progress"] = "complete"
    save()
    return report


