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
    from ..bundle.variants import get_variant
    from ..policy import Observation
    from .host import _settings, null_policy

    folder, variant = arg
    policy = null_policy(Path(folder))
    # one chunk first, as the controller's warm-up does: numba's compilation (per process)
    # belongs to the setup, not to the first bag
    v = get_variant(variant)
    policy.predict(Observation(images=(np.zeros((256, 256, 3), np.uint8),) * v.num_cameras,
                               state=np.zeros(v.state_dim, np.float32),
                               instruction="pick up the bowl"))
    return NullReplayWorker(policy, _settings(Path(folder), variant))


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


def _cpu_s() -> float:
    """CPU seconds of this process so far, every thread included."""
    t = os.times()
    return t.user + t.system


def run_in_process(setup, work, close, arg, items: list) -> dict[str, Any]:
    """One process, one setup, every item in turn; the cores it kept busy on average."""
    start, cpu = time.perf_counter(), _cpu_s()
    worker = setup(arg)
    setup_s = time.perf_counter() - start
    per_item, values = [], []
    try:
        for item in items:
            t = time.perf_counter()
            values.append(work(worker, item))
            per_item.append(time.perf_counter() - t)
    finally:
        close(worker)
    wall = time.perf_counter() - start
    return {"workers": 1, "items": len(items), "values": values, "setup_s": setup_s,
            "wall_s": wall, "items_per_s": len(items) / wall,
            "work_s_per_item": float(np.median(per_item)),
            "cores_busy": (_cpu_s() - cpu) / wall}


def run_on_ray(job, items: list[tuple[str, Any]], actors: int, resources=None
               ) -> dict[str, Any]:
    """The same items over ``actors`` actors (one CPU each by default)."""
    from ..cluster.fanout import Resources, fan_out

    values: list[Any] = []
    works: list[float] = []

    def on_result(outcome) -> None:
        if outcome.error:
            raise RuntimeError(f"{outcome.key}: {outcome.error}")
        values.append(outcome.value)
        works.append(outcome.work_s)

    stats = fan_out(items, job, on_result, resources=resources or Resources(num_cpus=1),
                    actors=actors)
    return {"workers": stats.actors, "items": len(items), "values": values,
            "setup_s": max(stats.setup_s, default=0.0), "wall_s": stats.wall_s,
            "items_per_s": len(items) / stats.wall_s,
            "work_s_per_item": float(np.median(works)),
            "overhead_fraction": stats.overhead_fraction,
            "driver_s_per_item": stats.driver_s / max(len(items), 1),
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


def _side_by_side(name: str, setup, work, close, arg, items: list[tuple[str, Any]],
                  actors: int, resources=None) -> dict[str, Any]:
    from ..cluster.fanout import Job

    here = run_in_process(setup, work, close, arg, [p for _, p in items])
    there = run_on_ray(Job(setup, work, arg, close), items, actors, resources)
    there["speedup"] = there["items_per_s"] / here["items_per_s"]
    curve = scaling_curve(here["work_s_per_item"], there["overhead_fraction"],
                          there["driver_s_per_item"], os.cpu_count() or 1, there["setup_s"],
                          CURVE_ITEMS[name])
    for r in (here, there):
        r.pop("values")
    return {"what": name, "in_process": here, "ray": there, "curve": curve}


#: items of the paper curve: a fleet's bags, and a full LIBERO evaluation (4 suites x 10 tasks
#: x 50 init states)
CURVE_ITEMS = {"replay": 10_000, "libero": 2000}


def bench_scale_out(tmp: Path, *, variant: str = "grid_sampler", bags: int = 20,
                    frames: int = 40, actors: int = 2, libero_root: str = "",
                    episodes: int = 4, max_steps: int = 60) -> dict[str, Any]:
    """1 process against ``actors`` Ray actors on this machine, the same work, one run:
    replay of ``bags`` bags on null sessions, and with ``libero_root`` (a bundle root)
    ``episodes`` lockstep LIBERO episodes of ``max_steps`` steps."""
    from ..cluster.connect import NICENESS_ENV, cluster

    folder, paths = write_bags(Path(tmp), variant, bags, frames)
    out: dict[str, Any] = {"frames_per_bag": frames, "runs": []}
    start = time.perf_counter()
    # a local cluster's workers run at this process's priority (cluster()), so both sides
    # of the comparison do
    with cluster("local", num_cpus=max(actors, os.cpu_count() or 1)) as ray:
        out["worker_niceness"] = os.nice(0) + int(os.environ.get(NICENESS_ENV, "15"))
        out["cluster_start_s"] = time.perf_counter() - start
        out["cpus"] = ray.cluster_resources().get("CPU", 0.0)
        out["runs"].append(_side_by_side(
            "replay", setup_null_replay, replay_null, close_null_replay,
            (str(folder), variant), [(Path(b).name, b) for b in paths], actors))
        if libero_root:
            from ..cluster.fanout import Resources
            from ..cluster.libero_jobs import (
                close_episode_worker,
                run_episode,
                setup_episode_worker,
            )

            options, specs = libero_work(libero_root, variant, episodes, max_steps, Path(tmp))
            out["runs"].append(_side_by_side(
                "libero", setup_episode_worker, run_episode, close_episode_worker, options,
                [(s.key, s) for s in specs], actors,
                Resources(num_cpus=1, memory_bytes=2 * 2**30)))
    return out


def libero_work(root: str, variant: str, episodes: int, max_steps: int, tmp: Path):
    """Worker options and episode specs of the LIBERO row: libero_spatial task 0 with init
    states 0.., lockstep, no videos, 5 settle steps."""
    from ..bundle.bundle import bundle_parameters
    from ..control.params import Settings
    from ..sim.runner import EVAL_DEFAULTS, EpisodeSpec

    settings = Settings().with_changes({**EVAL_DEFAULTS, "variant": variant, "backend": "onnx",
                                        **bundle_parameters(root)})
    options = {"image_rotation": "180", "settle_steps": 5, "settings": settings,
               "runner": {"time_mode": "lockstep", "latency_ms": 0.0, "max_steps": max_steps,
                          "seed": 0, "video_dir": None, "videos": "none"}}
    # as an evaluation orders them (task-major: init states 0.. of task 0), so an actor keeps
    # its env across episodes as it does over a task's 50 init states
    specs = [EpisodeSpec("libero_spatial", 0, i) for i in range(episodes)]
    return options, specs


def format_scale_out(r: dict[str, Any]) -> str:
    lines = [f"== scale-out ({r['cpus']:g} CPUs in the local Ray cluster, actors at nice "
             f"{r['worker_niceness']}; the cluster's start, {r['cluster_start_s']:.1f} s, is not "
             "counted)"]
    for run in r["runs"]:
        here, there = run["in_process"], run["ray"]
        unit = "bags" if run["what"] == "replay" else "episodes"
        title = (f"replay of {here['items']} bags x {r['frames_per_bag']} observations on null "
                 "sessions" if run["what"] == "replay"
                 else f"{here['items']} LIBERO lockstep episodes (tiny bundle)")
        lines += [
            f"-- {title}",
            f"1 process: {here['wall_s']:.2f} s, {here['items_per_s'] * 3600:.0f} {unit}/h "
            f"(setup {here['setup_s']:.2f} s, {here['work_s_per_item']:.3f} s per item; it kept "
            f"{here['cores_busy']:.2f} cores busy)",
            f"{there['workers']} Ray actors: {there['wall_s']:.2f} s, "
            f"{there['items_per_s'] * 3600:.0f} {unit}/h (setup {there['setup_s']:.2f} s per "
            f"actor, {there['work_s_per_item']:.3f} s per item) = {there['speedup']:.2f}x",
            f"scheduling overhead per item {there['overhead_fraction']:.2%} of its work; driver "
            f"{there['driver_s_per_item'] * 1e3:.2f} ms per result",
            f"on paper, N machines like this one, one actor per core "
            f"({CURVE_ITEMS[run['what']]} {unit}):",
        ]
        for row in run["curve"]:
            lines.append(f"  {row['machines']:>3} machines, {row['actors']:>4} actors: "
                         f"{row['items_per_hour']:>10.0f} {unit}/h, "
                         f"{row['hours_for_items']:.2f} h")
    return "\n".join(lines)
