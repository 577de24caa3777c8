"""Soak of the node's controller on the resident HTP runtime: many chunks, faults injected at a
fixed interval, resource counts at the start and the end. A benchmark, not a test.

    PYTHONPATH=tests/fake_qai_appbuilder python -m molmoact2_ros.bench.soak .cache/tiny-bundle

runs lp_vtp_sd through ``Controller`` (as the node does, inference driven inline so every
observation is accounted for) on the ``htp`` backend: with the test fake of qai_appbuilder on
``PYTHONPATH`` off the robot, with the real one on the IQ-9075. Faults rotate through: a
SIGKILLed worker, an observation stamped an hour ahead, the clock jumping back 990 s, an
out-of-order observation, a swap whose load fails (rolled back) and a storm of live changes.
Each must be followed by a published chunk within three observations.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..bundle.golden import load_npz
from ..control.controller import Controller
from ..control.params import Settings
from .runtime import rss_mb

FAULTS = ("kill_worker", "future_stamp", "clock_back", "out_of_order", "failed_swap",
          "live_storm")
SECOND = 1_000_000_000
SHM = Path("/dev/shm")  # noqa: S108  (only counted: entries left behind would be leaks)


def resources(ctl: Controller) -> dict[str, float]:
    """RSS (this process and the workers), open fds, threads, workers and /dev/shm entries."""
    pipeline = getattr(ctl.policy, "pipeline", None)
    pids = list(pipeline.worker_pids().values()) if pipeline is not None else []
    shm = len(list(SHM.iterdir())) if SHM.is_dir() else 0
    return {
        "rss_mib": round(rss_mb(), 2),
        "workers_rss_mib": round(sum(rss_mb(p) for p in pids), 2),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "workers": len(pids),
        "dev_shm": shm,
    }


class _Clock:
    """Wall time plus an offset the clock-jump fault moves."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def __call__(self) -> int:
        return time.time_ns() + self.offset_ns


def run(root: Path, chunks: int, every: int, warmup: int, seed: int = 0) -> dict:
    variant = "lp_vtp_sd"
    trace = load_npz(root / variant / "golden" / "e2e_trace.npz")
    images = (trace["image_primary"], trace["image_wrist"])
    settings = Settings().with_changes({
        "variant": variant, "bundle.lp_vtp_sd": str(root / variant),
        "bundle.fused": str(root / variant),  # wrong folder: the fused load fails
        "backend": "htp", "instruction": str(trace["instruction"]), "seed": seed,
        "max_observation_age_s": 5.0,
    })
    clock, published = _Clock(), [0]

    def publish(out) -> None:  # count only: keeping every chunk would be the growth measured
        published[0] += 1

    ctl = Controller(settings, publish=publish, clock_ns=clock)
    rnd = np.random.default_rng(seed)
    faults: list[dict] = []
    pending: dict | None = None
    start = end = {}
    times_ms: list[float] = []
    rss: list[tuple[int, float]] = []  # (chunks, MiB of this process) every 1000 chunks
    observed = 0
    ctl.configure()
    ctl.activate(worker=False)
    t0 = time.monotonic()
    try:
        while published[0] < chunks:
            done = published[0]
            if done == warmup and not start:
                start = resources(ctl)
            if done >= warmup and done % 1000 == 0 and (not rss or rss[-1][0] != done):
                rss.append((done, round(rss_mb(), 2)))
            if done and done % every == 0 and (not faults or faults[-1]["at_chunk"] != done):
                kind = FAULTS[len(faults) % len(FAULTS)]
                pending = {"kind": kind, "at_chunk": done, "observations_to_recover": 0}
                faults.append(pending)
                _inject(kind, ctl, clock, rnd, images, trace["state"])
            stamp = clock()
            ctl.on_observation(images, trace["state"], stamp)
            observed += 1
            ctl.tick()
            began = time.perf_counter()
            out = ctl.process_pending()
            if out is not None:
                times_ms.append((time.perf_counter() - began) * 1e3)
            if pending is not None:
                pending["observations_to_recover"] += 1
                if out is not None:
                    pending["recovered"] = True
                    pending = None
                elif pending["observations_to_recover"] > 3:
                    pending["recovered"] = False
                    pending = None
            if observed > 2 * chunks + 100:
                raise RuntimeError("the soak stopped publishing")
        end = resources(ctl)
    finally:
        ctl.shutdown()
    return {
        "variant": variant, "backend": "htp", "chunks": published[0], "observations": observed,
        "fault_every": every, "warmup_chunks": warmup, "seconds": round(time.monotonic() - t0, 1),
        "chunk_ms_median": round(float(np.median(times_ms)), 2),
        "start": start, "end": end, "rss_mib_by_chunk": rss, "faults": faults,
        "counts": dict(ctl.counts), "drops": dict(ctl.drops),
        "all_recovered": all(f.get("recovered") for f in faults),
    }


def _inject(kind: str, ctl: Controller, clock: _Clock, rnd: np.random.Generator, images,
            state) -> None:
    if kind == "kill_worker":
        pids = ctl.policy.pipeline.worker_pids()
        os.kill(pids[sorted(pids)[int(rnd.integers(len(pids)))]], signal.SIGKILL)
    elif kind == "future_stamp":
        ctl.on_observation(images, state, clock() + 3600 * SECOND)
    elif kind == "clock_back":
        clock.offset_ns -= 990 * SECOND
    elif kind == "out_of_order":
        ctl.on_observation(images, state, clock() - SECOND // 2)
        ctl.process_pending()  # no observation was admitted: nothing runs
    elif kind == "failed_swap":
        ctl.apply({"variant": "fused"})  # its folder holds lp_vtp_sd: the load fails
        ctl.wait_for_swap(300)
    elif kind == "live_storm":
        for steps in (3, 7, 1, 0):
            ctl.request({"flow_steps": steps})
        ctl.request({"instruction": "put the bowl on the plate"})


def format_report(r: dict) -> str:
    s, e = r["start"], r["end"]
    lines = [f"soak: {r['chunks']} chunks of {r['variant']} on {r['backend']} in {r['seconds']} s "
             f"(median {r['chunk_ms_median']} ms/chunk), a fault every {r['fault_every']}",
             f"{'':22}{'start':>10}{'end':>10}{'change':>10}"]
    for key in ("rss_mib", "workers_rss_mib", "fds", "threads", "workers", "dev_shm"):
        lines.append(f"{key:22}{s[key]:>10}{e[key]:>10}{round(e[key] - s[key], 2):>10}")
    lines.append("rss_mib by chunk: " + ", ".join(f"{n}: {m}" for n, m in r["rss_mib_by_chunk"]))
    recovered = sum(bool(f.get("recovered")) for f in r["faults"])
    lines.append(f"faults recovered: {recovered}/{len(r['faults'])} "
                 f"({', '.join(sorted({f['kind'] for f in r['faults']}))})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m molmoact2_ros.bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle_root", type=Path, help="folder with the lp_vtp_sd bundle")
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--fault-every", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=500,
                        help="chunks before the start counts are taken")
    parser.add_argument("--json", type=Path, help="also write the full record here")
    args = parser.parse_args(argv)
    if args.chunks < 1 or args.fault_every < 1 or not 0 <= args.warmup < args.chunks:
        parser.error("need --chunks >= 1, --fault-every >= 1 and 0 <= --warmup < --chunks")
    record = run(args.bundle_root, args.chunks, args.fault_every, args.warmup)
    print(format_report(record))
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))
    ok = record["all_recovered"] and record["end"]["fds"] <= record["start"]["fds"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
