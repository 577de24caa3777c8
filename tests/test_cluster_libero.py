"""``molmoact2 libero --ray`` on a real local Ray cluster (``ray.init(num_cpus=2)``) and real
LIBERO with the tiny bundle: the same episode records as in-process (timing apart), one
ledger line per episode, and a resume after an interrupt."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from htp_helpers import leftover_threads

ray = pytest.importorskip("ray")
pytest.importorskip("libero")

from ray_helpers import local_ray  # noqa: E402

from molmoact2_ros.cli.app import main  # noqa: E402

#: generous: each actor builds its own env on a busy 2-core machine
WAIT_S = 900.0
RUN = ["libero", "--suite", "libero_spatial", "--tasks", "0,1", "--episodes", "1",
       "--max-steps", "30", "--settle-steps", "5", "--video", "none", "--no-progress"]


@pytest.fixture(scope="module")
def ray_session():
    threads = set(threading.enumerate())
    with local_ray() as session:
        yield session
    deadline = time.monotonic() + 120
    while True:
        extra = leftover_threads(threads)
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not extra, f"Ray left threads {extra}"


def _records(out: Path) -> dict[str, dict]:
    lines = (out / "episodes.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "key" in r]  # after the ledger's header
    assert len({r["key"] for r in records}) == len(records), "an episode recorded twice"
    return {r["key"]: {k: v for k, v in r.items() if k != "timing"} for r in records}


def _interrupt_after_first_record(out: Path) -> threading.Thread:
    """SIGINT to this process (the CLI's handler) once the ledger holds one episode."""
    def watch() -> None:
        ledger = out / "episodes.jsonl"
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if ledger.exists() and ledger.read_text().count('"key"') >= 1:  # past the header
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, name="test-interrupter", daemon=True)
    thread.start()
    return thread


def test_ray_episodes_equal_in_process_and_resume_after_an_interrupt(ray_session, tiny_root,
                                                                      tmp_path, capsys):
    here, there = tmp_path / "here", tmp_path / "ray"
    bundle = ["--bundle-root", str(tiny_root)]
    assert main([*RUN, *bundle, "--out", str(here)]) == 0
    expected = _records(here)
    assert sorted(expected) == ["libero_spatial/0/0", "libero_spatial/1/0"]
    summary_here = json.loads((here / "summary.json").read_text())
    capsys.readouterr()

    # --ray with one actor, interrupted once the first episode is in the ledger
    watcher = _interrupt_after_first_record(there)
    rc = main([*RUN, *bundle, "--out", str(there), "--ray", "--ray-actors", "1"])
    watcher.join(timeout=WAIT_S)
    err = capsys.readouterr().err
    assert rc == 130, err
    first = _records(there)
    assert len(first) == 1 and "run the same command again to resume" in err

    # the same command resumes: only the missing episode runs, now over two actors
    assert main([*RUN, *bundle, "--out", str(there), "--ray"]) == 0
    err = capsys.readouterr().err
    assert "1 in the ledger already, 1 to run" in err
    assert "ray: 1 episodes on 1 actors" in err
    assert _records(there) == expected
    summary_ray = json.loads((there / "summary.json").read_text())
    for key in ("suites", "tasks", "steps", "chunks", "drops", "clipped_steps"):
        if key in summary_here:
            assert summary_ray[key] == summary_here[key], key


def _stop_the_first_actor_running_an_episode(stopped: list) -> threading.Thread:
    """SIGSTOP the first actor process seen running an episode (Ray titles it
    ``ray::_Runner.run``): a hung worker that neither answers nor dies."""
    def watch() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    title = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"_Runner.run" in title:
                    os.kill(int(entry.name), signal.SIGSTOP)
                    stopped.append(int(entry.name))
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, name="test-wedger", daemon=True)
    thread.start()
    return thread


def test_ray_with_a_wedged_episode_finishes_and_reports_it(ray_session, tiny_root, tmp_path,
                                                           capsys):
    stopped: list = []
    watcher = _stop_the_first_actor_running_an_episode(stopped)
    # 10 steps: the honest episode takes ~15 s quiet, far inside the 100 s the wedged one waits
    short = [*RUN[:RUN.index("--max-steps")], "--max-steps", "10",
             *RUN[RUN.index("--max-steps") + 2:]]
    rc = main([*short, "--bundle-root", str(tiny_root), "--out", str(tmp_path), "--ray",
               "--ray-actors", "2", "--ray-retries", "0", "--item-timeout-s", "100"])
    watcher.join(timeout=WAIT_S)
    err = capsys.readouterr().err
    assert stopped, err
    assert rc == 2, err
    records = _records(tmp_path)
    assert len(records) == 1  # the other episode ran to its end
    wedged = ({"libero_spatial/0/0", "libero_spatial/1/0"} - set(records)).pop()
    assert f"{wedged}: not recorded: no result within 100 s (--item-timeout-s)" in err
    assert f"1 of 2 episodes could not be run (first: {wedged}" in err
