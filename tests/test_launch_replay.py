"""``ros2 launch molmoact2_ros replay.launch.py`` on the tiny bundle, run as a user runs it: a
golden recorded with ``molmoact2 replay --record``, then ``ros2 bag play --clock`` through the
policy node and the checker node; the launch exits with the checker's status, 0 on a pass and
non-zero on a golden that does not match (skipped without ROS and ``ros2 bag``).

Run from a colcon install: ``source install/setup.bash && pytest src/molmoact2_ros/tests``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from launch_helpers import ros2_command

pytest.importorskip("rclpy")
pytest.importorskip("molmoact2_ros.msg", reason="build with colcon and source install/setup.bash")
pytest.importorskip("rosbags")
if shutil.which("ros2") is None:
    pytest.skip("no ros2 command on PATH", allow_module_level=True)
if subprocess.run(ros2_command("bag", "--help"), capture_output=True,
                  timeout=60).returncode != 0:
    pytest.skip("ros2 bag is not installed", allow_module_level=True)

VARIANT = "lp_vtp_sd"


def _bags(root: Path, work: Path) -> tuple[Path, Path, Path]:
    """An observation bag of 4 frames, its golden chunk bag (ONNX, seed 7), and a golden made
    from the same frames with the cameras swapped (which the bag must not match)."""
    from molmoact2_ros.bundle.golden import load_npz
    from molmoact2_ros.cli.app import main
    from molmoact2_ros.control.params import Settings
    from molmoact2_ros.replay.replay import write_observation_bag

    tr = load_npz(root / VARIANT / "golden" / "e2e_trace.npz")
    for name, cams in (("obs", ("image_primary", "image_wrist")),
                       ("obs_swapped", ("image_wrist", "image_primary"))):
        frames = [(10**9 + i * 10**9, tr[cams[0]], tr[cams[1]],
                   np.asarray(tr["state"], np.float32) + np.float32(0.01 * i)) for i in range(4)]
        write_observation_bag(work / name, frames, Settings(), mcap=False)
        golden = "golden" if name == "obs" else "golden_swapped"
        assert main(["replay", str(work / name), "--bundle-root", str(root), "--variant",
                     VARIANT, "--instruction", str(tr["instruction"]), "--seed", "7",
                     "--record", str(work / golden), "--no-progress"]) == 0
    return work / "obs", work / "golden", work / "golden_swapped"


def _launch(bag: Path, golden: Path, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ros2_command("launch", "molmoact2_ros", "replay.launch.py", f"bag:={bag}",
                     f"golden:={golden}", f"bundle_root:={root}", "backend:=onnx", "rate:=0.5",
                     "idle_timeout_s:=20.0"),
        capture_output=True, text=True, timeout=400, env=dict(os.environ))


def test_replay_launch_exits_with_the_checker_status(tiny_root):
    work = Path(tempfile.mkdtemp(prefix="molmoact2-replay-launch-"))
    try:
        bag, golden, swapped = _bags(Path(tiny_root), work)
        run = _launch(bag, golden, Path(tiny_root))
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:]
        assert "PASS (cosine" in out and "0 failed" in out, out[-3000:]
        run = _launch(bag, swapped, Path(tiny_root))
        out = run.stdout + run.stderr
        assert run.returncode != 0, out[-3000:]
        assert "FAIL" in out, out[-3000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
