"""``molmoact2 bench --scale-out``: the same replay work in one process and on Ray actors,
side by side in one run, and the scaling curve for N machines computed from the per-actor
figures.

The work item is a whole replay of one bag through the node's controller on null sessions
(the host's own work: decoding, preprocessing, embedding, chunk timing, safety), one null
policy loaded per worker, as ``replay --ray`` does with a real bundle.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..replay.fleet import LentPolicy

#: machines of the paper curve
CURVE_MACHINES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class NullReplayWorker:
    """One worker's null policy (loaded once) and the settings every bag uses."""

    policy: Any
    settings: Any



def setup_null_replay(arg: tuple[str, str]) -> NullReplayWorker:
    """Setup of a worker: the null-session policy of the host-only bundle ``folder``."""
    from .host import _settings, null_policy

    folder, variant = arg
    return NullReplayWorker(null_policy(Path(folder)), _settings(Path(folder), variant))


def replay_null(worker: NullReplayWorker, bag: str) -> int:
    """One work item: replay ``bag`` through the controller; the chunks it published."""
    from ..replay.replay import replay

    result = replay(Path(bag), worker.settings,
                    policy_factory=lambda s: LentPolicy(worker.policy))
    return len(result.published)


def close_null_replay(worker: NullReplayWorker) -> None:
    worker.policy.close()


def write_bags(root: Path, variant: str, count: int, frames: int) -> tuple[Path, list[str]]:
    """The host-only bundle and ``count`` rgb8 bags of ``frames`` observations at 10 Hz."""
    from ..replay.replay import write_observation_bag
    from .host import _settings, host_bundle

    folder = host_bundle(root / "bundle", variant)
    settings = _settings(folder, variant)
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(4)]
    bags = []
    for b in range(count):
        rows = [(1_000_000_000 + i * 100_000_000, images[(i + b) % 4], images[(i + b + 1) % 4],
                 np.full(8, 0.01 * i)) for i in range(frames)]
        path = root / f"bag_{b:02d}"
        write_observation_bag(path, rows, settings)
        bags.append(str(path))
    return folder, bags


def run_in_process(folder: Path, variant: str, bags: list[str]) -> dict[str, Any]:
    """One process, one policy load, every bag in turn."""
    start = time.perf_counter()
    worker = setup_null_replay((str(folder), variant))
    setup_s = time.perf_counter() - start
    per_bag, chunks = [], 0
    try:
        for bag in bags:
            t = time.perf_counter()
            chunks += replay_null(worker, bag)
            per_bag.append(time.perf_counter() - t)
    finally:
        close_null_replay(worker)
    wall = time.perf_counter() - start
    return {"workers": 1, "bags": len(bags), "chunks": chunks, "setup_s": setup_s,
            "wall_s": wall, "bags_per_s": len(bags) / wall,
            "work_s_per_bag": float(np.median(per_bag))}


def run_on_ray(folder: Path, variant: str, bags: list[str], actors: int) -> dict[str, Any]:
    """The same bags over ``actors`` actors of one CPU each on the connected cluster."""
    from ..cluster.fanout import Job, Resources, fan_out

    chunks: list[int] = []
    works: list[float] = []

    def on_result(outcome) -> None:
        if outcome.error:
            raise RuntimeError(f"{outcome.key}: {outcome.error}")
        chunks.append(outcome.value)
        works.append(outcome.work_s)

    job = Job(setup_null_replay, replay_null, (str(folder), variant), close_null_replay)
    stats = fan_out([(Path(b).name, b) for b in bags], job, on_result,
                    resources=Resources(num_cpus=1), actors=actors)
    return {"workers": stats.actors, "bags": len(bags), "chunks": sum(chunks),
            "setup_s": max(stats.setup_s, default=0.0), "wall_s": stats.wall_s,
            "bags_per_s": len(bags) / stats.wall_s,
            "work_s_per_bag": float(np.median(works)),
            "overhead_fraction": stats.overhead_fraction,
            "driver_s_per_item": stats.driver_s / max(len(bags), 1),
            "deaths": stats.deaths}


def scaling_curve(item_work_s: float, overhead_fraction: float, driver_s_per_item: float,
                  actors_per_machine: int, setup_s: float, items: int,
                  machines: tuple[int, ...] = CURVE_MACHINES) -> list[dict[str, float]]:
    """Items per hour on N machines from the per-actor figures: each actor does one item per
    ``item_work_s * (1 + overhead)``; the driver handles one result per ``driver_s_per_item``
    (its ceiling); the wall time of ``items`` adds one setup per actor."""
    per_actor = 3600.0 / (item_work_s * (1.0 + overhead_fraction))
    ceiling = 3600.0 / driver_s_per_item if driver_s_per_item > 0 else float("inf")
    rows = []
    for n in machines:
        actors = n * actors_per_machine
        rate = min(actors * per_actor, ceiling)
        rows.append({"machines": n, "actors": actors, "items_per_hour": rate,
                     "hours_for_items": setup_s / 3600.0 + items / rate})
    return rows


def bench_scale_out(tmp: Path, *, variant: str = "grid_sampler", bags: int = 20,
                    frames: int = 40, actors: int = 2) -> dict[str, Any]:
    """1 process against ``actors`` Ray actors on this machine, the same bags, one run."""
    from ..cluster.connect import cluster

    folder, paths = write_bags(Path(tmp), variant, bags, frames)
    here = run_in_process(folder, variant, paths)
    start = time.perf_counter()
    with cluster("local", num_cpus=max(actors, os.cpu_count() or 1)) as ray:
        cluster_start_s = time.perf_counter() - start
        there = run_on_ray(folder, variant, paths, actors)
        there["cluster_start_s"] = cluster_start_s
        there["cpus"] = ray.cluster_resources().get("CPU", 0.0)
    there["speedup"] = there["bags_per_s"] / here["bags_per_s"]
    curve = scaling_curve(here["work_s_per_bag"], there["overhead_fraction"],
                          there["driver_s_per_item"], os.cpu_count() or 1,
                          there["setup_s"], 10_000)
    return {"in_process": here, "ray": there, "curve": curve, "frames_per_bag": frames}


def format_scale_out(r: dict[str, Any]) -> str:
    here, there = r["in_process"], r["ray"]
    lines = [
        f"== scale-out: replay of {here['bags']} bags x {r['frames_per_bag']} observations "
        "on null sessions",
        f"1 process: {here['wall_s']:.2f} s ({here['bags_per_s']:.2f} bags/s; setup "
        f"{here['setup_s']:.2f} s, {here['work_s_per_bag']:.3f} s per bag)",
        f"{there['workers']} Ray actors: {there['wall_s']:.2f} s ({there['bags_per_s']:.2f} "
        f"bags/s; setup {there['setup_s']:.2f} s per actor, {there['work_s_per_bag']:.3f} s per "
        f"bag; cluster start {there['cluster_start_s']:.1f} s not counted) = "
        f"{there['speedup']:.2f}x",
        f"scheduling overhead per bag {there['overhead_fraction']:.2%} of its work; driver "
        f"{there['driver_s_per_item'] * 1e3:.2f} ms per result",
        "on paper, N machines of this kind, one actor per core (10000 bags):",
    ]
    for row in r["curve"]:
        lines.append(f"  {row['machines']:>3} machines, {row['actors']:>4} actors: "
                     f"{row['items_per_hour']:>10.0f} bags/h, {row['hours_for_items']:.2f} h")
    return "\n".join(lines)
