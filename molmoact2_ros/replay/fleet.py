"""Many recordings at once: each bag paired with its golden chunk bag by name, one verdict
per bag (plain JSON, so it travels from a Ray actor and into a ledger), and the merged report
(pass/fail per bag, the worst chunk and dimension, the settings that differ)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MolmoActError
from ..util.outputs import write_file

#: verdict fields that measure time: they differ between two runs of the same check
TIMING_FIELDS = ("seconds",)
STATUSES = ("pass", "fail", "error", "recorded", "replayed")


class LentPolicy:
    """A worker's loaded policy lent to one bag's controller: the controller's ``close``
    leaves it loaded for the next bag (one load per worker, not per bag)."""

    def __init__(self, policy) -> None:
        self._policy = policy

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        return getattr(self._policy, name)


@dataclass(frozen=True)
class BagItem:
    """One recording to check (``golden``) or to record a golden from (``record``)."""

    name: str
    bag: str
    golden: str = ""
    record: str = ""


def bag_name(path: Path) -> str:
    """A bag's name in a golden folder: the folder's name, or a ``.mcap`` file's stem."""
    path = Path(path)
    return path.stem if path.suffix in (".mcap", ".db3") and not path.is_dir() else path.name


def pair_bags(bags: Sequence[str], *, golden_dir: str = "", record_dir: str = "") -> list[BagItem]:
    """Each bag with ``golden_dir/NAME`` or ``record_dir/NAME``; two bags of one name are
    refused (their goldens would collide)."""
    items, seen = [], {}
    for bag in bags:
        name = bag_name(Path(bag))
        if name in seen:
            raise MolmoActError(f"bags {seen[name]} and {bag} are both named {name!r}; their "
                                "goldens would share a path: rename one")
        seen[name] = bag
        items.append(BagItem(name, str(bag),
                             golden=str(Path(golden_dir) / name) if golden_dir else "",
                             record=str(Path(record_dir) / name) if record_dir else ""))
    return items


def verdict(item: BagItem, result, summary, *, settings: dict[str, Any],
            differences: Sequence[str], action_names: Sequence[str], recorded: int = -1,
            seconds: float = 0.0) -> dict[str, Any]:
    """The verdict of one bag: counts, match, the worst chunk and dimension, differences."""
    out: dict[str, Any] = {
        "bag": item.name, "path": item.bag, "golden": item.golden, "record": item.record,
        "error": "", "messages": result.messages, "synchronised": result.synced,
        "chunks": len(result.published), "drops": dict(sorted(result.drops.items())),
        "differences": list(differences), "settings": settings, "worst": None,
        "interrupted": bool(result.interrupted), "seconds": round(seconds, 4),
    }
    if summary is not None:
        out.update(compared=summary.compared, passed=summary.passed,
                   missing=len(summary.missing), extra=len(summary.extra),
                   golden_chunks=summary.golden_total)
        worst = summary.worst
        if worst is not None:
            dim = worst.worst_dim
            out["worst"] = {
                "stamp_ns": worst.stamp_ns, "cosine": worst.cosine, "max_abs": worst.max_abs,
                "within_tol": worst.within_tol, "row": worst.worst_row, "dim": dim,
                "name": action_names[dim] if 0 <= dim < len(action_names) else f"dim {dim}",
                "passed": worst.passed}
        out["status"] = "pass" if summary.ok else "fail"
    else:
        out["status"] = "recorded" if recorded >= 0 else "replayed"
        if recorded >= 0:
            out["recorded_chunks"] = recorded
    return out


def error_verdict(item: BagItem, message: str, seconds: float = 0.0) -> dict[str, Any]:
    """A bag that could not be checked (unreadable, no golden, refused settings)."""
    return {"bag": item.name, "path": item.bag, "golden": item.golden, "record": item.record,
            "status": "error", "error": message, "seconds": round(seconds, 4)}


def without_timing(v: dict[str, Any]) -> dict[str, Any]:
    """A verdict minus its timing fields: what two runs of the same check must agree on."""
    return {k: val for k, val in v.items() if k not in TIMING_FIELDS}


def _stamp(ns: int) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}"


def verdict_line(v: dict[str, Any]) -> str:
    """One line per bag: status, counts, the worst chunk (or the error)."""
    status = v["status"].upper()
    if v["status"] == "error":
        return f"{status:<8} {v['bag']}: {v['error']}"
    if v["status"] in ("recorded", "replayed"):
        tail = (f"{v.get('recorded_chunks', 0)} chunks to {v['record']}"
                if v["status"] == "recorded" else f"{v['chunks']} chunks")
        return f"{status:<8} {v['bag']}: {v['messages']} messages, {tail}"
    text = (f"{status:<8} {v['bag']}: {v['passed']}/{v['compared']} chunks within tolerance "
            f"of {v['golden_chunks']} golden, {v['missing']} missing, {v['extra']} extra")
    w = v.get("worst")
    if w is not None:
        text += (f"; worst chunk {_stamp(w['stamp_ns'])} s: max-abs {w['max_abs']:.4g} at "
                 f"action {w['row']} {w['name']}, cosine {w['cosine']:.6f}")
    if v.get("differences"):
        text += "; settings differ: " + "; ".join(v["differences"])
    return text


def merge(verdicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The merged report: counts per status, the worst bag (its chunk and dimension), and
    which settings differ from the goldens in which bags."""
    counts = {s: sum(v["status"] == s for v in verdicts) for s in STATUSES}
    checked = [v for v in verdicts if v.get("worst") is not None]
    worst = max(checked, key=lambda v: (not v["worst"]["passed"], v["worst"]["max_abs"]),
                default=None)
    differences: dict[str, list[str]] = {}
    for v in verdicts:
        for text in v.get("differences", []):
            differences.setdefault(text.split(" ", 1)[0], []).append(v["bag"])
    return {
        "bags": len(verdicts), **counts,
        "ok": counts["fail"] == 0 and counts["error"] == 0 and bool(verdicts),
        "worst": None if worst is None else {"bag": worst["bag"], **worst["worst"]},
        "settings_differ": differences,
        "verdicts": list(verdicts),
    }


def format_merged(report: dict[str, Any]) -> str:
    """The closing lines of a many-bag replay."""
    parts = [f"{report[s]} {'errors' if s == 'error' else s if s != 'pass' else 'passed'}"
             for s in STATUSES if report[s]]
    lines = [f"{report['bags']} bags: " + (", ".join(parts) if parts else "none run")]
    w = report["worst"]
    if w is not None:
        lines.append(f"worst: {w['bag']} chunk {_stamp(w['stamp_ns'])} s, max-abs "
                     f"{w['max_abs']:.4g} at action {w['row']} {w['name']}, cosine "
                     f"{w['cosine']:.6f}")
    for key, bags in sorted(report["settings_differ"].items()):
        lines.append(f"{key} differs from the golden in {len(bags)} bags: {', '.join(bags)}")
    checked = report["pass"] + report["fail"]
    if checked:
        lines.append("PASS" if report["ok"] else "FAIL")
    return "\n".join(lines)


def write_merged(folder: Path, report: dict[str, Any]) -> list[Path]:
    """``summary.json`` (the merged report with every verdict) and ``summary.md`` (a table)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    js, md = folder / "summary.json", folder / "summary.md"
    write_file(js, json.dumps(report, indent=2, sort_keys=True) + "\n", what="--report")
    rows = ["| bag | verdict | chunks passed | missing | extra | worst max-abs | at | differs |",
            "|---|---|---|---|---|---|---|---|"]
    for v in report["verdicts"]:
        w = v.get("worst")
        where = f"{_stamp(w['stamp_ns'])} s, action {w['row']} {w['name']}" if w else ""
        error = f": {v['error']}" if v.get("error") else ""
        max_abs = f"{w['max_abs']:.4g}" if w else ""
        passed = f"{v['passed']}/{v['compared']}" if "compared" in v else ""
        rows.append(
            f"| {v['bag']} | {v['status']}{error} | {passed} | {v.get('missing', '')} | "
            f"{v.get('extra', '')} | {max_abs} | {where} | "
            f"{'; '.join(v.get('differences', []))} |")
    write_file(md, "# Replay against goldens\n\n" + format_merged(report) + "\n\n" +
               "\n".join(rows) + "\n", what="--report")
    return [js, md]
