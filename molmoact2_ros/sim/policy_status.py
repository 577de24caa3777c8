"""The worst status the policy reported during an episode, kept for the ledger.

The ROS sim node reads the policy node's ``/diagnostics``; the in-process loop samples the
controller's ``diagnostics()``. Either way an episode's record says how bad it got (``OK`` ..
``ERROR``), with the message of the worst status and how many statuses reported a stall of the
output watchdog, so a stall across an episode reset shows up in the results.
"""

from __future__ import annotations

import threading
from typing import Any

from ..control.controller import STALL_MESSAGE

#: Severity order (``diagnostic_msgs/DiagnosticStatus`` numbers STALE 3, above ERROR 2; a
#: stale status only means nothing was heard, so it ranks below ERROR here).
LEVELS = ("OK", "WARN", "STALE", "ERROR")
_BY_NUMBER = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}


def level_name(level: Any) -> str:
    """``OK``/``WARN``/``ERROR``/``STALE`` from a DiagnosticStatus level (a one-byte ``bytes`` in
    rclpy, or an int) or the controller's ``ok``/``warn``/``error``."""
    if isinstance(level, (bytes, bytearray)):
        level = level[0] if len(level) == 1 else -1
    if isinstance(level, str):
        name = level.upper()
        if name in LEVELS:
            return name
    elif isinstance(level, int) and level in _BY_NUMBER:
        return _BY_NUMBER[level]
    raise ValueError(f"unknown diagnostic level {level!r}; expected one of {', '.join(LEVELS)}")


class WorstStatus:
    """The worst of the statuses added (thread-safe: ROS callbacks add, the episode reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.worst: str | None = None
        self.message = ""
        self.statuses = 0
        self.stalls = 0

    def add(self, level: Any, message: str) -> None:
        name = level_name(level)
        with self._lock:
            self.statuses += 1
            if message.startswith(STALL_MESSAGE):
                self.stalls += 1
            if self.worst is None or LEVELS.index(name) > LEVELS.index(self.worst):
                self.worst, self.message = name, message

    def to_json(self) -> dict[str, Any]:
        """``{"worst": "OK", "message": ..., "statuses": n, "stalls": k}`` (worst None: no
        status was seen)."""
        with self._lock:
            return {"worst": self.worst, "message": self.message, "statuses": self.statuses,
                    "stalls": self.stalls}


def summarize_statuses(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The worst policy status over episodes, with the episode it came from; None when no record
    carries one (a ledger written before the field existed)."""
    seen = [r for r in records if (r.get("policy_diagnostics") or {}).get("worst")]
    if not seen:
        return None
    worst = max(seen, key=lambda r: LEVELS.index(r["policy_diagnostics"]["worst"]))
    d = worst["policy_diagnostics"]
    return {"worst": d["worst"], "message": d.get("message", ""), "episode": worst["key"],
            "episodes": len(seen),
            "statuses": sum(r["policy_diagnostics"].get("statuses", 0) for r in seen),
            "stalls": sum(r["policy_diagnostics"].get("stalls", 0) for r in seen)}
