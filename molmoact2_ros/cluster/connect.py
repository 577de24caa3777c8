"""``--ray [ADDRESS]``: start a local Ray cluster or join an existing one, refused in one
line when Ray is missing or nobody answers at the address."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from ..errors import MolmoActError
from ..util.optional import require

#: ``--ray`` alone
LOCAL = "local"
#: seconds to wait for a TCP answer at ADDRESS before refusing it
PROBE_TIMEOUT_S = 5.0
_HOST_PORT = re.compile(r"^(?:ray://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class ClusterError(MolmoActError):
    """The cluster cannot be used: unreachable, mismatched, or its actors keep failing."""


def is_address(text: str | None) -> bool:
    """``local``, ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``: what ``--ray`` accepts (any
    other word after ``--ray`` is the command's first positional argument)."""
    return text is not None and (text in (LOCAL, "auto") or bool(_HOST_PORT.match(text)))


def import_ray(purpose: str = "--ray") -> ModuleType:
    """Ray, or one line naming the extra that installs it."""
    return require("ray", purpose)


def check_address(address: str) -> None:
    """Refuse a ``HOST:PORT`` whose port is not a TCP port (``99999`` would be probed as
    ``99999 % 65536``)."""
    match = _HOST_PORT.match(address or "")
    if match is not None and not 1 <= int(match.group(2)) <= 65535:
        raise ClusterError(f"--ray {address}: port {int(match.group(2))} is outside 1..65535; "
                           "give the address `ray start --head` printed")


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse an address where nothing accepts a TCP connection (``ray.init`` would retry for
    a minute or more before failing)."""
    check_address(address)
    match = _HOST_PORT.match(address)
    if match is None:
        return
    host, port = match.group(1).strip("[]"), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ClusterError(
            f"--ray {address}: no Ray cluster answers there ({reason}); start one with "
            "`ray start --head` and pass the address it prints, or use --ray local") from None


#: the priority Ray starts a local cluster's worker processes at (Ray's default: nice 15)
NICENESS_ENV = "RAY_worker_niceness"


@contextmanager
def cluster(address: str, *, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray, initialised for the ``with`` block: ``local`` starts a cluster sized to this
    machine (or uses the one this process already started), an address joins that cluster.
    A cluster started here is shut down at the end; a joined one is only disconnected."""
    ray = import_ray()
    if address != LOCAL:
        probe(address)
    if ray.is_initialized():  # started by the caller (a test, a notebook): use it as it is
        yield ray
        return
    kwargs = {"include_dashboard": False, "log_to_driver": False,
              "logging_level": logging.WARNING, "configure_logging": True}
    try:
        if address == LOCAL:
            # the actors do the run's work while this process waits on them: at Ray's default
            # nice 15 any other work on the machine would starve them, so they get ours
            os.environ.setdefault(NICENESS_ENV, str(os.nice(0)))
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
        else:
            ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ClusterError(f"--ray {address}: cannot join the Ray cluster: {first}") from None
    try:
        yield ray
    finally:
        ray.shutdown()
