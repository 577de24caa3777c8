"""The targets of ``molmoact2 bench`` and one verdict per target from a run's figures."""

from __future__ import annotations

#: Medians on the 2-core x86 dev box (the host's critical-path issue).
PREPROCESS_MS = {"256x256": 3.0, "640x480": 5.0}
EMBED_MS = {"grid_sampler": 2.0, "lp_vtp_sd": 2.0, "fused": 4.0}
FLOOR_RATIO = 1.3
CONTROLLER_MS = 1.0
NODE_MS = 2.0
REPLAY_CHUNKS_PER_S = 200.0
RSS_MIB = 150.0


def _row(target: str, measured: float | None, limit: str, ok: bool | None, note: str = "") -> dict:
    verdict = "skipped" if ok is None else ("meets" if ok else "misses")
    return {"target": target, "measured": measured, "limit": limit, "verdict": verdict,
            "note": note}


def verdicts(host: dict, records: list[dict]) -> list[dict]:
    """One row per target: what was measured, the limit, meets/misses/skipped and why."""
    out = []
    for size, limit in PREPROCESS_MS.items():
        ours = host[f"preprocess {size}"]["median"]
        cpu = host[f"preprocess {size}"].get("cpu_median")
        notes = [f"{host[f'preprocess {size}'].get('kernel', 'numpy')} kernel"]
        if cpu is not None:
            notes.append(f"CPU {cpu:.2f} ms, all threads")
        numpy_path = host.get(f"numpy path {size}", {})
        if "median" in numpy_path:
            same = "same values" if numpy_path.get("same_values") else "VALUES DIFFER"
            notes.append(f"numpy path {numpy_path['median']:.2f} ms, {same}")
        out.append(_row(f"preprocess 2 x {size} -> fp16 (ms)", ours, f"<= {limit}",
                        ours <= limit, "; ".join(notes)))
        peer = host.get(f"peer {size}", {})
        if "median" in peer:
            ratio = ours / peer["median"]
            out.append(_row(f"preprocess {size} vs peer OpenCV (ratio)", ratio, "< 1",
                            ratio < 1.0, f"peer {peer['median']:.2f} ms (CPU "
                            f"{peer.get('cpu_median', float('nan')):.2f} ms), off by >= 1 level "
                            f"on {100 * peer['pixels_off_by_1_or_more']:.1f} % of values"))
        else:
            out.append(_row(f"preprocess {size} vs peer OpenCV (ratio)", None, "< 1", None,
                            peer.get("skipped", "")))
    for r in records:
        name = r["variant"]
        embed = r["host"]["embed"]["median"]
        limit = EMBED_MS.get(name)
        out.append(_row(f"embed {name} (ms)", embed, f"<= {limit}",
                        None if limit is None else embed <= limit,
                        f"fp16 sums on {r['host']['embed'].get('kernel', 'numpy')}"))
        ratio = r["floor_ratio"]
        out.append(_row(f"resident {name} / memory floor", ratio, f"<= {FLOOR_RATIO}",
                        ratio <= FLOOR_RATIO,
                        f"(a) {r['resident']['total']['median']:.2f} ms, plain copy of "
                        f"{r['floor_bytes']['total'] / 2**20:.1f} MiB "
                        f"{r['floor']['plain copy']['median']:.2f} ms; (a)'s null sessions copy "
                        "inputs and outputs per call as qai_appbuilder does"))
        out.append(_row(f"naive {name} / resident", r["ratio"], ">= 10", r["ratio"] >= 10.0))
    ctl = host["controller overhead"]["median"]
    out.append(_row("controller overhead (ms)", ctl, f"<= {CONTROLLER_MS}", ctl <= CONTROLLER_MS))
    node = host.get("node", {})
    note = node.get("skipped", "")
    if "median" in node:
        note = (f"last input published -> both outputs received "
                f"{node['end_to_end']['median']:.2f} ms minus predict "
                f"{node['predict (null)']['median']:.2f} ms; rclpy floor (relay, no work) "
                f"{node['rclpy floor']['median']:.2f} ms; {node['received']} of "
                f"{node['observations']} observations; node in its own process")
    out.append(_row("rclpy node overhead (ms)", node.get("median"), f"<= {NODE_MS}",
                    None if "median" not in node else node["median"] <= NODE_MS, note))
    replay = host.get("replay", {})
    rate = replay.get("chunks_per_s")
    out.append(_row("replay, null sessions (chunks/s)", rate, f">= {REPLAY_CHUNKS_PER_S:.0f}",
                    None if rate is None else rate >= REPLAY_CHUNKS_PER_S,
                    replay.get("skipped", "")))
    rss = host.get("node process RSS", {})
    peak = rss.get("peak_rss_mib")
    note = rss.get("skipped", "")
    if peak is not None:
        note = f"{rss.get('kernel', 'numpy')} preprocessing"
        other = host.get("node process RSS, numpy path", {})
        if "peak_rss_mib" in other:
            note += (f"; {other['peak_rss_mib']:.1f} MiB with the numpy path "
                     f"(numba's LLVM: +{peak - other['peak_rss_mib']:.1f} MiB)")
    out.append(_row("peak RSS, controller + resident runtime, workers excluded (MiB)", peak,
                    f"<= {RSS_MIB:.0f}", None if peak is None else peak <= RSS_MIB, note))
    return out


def format_verdicts(rows: list[dict]) -> str:
    lines = ["== verdicts", f"{'target':<66} {'measured':>9} {'limit':>9}  verdict"]
    for r in rows:
        value = "-" if r["measured"] is None else f"{r['measured']:.2f}"
        note = f"  ({r['note']})" if r["note"] else ""
        lines.append(f"{r['target']:<66} {value:>9} {r['limit']:>9}  {r['verdict']}{note}")
    return "\n".join(lines)
