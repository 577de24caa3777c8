"""The worker of a many-bag replay (this process, or each Ray actor): the policy loaded once
per setting that needs a reload, then bag after bag replayed and checked against its golden
(or its golden recorded); each bag's verdict is plain JSON."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MolmoActError
from .fleet import BagItem, LentPolicy, error_verdict, verdict

#: a golden being recorded is written here first, renamed when complete
PARTIAL = ".partial"


class Worker:
    """Policies loaded once per worker (by the settings that need a reload) and the options
    every bag shares."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = dict(options)
        self.policies: dict[tuple, Any] = {}
        if self.options.get("appbuilder") == "fake":
            from ..runtime.appbuilder import use_test_fake

            use_test_fake()

    def policy(self, settings, fixed_noise: np.ndarray | None):
        from ..control.controller import load_policy

        key = (str(settings.bundle_path()), settings["variant"], settings["backend"],
               tuple(sorted(settings.suffixes().items())),
               repr(settings.runtime_options()) if settings["backend"] == "htp" else "")
        policy = self.policies.get(key)
        if policy is None:
            policy = self.policies[key] = load_policy(settings)
        policy.set_flow_steps(settings.flow_steps() or policy.variant.default_flow_steps)
        if settings["instruction"]:
            policy.set_instruction(settings["instruction"])
        policy.fixed_noise = fixed_noise
        return LentPolicy(policy)

    def close(self) -> None:
        for policy in self.policies.values():
            policy.close()
        self.policies.clear()


def setup_worker(options: dict[str, Any]) -> Worker:
    """An actor's (or this process's) one-time setup: the bundle is checked here, so a node
    that cannot see it fails at once."""
    from ..bundle.bundle import bundle_parameters

    bundle_parameters(options["bundle_root"])
    return Worker(options)


def close_worker(worker: Worker) -> None:
    worker.close()


def check_bag(worker: Worker, item: BagItem) -> dict[str, Any]:
    """Replay one bag and compare it with its golden (or record its golden): its verdict.
    A bag that cannot be checked gets an ``error`` verdict naming why; the others go on."""
    start = time.perf_counter()
    try:
        return _check(worker, item, start)
    except MolmoActError as exc:
        return error_verdict(item, str(exc), time.perf_counter() - start)
    except Exception as exc:  # a library or a bug: this bag's verdict, not the fleet's end
        return error_verdict(item, f"unexpected {type(exc).__name__}: {exc}",
                             time.perf_counter() - start)


def _check(worker: Worker, item: BagItem, start: float) -> dict[str, Any]:
    from ..util.outputs import move_bag, remove
    from .bagio import check_output
    from .chunk_match import match_chunks
    from .chunkbag import ChunkBagWriter, action_scale, run_info, scale_of
    from .replay import replay
    from .run_settings import golden_and_settings

    options = {"force": False, **worker.options}
    args = argparse.Namespace(**options, bag=item.bag, golden=item.golden or None,
                              record=item.record or None)
    if args.golden and not Path(args.golden).exists():
        raise MolmoActError(f"no golden chunk bag {args.golden}; record one with "
                            "`molmoact2 replay BAGS... --record-dir DIR`")
    golden, trace, golden_settings, settings, tol, differences = golden_and_settings(args)
    noise = np.asarray(trace["noise"], np.float32) if trace is not None else None
    partial = Path(item.record + PARTIAL) if item.record else None
    if partial is not None:  # a killed attempt's leftovers; the golden appears only when done
        check_output(Path(item.record), args.force, "--record-dir bag")
        remove(partial, what="--record-dir bag")
    writer: dict[str, Any] = {"w": None}

    def on_active(controller, bag_topics) -> None:
        if partial is not None:
            steps = getattr(controller.policy, "flow_steps", settings.flow_steps())
            norm = getattr(getattr(controller.policy, "norm_stats", None), "action", None)
            writer["w"] = ChunkBagWriter(
                partial, run_info(settings, flow_steps=steps, source_bag=Path(item.bag).name,
                                  scale=scale_of(norm) if norm is not None else None),
                mcap=args.storage == "mcap", version=args.bag_version)

    try:
        result = replay(Path(item.bag), settings,
                        policy_factory=lambda s: worker.policy(s, noise),
                        on_published=lambda out, ns: writer["w"] and writer["w"].write(out, ns),
                        on_active=on_active, namespace=args.namespace)
    finally:
        if writer["w"] is not None:
            writer["w"].close()
    recorded = -1
    if partial is not None:
        target = Path(item.record)
        check_output(target, args.force, "--record-dir bag")  # again: time has passed
        move_bag(partial, target, what="--record-dir bag")
        recorded = writer["w"].count
    summary, names = None, list(settings["action_names"])
    if golden is not None:
        produced = {p.chunk.observation_stamp_ns: p.actions for p in result.published}
        if trace is not None:
            chunks = {stamp: np.asarray(trace["chunk"], np.float32) for stamp in produced}
        else:
            chunks, names = golden.chunks, golden.action_names or names
        summary = match_chunks(produced, chunks, tol, min_produced=args.min_produced,
                               scale=action_scale(golden_settings, settings["variant"],
                                                  args.bundle_root))
    steps = result.published[0].chunk.flow_steps if result.published else settings.flow_steps()
    shown = {"variant": settings["variant"], "backend": settings["backend"],
             "instruction": settings["instruction"], "seed": settings["seed"],
             "flow_steps": steps}
    return verdict(item, result, summary, settings=shown, differences=differences,
                   action_names=names, recorded=recorded, seconds=time.perf_counter() - start)
