"""Work items fanned out over Ray actors: each actor does a one-time setup (a bundle and policy
load, an env build) and then runs many items, one at a time; results stream to a callback as
they finish. An actor that dies has its item re-run on a new actor (bounded retries), and no
item is reported twice. An item that gives no result within its deadline (a GL deadlock, a hung
worker) has its actor killed and is re-run the same way, then reported as its error while the
other items go on. The caller's ledger decides what is already done (resume).
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .connect import ClusterError, import_ray

#: seconds between checks of ``should_stop`` while waiting for results
POLL_S = 0.5
#: seconds a finished actor gets to release what its setup loaded before it is killed
CLOSE_TIMEOUT_S = 60.0
#: seconds an actor's setup may take (a bundle load on a slow node) before it is killed
SETUP_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Resources:
    """What one actor declares, so Ray places it: CPUs, memory (bytes, 0 = not declared) and
    GPUs (e.g. one per LIBERO env rendering with ``MUJOCO_GL=egl``)."""

    num_cpus: float = 1.0
    memory_bytes: int = 0
    num_gpus: float = 0.0

    def thread_caps(self) -> dict[str, str]:
        """Environment that keeps an actor's own threads within its declared CPUs: Mesa's
        llvmpipe render threads and the package's (``MOLMOACT2_THREADS``: ONNX Runtime's pool,
        the cameras side by side); Ray already caps ``OMP_NUM_THREADS`` the same way. A value
        set in the driver's environment wins."""
        threads = str(max(1, int(self.num_cpus)))
        caps = {"LP_NUM_THREADS": threads, "MOLMOACT2_THREADS": threads}
        return {k: os.environ.get(k, v) for k, v in caps.items()}

    def options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_cpus": self.num_cpus}
        if self.memory_bytes:
            out["memory"] = int(self.memory_bytes)
        if self.num_gpus:
            out["num_gpus"] = self.num_gpus
        return out

    def fit(self, available: dict[str, float]) -> int:
        """How many such actors the resources ``available`` hold."""
        counts = [int(available.get("CPU", 0.0) // self.num_cpus) if self.num_cpus else 1 << 30]
        if self.memory_bytes:
            counts.append(int(available.get("memory", 0.0) // self.memory_bytes))
        if self.num_gpus:
            counts.append(int(available.get("GPU", 0.0) // self.num_gpus))
        return min(counts)

    def describe(self) -> str:
        parts = [f"{self.num_cpus:g} CPU"]
        if self.memory_bytes:
            parts.append(f"{self.memory_bytes / 2**30:.1f} GiB memory")
        if self.num_gpus:
            parts.append(f"{self.num_gpus:g} GPU")
        return ", ".join(parts)


@dataclass(frozen=True)
class Job:
    """What every actor runs: ``setup(setup_arg)`` once, giving its state; ``work(state,
    payload)`` per item; ``teardown(state)`` at the end. Module-level functions, so an actor
    on another machine imports them from the installed package."""

    setup: Callable[[Any], Any]
    work: Callable[[Any, Any], Any]
    setup_arg: Any = None
    teardown: Callable[[Any], None] | None = None


@dataclass
class Outcome:
    """One finished item: its value, or ``error`` (its work raised, or its actors died more
    than ``max_retries`` times running it); times in seconds."""

    key: str
    value: Any = None
    error: str = ""
    work_s: float = 0.0
    round_trip_s: float = 0.0
    attempts: int = 1
    actor: int = -1
    host: str = ""


@dataclass
class FanoutStats:
    """How a fan-out went: actors, deaths and retries, and where the time went."""

    items: int = 0
    actors: int = 0
    actors_started: int = 0
    deaths: int = 0
    retries: dict[str, int] = field(default_factory=dict)
    #: items whose deadline passed, with how many times (their actor was killed each time)
    timeouts: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    setup_s: list[float] = field(default_factory=list)
    work_s: float = 0.0
    round_trip_s: float = 0.0
    #: time the driver spent handling results (reporting, ledger, dispatching the next item)
    driver_s: float = 0.0
    wall_s: float = 0.0
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def overhead_fraction(self) -> float:
        """Scheduling overhead per item (dispatch to result, minus the work itself) as a
        fraction of the work."""
        return (self.round_trip_s - self.work_s) / self.work_s if self.work_s > 0 else 0.0


class _Runner:
    """The actor: holds the state of one setup and runs items one at a time."""

    def __init__(self, job: Job, environment: dict[str, str] | None = None) -> None:
        # set here, before the job's setup builds anything that reads them (an EGL context,
        # ONNX sessions); a runtime_env would cost a fresh worker process per actor instead
        os.environ.update(environment or {})
        self.job = job
        self.state: Any = None

    def setup(self) -> dict[str, Any]:
        from .. import __version__

        start = time.perf_counter()
        try:
            self.state = self.job.setup(self.job.setup_arg)
        except Exception as exc:  # named with the node: bundles must be visible on every one
            raise ClusterError(f"on {socket.gethostname()}: {_cause(exc)}") from None
        return {"pid": os.getpid(), "host": socket.gethostname(), "version": __version__,
                "seconds": time.perf_counter() - start}

    def run(self, payload: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        value = self.job.work(self.state, payload)
        return value, time.perf_counter() - start

    def close(self) -> None:
        state, self.state = self.state, None
        if self.job.teardown is not None and state is not None:
            self.job.teardown(state)


def _cause(exc: BaseException) -> str:
    """The one-line message of a remote error (the original exception where Ray keeps it)."""
    from ..errors import MolmoActError

    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, MolmoActError):
        return str(cause)
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}".rstrip(": ")


@dataclass
class _Slot:
    index: int
    handle: Any = None
    info: dict[str, Any] = field(default_factory=dict)


def fan_out(
    items: Sequence[tuple[str, Any]],
    job: Job,
    on_result: Callable[[Outcome], None],
    *,
    resources: Resources = Resources(),
    actors: int | None = None,
    max_retries: int = 1,
    done: Iterable[str] = (),
    should_stop: Callable[[], bool] | None = None,
    on_dispatch: Callable[[str, int, dict[str, Any]], None] | None = None,
    item_timeout_s: float | dict[str, float] | None = None,
) -> FanoutStats:
    """Run ``job.work`` on every ``(key, payload)`` whose key is not in ``done``, over actors
    of the connected Ray cluster; ``on_result`` gets each ``Outcome`` once, as it finishes.

    ``actors`` defaults to as many as the cluster's resources hold (never more than items).
    ``on_dispatch(key, actor, info)`` sees each item handed to an actor (``info`` holds the
    actor's pid and host). A setup that raises ends the run with its message (a missing
    bundle on a node is not a reason to retry); ``should_stop`` is polled and ends the run
    early, every finished item already reported. ``item_timeout_s`` (one value, or one per
    key) bounds each item from its dispatch: past it the actor is killed and the item re-run
    on a new one, at most ``max_retries`` times, then reported as its error.
    """
    ray = import_ray()
    from ray.exceptions import RayError, RayTaskError

    from .. import __version__

    skip = set(done)
    todo = [(k, p) for k, p in items if k not in skip]
    stats = FanoutStats(items=len(todo))
    keys = [k for k, _ in todo]
    if len(set(keys)) != len(keys):
        raise ClusterError("two work items share a key; keys name items in the ledger")
    if not todo:
        return stats
    fit = resources.fit(ray.cluster_resources())
    if fit < 1:
        raise ClusterError(f"no node of the Ray cluster can hold an actor of "
                           f"{resources.describe()}; lower the request or add a node")
    wanted = actors or fit
    if wanted > fit:
        stats.notes.append(f"{wanted} actors asked, the cluster holds {fit} of "
                           f"{resources.describe()}: running {fit}")
    count = max(1, min(wanted, fit, len(todo)))
    stats.actors = count
    payloads = dict(todo)
    queue: deque[str] = deque(keys)
    attempts: dict[str, int] = {}
    reported: set[str] = set()
    remote_cls = ray.remote(_Runner).options(max_restarts=0, max_task_retries=0,
                                              **resources.options())
    pending: dict[Any, tuple[str, _Slot, str, float]] = {}
    restarts_left = count * (max_retries + 1)
    start = time.perf_counter()

    def deadline_of(kind: str, key: str) -> float | None:
        if kind == "setup":
            return SETUP_TIMEOUT_S
        if isinstance(item_timeout_s, dict):
            return item_timeout_s.get(key)
        return item_timeout_s

    def expire(now: float) -> None:
        """Kill the actors of items past their deadline; re-run or report those items."""
        nonlocal restarts_left
        for ref, (kind, slot, key, sent) in list(pending.items()):
            limit = deadline_of(kind, key)
            if limit is None or now - sent <= limit:
                continue
            pending.pop(ref)
            ray.kill(slot.handle, no_restart=True)
            slot.handle = None
            if kind == "setup":  # as a death: bounded by the restarts
                stats.deaths += 1
                if restarts_left <= 0:
                    raise ClusterError(f"actor setup gave no result in {limit:g} s, and "
                                       "again on every new actor")
                restarts_left -= 1
                launch(slot)
                continue
            attempts[key] = attempts.get(key, 0) + 1
            stats.timeouts[key] = stats.timeouts.get(key, 0) + 1
            if attempts[key] > max_retries:
                report(Outcome(key, error=(
                    f"no result within {limit:g} s (--item-timeout-s), {attempts[key]} times: "
                    "its actor was killed each time (a wedged item: a GL deadlock, a hung "
                    "worker?)"), attempts=attempts[key], actor=slot.index,
                    round_trip_s=now - sent))
            else:
                stats.retries[key] = attempts[key]
                queue.appendleft(key)
            if queue:  # a timeout is the item's, not the cluster's: no restart budget spent
                launch(slot)

    def launch(slot: _Slot) -> None:
        slot.handle = remote_cls.remote(job, resources.thread_caps())
        slot.info = {}
        stats.actors_started += 1
        pending[slot.handle.setup.remote()] = ("setup", slot, "", time.perf_counter())

    def dispatch(slot: _Slot) -> None:
        if not queue:
            return
        key = queue.popleft()
        if on_dispatch is not None:
            on_dispatch(key, slot.index, dict(slot.info))
        pending[slot.handle.run.remote(payloads[key])] = ("item", slot, key, time.perf_counter())

    def report(outcome: Outcome) -> None:
        if outcome.key in reported:
            stats.duplicates += 1
            return
        reported.add(outcome.key)
        on_result(outcome)

    slots = [_Slot(i) for i in range(count)]
    for slot in slots:
        launch(slot)
    try:
        while pending:
            if should_stop is not None and should_stop():
                stats.interrupted = True
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            handled = time.perf_counter()
            for ref in ready:
                if ref not in pending:  # expired meanwhile
                    continue
                kind, slot, key, sent = pending.pop(ref)
                try:
                    value = ray.get(ref)
                except RayTaskError as exc:  # the setup or the work raised: no retry
                    if kind == "setup":
                        raise ClusterError(f"actor setup failed {_cause(exc)}") from None
                    report(Outcome(key, error=_cause(exc), attempts=attempts.get(key, 0) + 1,
                                   actor=slot.index, host=slot.info.get("host", ""),
                                   round_trip_s=time.perf_counter() - sent))
                    dispatch(slot)
                    continue
                except RayError as exc:  # the actor died (killed, crashed, its node lost)
                    stats.deaths += 1
                    cause = _cause(exc)
                    if kind == "item":
                        attempts[key] = attempts.get(key, 0) + 1
                        if attempts[key] > max_retries:
                            report(Outcome(key, error=f"its actor died {attempts[key]} times "
                                           f"running it (last: {cause})",
                                           attempts=attempts[key], actor=slot.index))
                        else:
                            stats.retries[key] = attempts[key]
                            queue.appendleft(key)
                    # the slot's other pending call (none: one item at a time) fails the same
                    ray.kill(slot.handle, no_restart=True)
                    if not queue:
                        continue
                    if restarts_left <= 0:
                        raise ClusterError(f"actors keep dying ({stats.deaths} so far, last: "
                                           f"{cause}); {len(queue)} items not run") from None
                    restarts_left -= 1
                    launch(slot)
                    continue
                if kind == "setup":
                    slot.info = value
                    stats.setup_s.append(float(value["seconds"]))
                    if value.get("version") != __version__:
                        raise ClusterError(
                            f"molmoact2_ros {value.get('version')} on {value.get('host')}, "
                            f"{__version__} here: install the same version on every node")
                    dispatch(slot)
                    continue
                result, work_s = value
                round_trip = time.perf_counter() - sent
                stats.work_s += work_s
                stats.round_trip_s += round_trip
                report(Outcome(key, result, work_s=work_s, round_trip_s=round_trip,
                               attempts=attempts.get(key, 0) + 1, actor=slot.index,
                               host=slot.info.get("host", "")))
                dispatch(slot)
            expire(time.perf_counter())
            stats.driver_s += time.perf_counter() - handled
    finally:
        stats.wall_s = time.perf_counter() - start
        _stop(ray, slots, graceful=not pending)
    return stats


def _stop(ray, slots: list[_Slot], *, graceful: bool) -> None:
    """Let idle actors release what their setup loaded, then kill every actor."""
    handles = [s.handle for s in slots if s.handle is not None]
    if graceful and handles:
        refs = [h.close.remote() for h in handles]
        ray.wait(refs, num_returns=len(refs), timeout=CLOSE_TIMEOUT_S)
    for handle in handles:
        ray.kill(handle, no_restart=True)
