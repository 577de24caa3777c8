"""Approximate-time synchroniser and the newest-only observation slot, without ROS.

One implementation serves the node and rosbag replay, so replay pairs observations exactly
as the robot does. Stamps are integer nanoseconds.

An observation is the two cameras and the robot state (``OBSERVATION_STREAMS``). Its state is
never older than its earliest image: a state from the control step before would be within the
slop of the images (the slop is one 50 ms step) whenever the images are handled before their
step's state, and the chunk would then be computed from a stale state and stamped one step
early. The observation's stamp is its earliest image's (``observation_stamp_ns``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: the synchronised streams of an observation: primary camera, wrist camera, robot state
IMAGE_STREAMS = (0, 1)
STATE_STREAM = 2
OBSERVATION_STREAMS = 3


@dataclass(frozen=True)
class Stamped:
    """A message with its header stamp (ns) and the stream it came from."""

    stream: int
    stamp_ns: int
    msg: Any


class ApproxTimeSync:
    """Emit one message per stream whose stamps lie within ``slop_ns`` of each other.

    On each arrival the newest message is matched with the closest-in-time message of every
    other stream; a match is emitted once, and everything up to it is consumed, so a message
    is used at most once and output stamps never go backwards. A stream in ``not_older``
    only pairs messages stamped at or after the earliest of the other streams' (a robot state
    is never older than the images it goes with); until one arrives, nothing is emitted.
    """

    def __init__(
        self,
        num_streams: int,
        slop_ns: int,
        queue_size: int,
        callback: Callable[[Sequence[Stamped]], None],
        *,
        not_older: Sequence[int] = (),
    ) -> None:
        if num_streams < 1 or queue_size < 1 or slop_ns < 0:
            raise ValueError("need num_streams >= 1, queue_size >= 1, slop_ns >= 0")
        if any(not 0 <= s < num_streams for s in not_older) or len(set(not_older)) >= num_streams:
            raise ValueError("not_older names streams, and not all of them")
        self.slop_ns = slop_ns
        self._not_older = frozenset(not_older)
        self._queues: list[deque[Stamped]] = [deque(maxlen=queue_size) for _ in range(num_streams)]
        self._callback = callback
        self._lock = threading.Lock()
        self._last_emitted_ns = -1
        self.dropped_out_of_order = 0

    def add(self, stream: int, stamp_ns: int, msg: Any) -> bool:
        """Add a message; returns True when it completed a synchronised set."""
        item = Stamped(stream, int(stamp_ns), msg)
        with self._lock:
            if item.stamp_ns <= self._last_emitted_ns - self.slop_ns:
                self.dropped_out_of_order += 1
                return False
            self._queues[stream].append(item)
            match = self._match(item)
            if match is None:
                return False
            newest = max(m.stamp_ns for m in match)
            for q, used in zip(self._queues, match):
                while q and q[0].stamp_ns <= used.stamp_ns:
                    q.popleft()
            self._last_emitted_ns = newest
        self._callback(match)
        return True

    def reset(self) -> None:
        """Forget queued messages and the last emitted stamp (the clock went back)."""
        with self._lock:
            for q in self._queues:
                q.clear()
            self._last_emitted_ns = -1

    def _match(self, item: Stamped) -> list[Stamped] | None:
        chosen: list[Stamped | None] = [None] * len(self._queues)
        for stream, q in enumerate(self._queues):  # the leading streams first
            if stream in self._not_older:
                continue
            if stream == item.stream:
                chosen[stream] = item
            elif not q:
                return None
            else:
                chosen[stream] = min(q, key=lambda m: abs(m.stamp_ns - item.stamp_ns))
        earliest = min(m.stamp_ns for m in chosen if m is not None)
        for stream in self._not_older:
            if stream == item.stream:
                candidates = [item]
            else:
                candidates = list(self._queues[stream])
            candidates = [m for m in candidates if m.stamp_ns >= earliest]
            if not candidates:
                return None
            chosen[stream] = min(candidates, key=lambda m: abs(m.stamp_ns - item.stamp_ns))
        stamps = [m.stamp_ns for m in chosen]
        return chosen if max(stamps) - min(stamps) <= self.slop_ns else None


def observation_sync(slop_s: float, queue_size: int,
                     callback: Callable[[Sequence[Stamped]], None]) -> ApproxTimeSync:
    """The synchroniser of the node and of replay: both cameras and a state not older than
    them (``sync.slop_s``, ``sync.queue_size``)."""
    return ApproxTimeSync(OBSERVATION_STREAMS, int(round(slop_s * 1e9)), queue_size, callback,
                          not_older=(STATE_STREAM,))


def observation_stamp_ns(items: Sequence[Stamped]) -> int:
    """The stamp of a synchronised observation: its earliest image's (the state is not older,
    so it is the time the observation shows; the chunk carries it)."""
    return min(items[i].stamp_ns for i in IMAGE_STREAMS)


class NewestSlot:
    """Holds only the newest observation; older unread ones are replaced and counted."""

    def __init__(self) -> None:
        self._item: Any = None
        self._stamp_ns = 0
        self._cond = threading.Condition()
        self.replaced = 0

    def put(self, item: Any, stamp_ns: int) -> None:
        with self._cond:
            if self._item is not None:
                self.replaced += 1
            self._item, self._stamp_ns = item, stamp_ns
            self._cond.notify_all()

    def take(self, timeout_s: float | None = 0.0) -> tuple[Any, int] | None:
        """Remove and return ``(item, stamp_ns)``, waiting up to ``timeout_s``."""
        with self._cond:
            if self._item is None and timeout_s:
                self._cond.wait(timeout_s)
            if self._item is None:
                return None
            item, stamp = self._item, self._stamp_ns
            self._item = None
            return item, stamp

    def clear(self) -> None:
        with self._cond:
            self._item = None
            self._cond.notify_all()
