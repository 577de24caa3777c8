"""Runtime faults over the fake qai_appbuilder: every stage, every way a worker or parent dies.

Each case asserts the message the operator sees and that no child process, fd, /dev/shm entry
or memfd mapping is left behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from htp_helpers import Snapshot, ensure_contexts, fake_env, marker_injector, process_gone

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.errors import RuntimeBackendError, WorkerFailed
from molmoact2_ros.runtime.htp_backend import ResidentPipeline

pytest.importorskip("onnxruntime")

VARIANT = "lp_vtp_sd"
TIMEOUT_S = 2.0
LOGGER = "molmoact2_ros.runtime"


def _memfd_maps() -> int:
    with open("/proc/self/maps", encoding="utf-8") as f:
        return sum("/memfd:" in line for line in f)


@pytest.fixture(scope="module")
def control(tiny_root, tmp_path_factory):
    ensure_contexts(tiny_root)
    folder = tmp_path_factory.mktemp("fault-control")
    with pytest.MonkeyPatch.context() as mp:
        fake_env(mp, folder)
        yield folder


@pytest.fixture
def events(control, monkeypatch, tmp_path) -> Path:
    """The fake's event log for this test (loads, perf votes, destroys, Config environment)."""
    path = tmp_path / "events.log"
    monkeypatch.setenv("FAKE_QAI_EVENT_LOG", str(path))
    return path


@pytest.fixture
def clean(control):
    """Asserts, after the test, that nothing the test started is left over."""
    before, maps = Snapshot.take(), _memfd_maps()
    yield
    leaks = Snapshot.take().leaks_since(before)
    assert not leaks, leaks
    assert _memfd_maps() <= maps, "an arena memfd is still mapped"


@pytest.fixture
def inject(control):
    yield from marker_injector(control)


def _open(root: Path, **options) -> ResidentPipeline:
    options.setdefault("call_timeout_s", TIMEOUT_S)
    options.setdefault("stop_timeout_s", TIMEOUT_S)
    return ResidentPipeline.open(Bundle.open(root / VARIANT), **options)


def _chunk(pipe: ResidentPipeline) -> np.ndarray:
    pipe.run_vision()
    pad = pipe.input_buffer("action_dim_is_pad").shape[-1]
    return pipe.run_action(np.zeros((1, 10, pad), np.float32), 2)


def _read_events(path: Path) -> list[tuple[int, float, str]]:
    rows = []
    for line in path.read_text().splitlines():
        pid, stamp, text = line.split(" ", 2)
        rows.append((int(pid), float(stamp), text))
    return rows


def _wait_gone(pids, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(process_gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


# -- load ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "graph", "worker", "message"),
    [
        ("CRASH_LOAD", "llm_split1", "llm_split1", "was killed by SIGSEGV while loading"),
        ("FAIL_LOAD", "action_step", "action", "session action_step did not load"),
        ("HANG_LOAD", "vision", "vision", "did not finish loading within 15 s and was killed"),
    ],
)
def test_fault_while_loading(control, clean, tiny_root, monkeypatch, kind, graph, worker,
                             message):
    monkeypatch.setenv(f"FAKE_QAI_{kind}", graph)
    with pytest.raises(WorkerFailed) as err:
        _open(tiny_root, start_timeout_s=15.0)
    assert err.value.worker == worker and message in str(err.value)


# -- serving ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("graph", "worker"), [("vision", "vision"),
                                               ("action_context", "action")])
def test_segfault_during_a_call_names_the_session(clean, inject, tiny_root, graph, worker):
    with _open(tiny_root) as pipe:
        _chunk(pipe)
        inject(graph, "crash")
        with pytest.raises(WorkerFailed) as err:
            _chunk(pipe)
        assert (err.value.worker, err.value.session) == (worker, graph)
        assert "was killed by SIGSEGV" in str(err.value)


def test_hung_call_is_killed_at_the_deadline(clean, inject, tiny_root):
    with _open(tiny_root) as pipe:
        inject("llm_split2", "hang")
        start = time.monotonic()
        with pytest.raises(WorkerFailed) as err:
            _chunk(pipe)
        assert time.monotonic() - start < TIMEOUT_S + 3
        assert err.value.session == "llm_split2"
        assert f"did not answer a run request within {TIMEOUT_S:g} s and was killed" in str(
            err.value)


def test_sigkilled_idle_worker_is_reported_and_logged(clean, tiny_root, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    with _open(tiny_root) as pipe:
        victim = pipe.worker_pids()["llm_split0"]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(WorkerFailed, match=f"pid {victim}\\) was killed by SIGKILL"):
            _chunk(pipe)
    assert f"worker llm_split0 (sessions llm_split0, pid {victim}) was killed by SIGKILL" in (
        caplog.text)


def test_stopped_worker_misses_the_deadline_and_is_killed(clean, tiny_root):
    with _open(tiny_root) as pipe:
        victim = pipe.worker_pids()["vision"]
        os.kill(victim, signal.SIGSTOP)
        with pytest.raises(WorkerFailed, match="did not answer a run request"):
            pipe.run_vision()
        assert _wait_gone([victim], 60.0)  # SIGKILL ends a stopped process too
        pipe.restart()
        _chunk(pipe)


def test_stopped_worker_does_not_block_close(clean, tiny_root, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    pipe = _open(tiny_root)
    pids = pipe.worker_pids()
    os.kill(pids["llm_split3"], signal.SIGSTOP)
    start = time.monotonic()
    pipe.close()
    assert time.monotonic() - start < TIMEOUT_S + 5
    assert _wait_gone(pids.values(), 60.0)
    assert "worker llm_split3 (sessions llm_split3, pid" in caplog.text
    assert "was killed by SIGKILL" in caplog.text


# -- stopping --------------------------------------------------------------------------------
def test_clean_close_logs_every_exit_status(clean, tiny_root, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    pipe = _open(tiny_root)
    _chunk(pipe)
    pipe.close()
    lines = [r.getMessage() for r in caplog.records if "answered stop, then exited" in
             r.getMessage()]
    assert len(lines) == 6 and all(line.endswith("exited with status 0") for line in lines)


def test_stop_is_answered_before_a_teardown_crash(clean, tiny_root, monkeypatch, caplog):
    """The known ModelDestroy segfault: the answer to STOP is already out when it happens."""
    caplog.set_level(logging.INFO, LOGGER)
    monkeypatch.setenv("FAKE_QAI_CRASH_RELEASE", "vision")
    pipe = _open(tiny_root, release_on_exit=True)
    pid = pipe.worker_pids()["vision"]
    pipe.close()
    assert f"worker vision (sessions vision, pid {pid}) answered stop, then was killed by " \
           "SIGSEGV" in caplog.text


def test_release_off_releases_the_vote_and_exits(clean, tiny_root, events):
    pipe = _open(tiny_root)
    pids = set(pipe.worker_pids().values())
    pipe.close()
    rows = [r for r in _read_events(events) if r[0] in pids]
    assert {pid for pid, _, text in rows if text == "perf_release"} == pids
    assert not [text for _, _, text in rows if text.startswith("destroy")]


def test_release_on_releases_the_vote_then_every_context(clean, tiny_root, events):
    pipe = _open(tiny_root, release_on_exit=True)
    pids = set(pipe.worker_pids().values())
    pipe.close()
    rows = [r for r in _read_events(events) if r[0] in pids]
    destroyed = sorted(text.split()[1] for _, _, text in rows if text.startswith("destroy"))
    assert destroyed == sorted(["vision", "llm_split0", "llm_split1", "llm_split2",
                                "llm_split3", "action_context", "action_step"])
    for pid in pids:
        texts = [text for p, _, text in rows if p == pid]
        release = texts.index("perf_release")
        assert all(i > release for i, t in enumerate(texts) if t.startswith("destroy"))


# -- recovery --------------------------------------------------------------------------------
def test_restart_cap_refuses_with_the_leak_warning(clean, tiny_root):
    with _open(tiny_root, max_restarts=1) as pipe:
        os.kill(pipe.worker_pids()["vision"], signal.SIGKILL)
        with pytest.raises(WorkerFailed):
            pipe.run_vision()
        pipe.restart()
        os.kill(pipe.worker_pids()["vision"], signal.SIGKILL)
        with pytest.raises(WorkerFailed):
            pipe.run_vision()
        with pytest.raises(RuntimeBackendError, match=r"restart refused: 1 restarts in the last "
                           r"600 s \(max_restarts 1\); each crashed cycle may leave DSP sessions"
                           r" behind.*reboot"):
            pipe.restart()


def test_load_failure_after_a_crash_mentions_leaked_sessions(clean, inject, tiny_root):
    with _open(tiny_root) as pipe:
        os.kill(pipe.worker_pids()["action"], signal.SIGKILL)
        with pytest.raises(WorkerFailed):
            _chunk(pipe)
        inject("action_context", "fail_load")
        with pytest.raises(WorkerFailed) as err:
            pipe.restart()
        text = str(err.value)
        assert "session action_context did not load" in text
        assert "the DSP may still hold its leaked sessions" in text and "reboot" in text


def test_sequential_load_order_is_largest_first_one_at_a_time(clean, tiny_root, events):
    with _open(tiny_root, load_order="sequential") as pipe:
        stats = pipe.load_stats()
        sizes = {w.name: w.context_bytes for w in pipe._workers}
    assert all(s["load_s"] > 0 and s["peak_rss_mib"] > 0 for s in stats.values())
    rows = _read_events(events)
    starts = {pid: t for pid, t, text in rows if text.startswith("load_start")}
    ends = {pid: t for pid, t, text in rows if text.startswith("load_end")}
    order = sorted(starts, key=starts.get)
    for earlier, later in zip(order, order[1:]):
        assert max(t for p, t, x in rows if p == earlier and x.startswith("load_end")) <= \
            starts[later], "a worker started loading before the previous one was ready"
    assert len(order) == 6 and set(ends) == set(order)
    expected = sorted(sizes.values(), reverse=True)
    assert [sizes[_worker_of(rows, pid)] for pid in order] == expected


def _worker_of(rows, pid: int) -> str:
    graphs = [x.split()[1] for p, _, x in rows if p == pid and x.startswith("load_start")]
    return "action" if graphs[0].startswith("action") else graphs[0]


def test_pipeline_opened_from_a_short_lived_thread_outlives_it(clean, tiny_root):
    """PDEATHSIG fires when the spawning *thread* ends: workers come from the spawner thread."""
    box = {}
    opener = threading.Thread(target=lambda: box.update(pipe=_open(tiny_root)))
    opener.start()
    opener.join()
    pipe = box["pipe"]
    try:
        time.sleep(0.5)
        assert not any(process_gone(p) for p in pipe.worker_pids().values())
        _chunk(pipe)
    finally:
        pipe.close()


# -- parent death ----------------------------------------------------------------------------
_ORCHESTRATOR = """
import sys, threading, time
from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.runtime.htp_backend import ResidentPipeline
pipe = ResidentPipeline.open(Bundle.open(sys.argv[1]), call_timeout_s=600)
print(" ".join(f"{k}={v}" for k, v in pipe.worker_pids().items()), flush=True)
if sys.argv[2] == "busy":
    threading.Thread(target=pipe.run_vision, daemon=True).start()
sys.stdin.readline()
"""


@pytest.mark.parametrize("state", ["stopped", "busy", "idle"])
def test_workers_die_with_a_sigkilled_parent(control, clean, tiny_root, monkeypatch, state):
    if state == "busy":
        monkeypatch.setenv("FAKE_QAI_HANG", "vision")
    proc = subprocess.Popen(
        [sys.executable, "-c", _ORCHESTRATOR, str(tiny_root / VARIANT), state],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        pids = dict(item.split("=") for item in proc.stdout.readline().split())
        pids = {k: int(v) for k, v in pids.items()}
        assert len(pids) == 6
        if state == "stopped":
            os.kill(pids["llm_split1"], signal.SIGSTOP)
        time.sleep(0.5)  # the busy worker is inside its hung call by now
        proc.kill()
        assert proc.wait(300) == -signal.SIGKILL
        # PDEATHSIG: immediate, also for the stopped worker (no lifeline grace needed)
        assert _wait_gone(pids.values(), 60.0), "workers outlived their orchestrator"
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


# -- library folders -------------------------------------------------------------------------
def _with_libs(tiny_root: Path, tmp_path: Path, version: str) -> Path:
    root = tmp_path / "seed"
    shutil.copytree(tiny_root / VARIANT, root)
    for folder, name in (("qnn_libs", "libQnnHtp.so"), ("dsp_libs", "libQnnHtpV73Skel.so")):
        (root / folder).mkdir()
        (root / folder / name).write_text(f"stand-in QNN library, QAIRT v{version}\n")
    return root


def test_mismatched_dsp_libs_are_refused_with_the_reason(clean, tiny_root, tmp_path):
    root = _with_libs(tiny_root, tmp_path, "2.47.0.250101")
    with pytest.raises(RuntimeBackendError) as err:
        ResidentPipeline.open(Bundle.open(root))
    text = str(err.value)
    assert f"{root / 'dsp_libs' / 'libQnnHtpV73Skel.so'} is QAIRT v2.47.0.250101" in text
    assert "loads its own QNN runtime v2.51.40" in text and "ADSP_LIBRARY_PATH" in text


def test_bundle_library_folders_reach_the_worker_environment(clean, tiny_root, tmp_path,
                                                             events):
    root = _with_libs(tiny_root, tmp_path, "2.51.40.260930230134")
    with ResidentPipeline.open(Bundle.open(root), call_timeout_s=TIMEOUT_S) as pipe:
        pids = set(pipe.worker_pids().values())
        _chunk(pipe)
    configs = [text for pid, _, text in _read_events(events)
               if pid in pids and text.startswith("config ")]
    assert len(configs) == 6
    for text in configs:
        adsp = text.split("ADSP_LIBRARY_PATH=")[1].split(" ")[0]
        ld = text.split("LD_LIBRARY_PATH=")[1]
        assert adsp == str(root / "dsp_libs")
        assert str(root / "qnn_libs") in ld.split(os.pathsep)
    assert "ADSP_LIBRARY_PATH" not in os.environ or os.environ["ADSP_LIBRARY_PATH"] != str(
        root / "dsp_libs")  # restored in this process


# -- loading as the library needs it -----------------------------------------------------------
def test_each_context_is_loaded_once_also_quantized(clean, tiny_root, events):
    """A quantised set is loaded with float I/O straight away: one load per context, no
    destroy between two loads."""
    from molmoact2_ros.bundle.bundle import Suffixes

    suffixes = Suffixes(vision="_w4a16", llm="_w4a16", action="_w4a16")
    with ResidentPipeline.open(Bundle.open(tiny_root / VARIANT), suffixes,
                               call_timeout_s=TIMEOUT_S, stop_timeout_s=TIMEOUT_S) as pipe:
        pids = set(pipe.worker_pids().values())
        stats = pipe.load_stats()
    loads = [text.split()[1] for pid, _, text in _read_events(events)
             if pid in pids and text.startswith("load_start")]
    assert sorted(loads) == sorted(["vision", "llm_split0", "llm_split1", "llm_split2",
                                    "llm_split3", "action_context", "action_step"])
    assert not [t for p, _, t in _read_events(events) if p in pids and t.startswith("destroy")]
    assert stats["vision"]["float_elements"]["vision"] > 0
    assert stats["action"]["float_elements"] == {"action_context": 0,
                                                 "action_step": stats["action"]["float_elements"]
                                                 ["action_step"]}


def test_a_failed_load_leaves_loaded_contexts_alone_without_release_on_exit(
        clean, inject, tiny_root, events):
    inject("action_step", "fail_load")
    with pytest.raises(WorkerFailed, match="action_step"):
        _open(tiny_root)
    rows = _read_events(events)
    action = {pid for pid, _, text in rows if text == "load_end action_context"}
    assert action, rows
    assert not [t for p, _, t in rows if p in action and t.startswith("destroy")]


def test_restart_cap_and_reboot_hint_survive_a_new_pipeline(clean, inject, tiny_root, tmp_path):
    """The record under runtime.state_dir: restarts of an earlier process count against the
    cap, and a load failing after an earlier crash carries the reboot hint."""
    state = tmp_path / "run"
    with _open(tiny_root, max_restarts=1, state_dir=str(state)) as pipe:
        os.kill(pipe.worker_pids()["vision"], signal.SIGKILL)
        with pytest.raises(WorkerFailed):
            pipe.run_vision()
        pipe.restart()
    record = json.loads((state / "htp_runtime_state.json").read_text())
    assert len(record["restarts"]) == 1 and record["crashed"] is False
    with _open(tiny_root, max_restarts=1, state_dir=str(state)) as pipe:  # "the node restarted"
        os.kill(pipe.worker_pids()["vision"], signal.SIGKILL)
        with pytest.raises(WorkerFailed):
            pipe.run_vision()
        with pytest.raises(RuntimeBackendError, match=r"restart refused: 1 restarts"):
            pipe.restart()
    assert json.loads((state / "htp_runtime_state.json").read_text())["crashed"] is True
    inject("vision", "fail_load")
    with pytest.raises(WorkerFailed, match=r"a worker crashed in an earlier run .*reboot may "
                       "be needed"):
        _open(tiny_root, state_dir=str(state))


def test_library_paths_are_set_in_the_workers_only(clean, tiny_root, tmp_path, monkeypatch):
    """The orchestrator's environment is never written while workers spawn (another thread
    may be reading it): the folders reach the workers through their own environment."""
    root = _with_libs(tiny_root, tmp_path, "2.51.40.260930230134")
    written = []
    environ_type = type(os.environ)
    original = environ_type.__setitem__

    def recording(self, key, value):
        written.append(key)
        original(self, key, value)

    monkeypatch.setattr(environ_type, "__setitem__", recording)
    with ResidentPipeline.open(Bundle.open(root), call_timeout_s=TIMEOUT_S) as pipe:
        _chunk(pipe)
    assert not {"LD_LIBRARY_PATH", "ADSP_LIBRARY_PATH"} & set(written), written
