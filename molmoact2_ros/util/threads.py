"""``MOLMOACT2_THREADS``: how many threads this process's own compute may use.

Unset or 0: as many as help (ONNX Runtime's pool over every core, the two cameras preprocessed
side by side). A Ray actor sets it to the CPUs it declared, so actors sharing a machine do not
each spread over every core (as Ray does with ``OMP_NUM_THREADS``). A count above the CPUs this
process may run on is capped at them, with a warning: 1024 threads on 2 cores make no progress.
"""

from __future__ import annotations

import logging
import os

from ..errors import MolmoActError

log = logging.getLogger("molmoact2_ros.util.threads")
_warned: set[str] = set()

ENV = "MOLMOACT2_THREADS"
MAX_THREADS = 1024


def threads_from_env() -> int:
    """The variable as an int in 0..1024 (0 when unset); anything else is refused, named."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_THREADS:
        raise MolmoActError(f"{ENV}={raw!r}: give a whole number of threads in 0..{MAX_THREADS} "
                            "(0 or unset: as many as help)")
    cpus = machine_cpus()
    if value > cpus:
        if raw not in _warned:
            _warned.add(raw)
            log.warning("%s=%s is more than the %d CPUs this process may use: %d threads used",
                        ENV, raw, cpus, cpus)
        return cpus
    return value


def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity; else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
