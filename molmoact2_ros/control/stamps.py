"""Observation stamps against the clock: future stamps, out-of-order stamps, clock jumps."""

from __future__ import annotations

import threading

#: A clock that goes back by more than this is a jump (sim-time reset, bag loop), not jitter.
CLOCK_JUMP_BACK_S = 1.0
#: Forward steps larger than this are counted (and logged) as jumps; nothing is reset for them.
CLOCK_JUMP_FORWARD_S = 5.0


class StampGate:
    """Decides whether an observation stamp may enter, and notices the clock going back.

    Stamps and clock readings are integer nanoseconds. ``admit`` returns a drop reason
    (``future_stamp`` or ``out_of_order``) or ``None``; ``clock_jump`` returns the size of a
    backward jump of the clock (negative ns) since the last reading, or 0.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_stamp_ns: int | None = None
        self.last_clock_ns: int | None = None

    def admit(self, stamp_ns: int, now_ns: int, future_tolerance_s: float) -> str | None:
        with self._lock:
            if stamp_ns - now_ns > future_tolerance_s * 1e9:
                return "future_stamp"
            if self.last_stamp_ns is not None and stamp_ns < self.last_stamp_ns:
                return "out_of_order"
            self.last_stamp_ns = stamp_ns
            return None

    def clock_jump(self, now_ns: int) -> int:
        """Record a clock reading; a backward step beyond ``CLOCK_JUMP_BACK_S`` is returned."""
        with self._lock:
            last, self.last_clock_ns = self.last_clock_ns, now_ns
        if last is None:
            return 0
        delta = now_ns - last
        if delta < -CLOCK_JUMP_BACK_S * 1e9 or delta > CLOCK_JUMP_FORWARD_S * 1e9:
            return delta
        return 0

    def reset(self, now_ns: int | None = None) -> None:
        with self._lock:
            self.last_stamp_ns = None
            self.last_clock_ns = now_ns


def describe_jump(delta_ns: int) -> str:
    """One line for logs and diagnostics, e.g. ``clock jumped back 990.000 s``."""
    direction = "back" if delta_ns < 0 else "forward"
    return f"clock jumped {direction} {abs(delta_ns) / 1e9:.3f} s"
