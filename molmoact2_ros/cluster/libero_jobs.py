"""The LIBERO work of an actor: one env (on its own thread, inside ``LiberoSim``) and one
policy behind the node's controller (``EpisodeRunner``), built once, then episode after
episode. Module-level functions, so an actor on any node imports them from the package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EpisodeWorker:
    """One actor's simulator and runner."""

    sim: Any
    runner: Any


def setup_episode_worker(options: dict[str, Any]) -> EpisodeWorker:
    """Build the env thread and load the policy (once per actor)."""
    from ..sim.libero_env import LiberoSim
    from ..sim.runner import EpisodeRunner

    if options.get("appbuilder") == "fake":
        from ..runtime.appbuilder import use_test_fake

        use_test_fake()
    sim = LiberoSim(image_rotation=options["image_rotation"],
                    settle_steps=options["settle_steps"],
                    camera_size=options["camera_size"])
    try:
        runner = EpisodeRunner(sim, options["settings"], **options["runner"])
    except BaseException:
        sim.close()
        raise
    return EpisodeWorker(sim, runner)


def run_episode(worker: EpisodeWorker, spec) -> dict[str, Any]:
    """One episode's ledger record."""
    return worker.runner.run(spec).to_json()


def close_episode_worker(worker: EpisodeWorker) -> None:
    try:
        worker.runner.close()
    finally:
        worker.sim.close()
