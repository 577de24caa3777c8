"""Waits without a bound and crashes before a word: a `--ray` address where something that is
not Ray answers, a start or join of Ray that never finishes or fails with a bare exception, an
environment that makes `import ray` die, and more threads than the machine has CPUs. Each ends
in one line naming the thing and the fix, or is capped with a warning."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from molmoact2_ros.cluster import connect
from molmoact2_ros.cluster.connect import ClusterError, cluster, probe
from molmoact2_ros.util import threads

pytestmark = pytest.mark.usefixtures("no_leaks")

REPO = Path(__file__).resolve().parents[2]
#: Ray's own text (ray/_private/node.py), raised as a bare Exception when its node does not
#: register in 30 s
RAY_STARTUP_TIMEOUT = ("The current node timed out during startup. This could happen because "
                       "some of the raylet failed to startup or the GCS has become overloaded.")


class Listener:
    """A TCP listener on a free local port that answers each connection with ``banner`` (or
    says nothing), as a service that is not Ray would."""

    def __init__(self, banner: bytes = b"") -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.stop = threading.Event()
        self.banner = banner
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, name="test-listener", daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            if self.banner:
                conn.sendall(self.banner)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for conn in self.conns:
            conn.close()
        self.sock.close()


@pytest.mark.parametrize("banner,words", [
    (b"", "said nothing"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "an SSH server answered (SSH-2.0-OpenSSH_9.6)"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "an HTTP/1 server answered (HTTP/1.1 400"),
    (b"+OK redis\r\n", "not HTTP/2"),
])
def test_a_listener_that_is_not_ray_is_refused_naming_what_answered(banner, words):
    listener = Listener(banner)
    try:
        with pytest.raises(ClusterError) as err:
            probe(listener.address, timeout_s=2.0)
    finally:
        listener.close()
    text = str(err.value)
    assert "not a Ray cluster" in text and words in text and "ray start --head" in text, text
    assert "\n" not in text


def test_a_join_that_never_finishes_ends_at_its_deadline(monkeypatch):
    ray = pytest.importorskip("ray")
    release = threading.Event()
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: release.wait(60))  # retries for minutes
    monkeypatch.setattr(connect, "probe", lambda address: None)  # a gRPC server answered
    monkeypatch.setattr(connect, "JOIN_TIMEOUT_S", 0.5, raising=False)
    try:
        with pytest.raises(ClusterError, match="did not accept this process as a Ray driver"):
            with cluster("127.0.0.1:6379"):
                pass
    finally:
        release.set()


@pytest.mark.parametrize("address", ["local", "127.0.0.1:6379"])
def test_a_bare_startup_exception_of_ray_is_one_line_with_the_fix(monkeypatch, address):
    ray = pytest.importorskip("ray")

    def init(**kwargs):
        raise Exception(RAY_STARTUP_TIMEOUT)  # noqa: TRY002  (what Ray raises)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(connect, "probe", lambda address: None)
    with pytest.raises(ClusterError) as err:
        with cluster(address):
            pass
    text = str(err.value)
    assert "did not start within its 30 s" in text and "ray start --head" in text, text
    assert "\n" not in text


@pytest.mark.parametrize("name,value", [
    ("RAY_worker_niceness", "abc"), ("RAY_worker_niceness", "1.5"), ("RAY_worker_niceness", ""),
    ("LP_NUM_THREADS", "many"), ("MOLMOACT2_THREADS", "-3"),
])
def test_an_environment_that_would_crash_ray_is_refused_before_ray_is_imported(name, value):
    # `import ray` with RAY_worker_niceness=abc dies by SIGSEGV, no message
    code = ("import sys\n"
            "from molmoact2_ros.cluster.connect import ClusterError, import_ray\n"
            "from molmoact2_ros.errors import MolmoActError\n"
            "try:\n    import_ray()\n"
            "except MolmoActError as exc:\n"
            "    print(exc); sys.exit(3 if 'ray' not in sys.modules else 4)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), name: value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 3, (out.returncode, out.stderr[-2000:])
    assert f"{name}={value!r}" in out.stdout and out.stdout.count("\n") == 1, out.stdout


def test_more_threads_than_cpus_are_capped_with_one_warning(monkeypatch, caplog):
    cpus = threads.machine_cpus()
    monkeypatch.setenv(threads.ENV, "1024")
    monkeypatch.setattr(threads, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="molmoact2_ros"):
        assert threads.threads_from_env() == cpus
        assert threads.threads_from_env() == cpus
    said = [r.getMessage() for r in caplog.records if threads.ENV in r.getMessage()]
    assert len(said) == 1 and f"{cpus} threads used" in said[0], said
    monkeypatch.setenv(threads.ENV, str(cpus))
    assert threads.threads_from_env() == cpus  # within the CPUs: as given
