"""SIGINT/SIGTERM as a flag a long loop polls, so it can close its outputs before it exits."""

from __future__ import annotations

import signal
from typing import Any

#: the exit status a command returns after each signal (128 + the signal's number)
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


class StopSignals:
    """SIGINT/SIGTERM set a flag the replay loop polls, so the output bag gets closed."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in SIGNAL_EXIT:
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
