"""``ros2 launch molmoact2_ros libero.launch.py`` on the tiny bundle, as a user runs it: the sim
node and the policy node (use_sim_time) run two short episodes of one task in lockstep, across
the sim-time reset between them, and the launch exits 0 with both in the ledger (skipped
without ROS or LIBERO).

Run from a colcon install: ``source install/setup.bash && pytest src/molmoact2_ros/tests``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("molmoact2_ros.msg", reason="build with colcon and source install/setup.bash")
pytest.importorskip("libero")
if shutil.which("ros2") is None:
    pytest.skip("no ros2 command on PATH", allow_module_level=True)


def test_libero_launch_runs_two_episodes_across_the_reset_and_exits_0(tiny_root, tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        ["ros2", "launch", "molmoact2_ros", "libero.launch.py", "suite:=libero_spatial",
         "tasks:=0", "episodes:=2", "max_steps:=12", "settle_steps:=5", "video:=none",
         f"bundle_root:={tiny_root}", "backend:=onnx", "time_mode:=lockstep", f"out:={out}"],
        capture_output=True, text=True, timeout=900, env=dict(os.environ))
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-4000:]
    records = [json.loads(ln) for ln in (out / "episodes.jsonl").read_text().splitlines()]
    assert [r["key"] for r in records] == ["libero_spatial/0/0", "libero_spatial/0/1"]
    for r in records:  # output never stalled: each episode got its chunks, none timed out
        assert r["status"] == "ok" and r["steps"] == 12, r
        assert r["chunks"] >= 2 and "chunk_timeout" not in r["drops"], r
        assert r["rows_executed"] == 12, r
    assert Path(out / "summary.json").exists()
    assert "published (LeRobot fine-tune) 98.4%" in text
