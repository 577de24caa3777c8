"""The resident HTP runtime over the fake qai_appbuilder: parity, failures, recovery, no leaks."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from htp_helpers import Snapshot, ensure_contexts, fake_env, marker_injector, process_gone

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.bundle.golden import component_parity
from molmoact2_ros.errors import ContractError, RuntimeBackendError, WorkerFailed
from molmoact2_ros.runtime.htp_backend import ResidentPipeline

pytest.importorskip("onnxruntime")

TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def control(tiny_root, tmp_path_factory):
    """Fake on PYTHONPATH, stand-in contexts written, a marker folder for failure injection."""
    ensure_contexts(tiny_root)
    folder = tmp_path_factory.mktemp("fake-qai-control")
    with pytest.MonkeyPatch.context() as mp:
        fake_env(mp, folder)
        yield folder


@pytest.fixture(scope="module")
def baseline(control) -> Snapshot:
    """Processes, /dev/shm entries and fds before any pipeline of this module."""
    return Snapshot.take()


@pytest.fixture(scope="module")
def pipeline(control, baseline, tiny_root):
    """One started grid_sampler pipeline shared by the failure tests."""
    pipe = ResidentPipeline.open(Bundle.open(tiny_root / "grid_sampler"), call_timeout_s=TIMEOUT_S,
                                 max_restarts=100)  # the tests below restart it many times
    yield pipe
    pipe.close()


@pytest.fixture
def inject(control):
    """``inject("llm_split1", "hang")`` drops a marker the fake checks on every call."""
    yield from marker_injector(control)


def _chunk(pipe: ResidentPipeline, steps: int = 3) -> np.ndarray:
    pipe.run_vision()
    shape = pipe.input_buffer("action_dim_is_pad").shape[-1]
    return pipe.run_action(np.zeros((1, 10, shape), np.float32), steps)


def _parity_ok(pipe: ResidentPipeline, root: Path) -> None:
    rows = component_parity(root / "grid_sampler" / "golden", pipe.run_component, pipe.contracts,
                            precision="fp16")  # the HTP's fp16 I/O, judged as parity does
    assert rows and all(r.passed for r in rows), [r for r in rows if not r.passed]


def test_parity_cli_all_variants(control, tiny_root, capsys):
    from molmoact2_ros.cli.app import main

    before = Snapshot.take()
    assert main(["parity", str(tiny_root), "--backend", "htp"]) == 0
    out = capsys.readouterr().out
    for name in ("grid_sampler", "lp_vtp_sd", "fused"):
        assert f"== {name} (htp (qai_appbuilder: test fake))" in out
    assert "FAIL" not in out
    assert not Snapshot.take().leaks_since(before)


def test_parity_cli_w4a16_all_variants(control, tiny_root, capsys):
    """The _w4a16 set (ufp16 I/O, loaded in float mode) on every component passes parity."""
    from molmoact2_ros.cli.app import main

    suffixes = [arg for g in ("vision", "llm", "action") for arg in ("--suffix", f"{g}=_w4a16")]
    assert main(["parity", str(tiny_root), "--backend", "htp", *suffixes]) == 0
    out = capsys.readouterr().out
    assert out.count("30/30 rows pass") == 3
    # each section says what it checked: an fp16 run and this one print different headers
    headers = [line for line in out.splitlines() if line.startswith("== ")]
    assert len(headers) == 3 and all(
        "suffixes vision=_w4a16, llm=_w4a16, action=_w4a16, action_context=fp16; precision "
        "vision w4a16, llm_split0..3 w4a16, action_context fp16, action_step w4a16" in h
        for h in headers), headers


def test_arena_views_are_fp16_and_shared(pipeline):
    for name in ("pixel_values", "hidden_states", "attention_bias"):
        assert pipeline.input_buffer(name).dtype == np.float16
    embeds = pipeline.run_vision()
    assert embeds.dtype == np.float16 and embeds.base is not None
    assert pipeline.run_vision() is embeds  # the same arena view every chunk
    x = _chunk(pipeline, 10)
    assert x.dtype == np.float32 and np.isfinite(x).all()
    timings = pipeline.last_timings_ms
    assert set(timings) >= {"vision", "llm_split0", "llm_split3", "action_context", "action_step"}


def test_sigkill_worker_then_restart(pipeline, tiny_root):
    _chunk(pipeline)
    victim = pipeline.worker_pids()["llm_split2"]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerFailed) as err:
        _chunk(pipeline)
    assert err.value.worker == "llm_split2" and err.value.session == "llm_split2"
    assert "SIGKILL" in str(err.value)
    with pytest.raises(WorkerFailed, match="call restart"):
        pipeline.run_vision()
    pipeline.restart()
    assert pipeline.worker_pids()["llm_split2"] != victim
    _parity_ok(pipeline, tiny_root)
    _chunk(pipeline)


def test_segfault_in_action_step(pipeline, inject, tiny_root):
    inject("action_step", "crash")
    with pytest.raises(WorkerFailed) as err:
        _chunk(pipeline)
    assert err.value.worker == "action" and err.value.session == "action_step"
    assert "SIGSEGV" in str(err.value)
    (Path(os.environ["FAKE_QAI_CONTROL_DIR"]) / "action_step.crash").unlink()
    pipeline.restart()
    _parity_ok(pipeline, tiny_root)


def test_hung_worker_hits_the_deadline(pipeline, inject, tiny_root):
    marker = inject("llm_split1", "hang")
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as err:
        _chunk(pipeline)
    assert time.monotonic() - start < TIMEOUT_S + 3
    assert err.value.worker == "llm_split1"
    assert "did not answer" in str(err.value) and "killed" in str(err.value)
    marker.unlink()
    pipeline.restart()
    _chunk(pipeline)


def test_failed_inference_is_an_error(pipeline, inject, tiny_root):
    marker = inject("vision", "fail_inference")
    with pytest.raises(WorkerFailed) as err:
        pipeline.run_vision()
    assert err.value.worker == "vision" and "no outputs" in str(err.value)
    marker.unlink()
    pipeline.restart()
    _parity_ok(pipeline, tiny_root)


def test_failed_load_names_the_worker_and_leaks_nothing(control, inject, tiny_root, pipeline):
    before = Snapshot.take()
    inject("llm_split3", "fail_load")
    with pytest.raises(WorkerFailed) as err:
        ResidentPipeline.open(Bundle.open(tiny_root / "lp_vtp_sd"), call_timeout_s=TIMEOUT_S)
    assert err.value.worker == "llm_split3" and "did not load" in str(err.value)
    assert not Snapshot.take().leaks_since(before)


def test_session_cap_refuses_before_spawning(control, tiny_root):
    before = Snapshot.take()
    with pytest.raises(RuntimeBackendError, match="max_sessions"):
        ResidentPipeline.open(Bundle.open(tiny_root / "grid_sampler"), max_sessions=6)
    assert not Snapshot.take().children - before.children


def test_unknown_option_is_refused(control, tiny_root):
    with pytest.raises(RuntimeBackendError, match="call_timeout_s"):
        ResidentPipeline.open(Bundle.open(tiny_root / "grid_sampler"), call_timeout=1)


def test_contexts_that_do_not_chain_are_refused(control, tiny_root, tmp_path):
    """Fused vision (392 image tokens) with grid_sampler LLM contexts (seq 128)."""
    root = tmp_path / "mixed"
    (root / "host").mkdir(parents=True)
    shutil.copy(tiny_root / "grid_sampler" / "bundle.json", root / "bundle.json")
    shutil.copy(tiny_root / "grid_sampler" / "host" / "conventions.json", root / "host")
    shutil.copytree(tiny_root / "grid_sampler" / "ctx", root / "ctx")
    name = "vision_socid77_archv73.bin"
    shutil.copy(tiny_root / "fused" / "ctx" / name, root / "ctx" / name)
    before = Snapshot.take()
    with pytest.raises(ContractError) as err:
        ResidentPipeline.open(Bundle.open(root))
    assert "vision output image_embeds" in str(err.value) and "llm_split0" in str(err.value)
    assert not Snapshot.take().leaks_since(before)


_ORCHESTRATOR = """
import faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack if it hangs
# what this process inherited from the test run (ignored or blocked signals survive exec),
# then the default a fresh process has: the test is about the orchestrator's cleanup
print("inherited: SIGINT", signal.getsignal(signal.SIGINT), "blocked",
      sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), file=sys.stderr,
      flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.runtime.htp_backend import ResidentPipeline
pipe = ResidentPipeline.open(Bundle.open(sys.argv[1]), install_signal_handlers=True)
print(" ".join(str(p) for p in pipe.worker_pids().values()), flush=True)
time.sleep(600)
"""


def test_no_orphans_when_the_orchestrator_dies(control, tiny_root):
    """SIGKILL (no cleanup possible), SIGTERM (handlers installed), SIGINT (atexit path).

    One orchestrator at a time (three loading 18 workers at once on 2 busy cores is what
    ran out of time), each signalled once its workers are up, and every wait a condition
    with a generous bound: the assertion is that the workers go, not how fast."""
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
        err_path = control / f"orchestrator-{sig.name}.err"
        with open(err_path, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", _ORCHESTRATOR, str(tiny_root / "lp_vtp_sd")],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        try:
            # after they loaded; bounded, so a wedged start shows its stacks instead of hanging
            if not select.select([proc.stdout], [], [], 600)[0]:
                proc.send_signal(signal.SIGUSR1)
                time.sleep(2)
                pytest.fail("orchestrator printed no worker pids within 600 s; its threads:\n"
                            + err_path.read_text()[-6000:])
            workers = [int(p) for p in proc.stdout.readline().split()]
            assert len(workers) == 6, (sig, err_path.read_text())
            proc.send_signal(sig)
            try:
                # an unhandled KeyboardInterrupt re-raises SIGINT after the atexit hooks ran
                status = proc.wait(300)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)  # faulthandler: the stacks of the hang
                time.sleep(2)
                pytest.fail(f"orchestrator still running 300 s after {sig.name}; its threads:\n"
                            + err_path.read_text()[-6000:])
            assert status == -sig, (sig, err_path.read_text())
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not all(process_gone(p) for p in workers):
                time.sleep(0.1)
            assert all(process_gone(p) for p in workers), f"workers outlived {sig!r}"
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


def test_close_releases_everything(control, baseline, pipeline):
    """Last test of the module: closing the shared pipeline returns to the baseline."""
    pids = list(pipeline.worker_pids().values())
    _chunk(pipeline, 2)
    held = pipeline.input_buffer("hidden_states")  # a view the caller still holds after close
    pipeline.close()
    pipeline.close()
    assert all(process_gone(p) for p in pids)
    assert held.shape[-1] > 0
    del held
    with pytest.raises(RuntimeBackendError, match="closed"):
        pipeline.run_vision()
    assert not Snapshot.take().leaks_since(baseline)
