"""``ros2 launch molmoact2_ros libero.launch.py`` on the tiny bundle, as a user runs it: the sim
node and the policy node (use_sim_time) run short episodes of one task, and the launch exits 0
with them in the ledger (skipped without ROS or LIBERO).

- lockstep, two episodes across the sim-time reset between them, with a short chunk timeout:
  every chunk carries the stamp of the observation the sim sent (none paired with the state of
  the step before), none times out, the policy node's ``/diagnostics`` are never worse than OK
  nor report a stalled output, and ``molmoact2 libero`` runs the same chunks and rows;
- latency mode with a fixed ``latency_ms``, realtime mode, and compressed camera images;
- a policy node that never comes up: the sim gives up with one line saying what to do.

Run from a colcon install: ``source install/setup.bash && pytest src/molmoact2_ros/tests``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import ros2_command

pytest.importorskip("rclpy")
pytest.importorskip("molmoact2_ros.msg", reason="build with colcon and source install/setup.bash")
pytest.importorskip("libero")
if shutil.which("ros2") is None:
    pytest.skip("no ros2 command on PATH", allow_module_level=True)

STEPS = 12
#: the lockstep test's steps: two observations an episode (every row of a chunk runs)
LOCKSTEP_STEPS = 20


def _launch(tiny_root, out: Path, *args: str, timeout: float = 900,
            steps: int = STEPS) -> subprocess.CompletedProcess:
    return subprocess.run(
        ros2_command("launch", "molmoact2_ros", "libero.launch.py", "suite:=libero_spatial",
                     "tasks:=0", f"max_steps:={steps}", "settle_steps:=5", "video:=none",
                     "render_size:=64", f"bundle_root:={tiny_root}", "backend:=onnx",
                     f"out:={out}", *args),
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def _records(out: Path) -> list[dict]:
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["run"]["protocol"] == "published"  # the settings line
    return [json.loads(ln) for ln in lines[1:]]


def test_libero_launch_runs_two_episodes_across_the_reset_and_exits_0(tiny_root, tmp_path):
    out = tmp_path / "results"
    # a chunk stamped one step early (images paired with the step before's state) was dropped
    # by the sim, which then waited for its republish: a timeout shorter than that shows it
    run = _launch(tiny_root, out, "episodes:=2", "time_mode:=lockstep", "chunk_timeout_s:=8.0",
                  "republish_s:=2.0", steps=LOCKSTEP_STEPS)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-4000:]
    records = _records(out)
    assert [r["key"] for r in records] == ["libero_spatial/0/0", "libero_spatial/0/1"]
    for r in records:  # output never stalled: each episode got its chunks, none timed out
        assert r["status"] == "ok" and r["steps"] == LOCKSTEP_STEPS, r
        assert "chunk_timeout" not in r["drops"] and "chunk_wrong_stamp" not in r["drops"], r
        assert r["chunks"] >= 2 and r["rows_executed"] == LOCKSTEP_STEPS, r
        assert r["largest_command_change"] > 0.0, r
        # the policy node's own watchdog agrees, from the reset before each episode to its end
        status = r["policy_diagnostics"]
        assert status["statuses"] >= 1 and status["worst"] == "OK", status
        assert status["stalls"] == 0, status
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy_diagnostics"]["worst"] == "OK", summary["policy_diagnostics"]
    assert summary["policy_diagnostics"]["stalls"] == 0
    assert "(LeRobot fine-tune)) 98.4%" in text and "protocol: published" in text
    # the same episodes in-process: the same chunks, rows and zero-command steps
    cli_out = tmp_path / "cli"
    cli = subprocess.run(
        [sys.executable, "-m", "molmoact2_ros.cli", "libero", "--suite", "libero_spatial",
         "--tasks", "0", "--episodes", "2", "--max-steps", str(LOCKSTEP_STEPS),
         "--settle-steps", "5", "--render-size", "64", "--video", "none",
         "--bundle-root", str(tiny_root), "--backend", "onnx", "--out", str(cli_out),
         "--no-progress"],
        capture_output=True, text=True, timeout=900)
    assert cli.returncode == 0, (cli.stdout + cli.stderr)[-4000:]
    fields = ("key", "steps", "chunks", "rows_executed", "rows_skipped", "idle_steps")
    assert [{f: r[f] for f in fields} for r in records] == [
        {f: r[f] for f in fields} for r in _records(cli_out)]


@pytest.mark.parametrize("args", [
    ("time_mode:=latency", "latency_ms:=300"),
    ("time_mode:=realtime",),
    ("time_mode:=lockstep", "compressed_images:=true"),
], ids=["latency_300ms", "realtime", "compressed_images"])
def test_libero_launch_time_modes_and_compressed_images(tiny_root, tmp_path, args):
    out = tmp_path / "results"
    run = _launch(tiny_root, out, "episodes:=1", *args)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    (r,) = _records(out)
    assert r["status"] == "ok" and r["steps"] == STEPS and r["chunks"] >= 1, r
    assert r["policy_diagnostics"]["stalls"] == 0, r["policy_diagnostics"]
    if "time_mode:=latency" in args:  # each chunk ran 300 ms of sim time after its observation
        assert r["time_mode"] == "latency" and r["latency_ms"] == 300.0, r
        assert r["chunk_latency_ms"] == [300.0] * r["chunks"], r
    elif "time_mode:=realtime" in args:
        assert r["time_mode"] == "realtime" and r["rows_executed"] >= 1, r
    else:  # the policy node subscribes to <topic>/compressed only: its chunks prove the path
        assert r["chunks"] >= 2 and "chunk_timeout" not in r["drops"], r
        assert r["rows_executed"] == STEPS, r


def test_libero_launch_without_a_policy_node_times_out_with_its_reason(tiny_root, tmp_path):
    out = tmp_path / "results"
    run = _launch(tiny_root, out, "episodes:=1", "policy:=false", "active_timeout_s:=3.0",
                  timeout=300)
    assert run.returncode != 0
    text = run.stdout + run.stderr
    lines = [ln for ln in text.splitlines() if "error: policy node" in ln]
    assert len(lines) == 1, text[-4000:]
    assert "/molmoact2_policy did not answer within 3.0 s" in lines[0]
    assert "policy.launch.py" in lines[0] and "ROS_DOMAIN_ID" in lines[0]
    ledger = out / "episodes.jsonl"  # at most the run's settings line, no episode
    assert not ledger.exists() or [json.loads(ln) for ln in ledger.read_text().splitlines()
                                   if "key" in json.loads(ln)] == []
