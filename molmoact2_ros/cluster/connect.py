"""``--ray [ADDRESS]``: start a local Ray cluster or join an existing one, refused in one
line when Ray is missing, the environment would crash it, nobody answers at the address,
something that is not Ray answers there, or the join or the start does not finish in time."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
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
    """Ray, or one line naming the extra that installs it; the environment is checked first
    (``import ray`` itself dies by SIGSEGV on a bad ``RAY_worker_niceness``)."""
    check_environment()
    return require("ray", purpose)


def _int_env(name: str, low: int, high: int, what: str) -> None:
    raw = os.environ.get(name)
    if raw is None:
        return
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ClusterError(f"{name}={raw!r}: give {what}, a whole number in {low}..{high}, or "
                           f"unset it")


def check_environment() -> None:
    """The environment variables this package sets or reads for Ray, checked before Ray is
    imported: ``RAY_worker_niceness`` (which Ray reads at import), ``LP_NUM_THREADS`` (passed
    to the actors), ``MOLMOACT2_THREADS`` and ``MOLMOACT2_NUMBA``."""
    from ..host.jit import switched_off
    from ..util.threads import threads_from_env

    _int_env(NICENESS_ENV, -20, 19, "the workers' nice value")
    _int_env("LP_NUM_THREADS", 0, 1024, "Mesa's render threads")
    threads_from_env()
    switched_off()


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
    what = answer_at(host, port, timeout_s)
    if what is not None:
        raise ClusterError(
            f"--ray {address}: not a Ray cluster: {what}; give the address `ray start --head` "
            "printed (its GCS port, 6379 by default), or ray://HOST:10001 for a Ray Client "
            "server")


#: HTTP/2's client connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS,
#: a Ray Client server) answers with a SETTINGS frame of its own
_H2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 0x04


def answer_at(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a gRPC (HTTP/2) server answers at ``host:port``, as Ray's do; else what
    answered the greeting, in words."""
    data, closed = b"", False
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(_H2_GREETING)
            deadline = time.monotonic() + timeout_s
            while len(data) < 9:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                try:
                    chunk = sock.recv(256)
                except TimeoutError:
                    break
                if not chunk:
                    closed = True
                    break
                data += chunk
    except OSError as exc:
        return f"the connection failed ({exc.strerror or type(exc).__name__})"
    if len(data) >= 9 and data[3] == _SETTINGS:
        return None
    first = data.split(b"\n", 1)[0].strip().decode("ascii", "replace")[:60]
    if data.startswith(b"SSH-"):
        return f"an SSH server answered ({first})"
    if data.startswith(b"HTTP/"):
        return f"an HTTP/1 server answered ({first})"
    if data:
        return f"a server answered {data[:24]!r}, not HTTP/2"
    if closed:
        return "a TCP listener closed the connection at an HTTP/2 greeting"
    return f"a TCP listener accepted but said nothing in {timeout_s:g} s to an HTTP/2 greeting"


#: what Ray adds to its raylet's (so the caller's) nice value for a local cluster's workers
#: (Ray's default: 15)
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
            # nice 15 any other work on the machine would starve them, so they get ours. Ray
            # adds the value to the priority its raylet inherited from us: 0 keeps ours
            os.environ.setdefault(NICENESS_ENV, "0")
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kwargs)
        else:
            _join(ray, address, kwargs)
    except ClusterError:
        raise
    except Exception as exc:  # Ray raises bare Exceptions too (a node that timed out starting)
        raise ClusterError(startup_error(address, exc)) from None
    try:
        yield ray
    finally:
        ray.shutdown()


#: seconds ``ray.init`` may take to join a cluster that answered (it retries for minutes)
JOIN_TIMEOUT_S = 120.0


def _join(ray: ModuleType, address: str, kwargs: dict) -> None:
    """``ray.init(address)`` with a deadline: on a thread, so a cluster that answers but never
    accepts the driver cannot hold the command."""
    box: dict = {}

    def run() -> None:
        try:
            ray.init(address=address, **kwargs)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    quiet = logging.getLogger("ray._private.worker")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "SIGTERM handler is not set ... not the main thread"
    try:
        thread = threading.Thread(target=run, name="molmoact2-ray-join", daemon=True)
        thread.start()
        thread.join(JOIN_TIMEOUT_S)
    finally:
        quiet.setLevel(level)
    if thread.is_alive():
        raise ClusterError(
            f"--ray {address}: a gRPC server answered but did not accept this process as a Ray "
            f"driver within {JOIN_TIMEOUT_S:g} s; check it is the address `ray start --head` "
            "printed and that this Ray version matches the cluster's (`ray --version`)")
    if "error" in box:
        raise box["error"]


def startup_error(address: str, exc: BaseException) -> str:
    """One line with the fix for an error of ``ray.init``."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "timed out during startup" in text:
        return (f"--ray {address}: Ray's processes did not start within its 30 s ({first}); "
                "the machine is busy or a raylet failed (see Ray's session logs): retry, or "
                "start a cluster once with `ray start --head` and pass --ray HOST:PORT")
    if address == LOCAL:
        return (f"--ray: cannot start a local Ray cluster: {first}; check `ray start --head` "
                "works on this machine")
    return f"--ray {address}: cannot join the Ray cluster: {first}"
