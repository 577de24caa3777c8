"""Approximate-time synchroniser and the newest-only observation slot, without ROS.

One implementation serves the node and rosbag replay, so replay pairs observations exactly
as the robot does. Stamps are integer nanoseconds.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


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
    is used at most once and output stamps never go backwards.
    """

    def __init__(
        self,
        num_streams: int,
        slop_ns: int,
        queue_size: int,
        callback: Callable[[Sequence[Stamped]], None],
    ) -> None:
        if num_streams < 1 or queue_size < 1 or slop_ns < 0:
            raise ValueError("need num_streams >= 1, queue_size >= 1, slop_ns >= 0")
        self.slop_ns = slop_ns
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
        chosen: list[Stamped] = []
        for stream, q in enumerate(self._queues):
            if stream == item.stream:
                chosen.append(item)
                continue
            if not q:
                return None
            chosen.append(min(q, key=lambda m: abs(m.stamp_ns - item.stamp_ns)))
        stamps = [m.stamp_ns for m in chosen]
        return chosen if max(stamps) - min(stamps) <= self.slop_ns else None


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
