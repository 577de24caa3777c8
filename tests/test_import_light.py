"""``import molmoact2_ros`` needs numpy only: no rclpy, onnxruntime, tokenizers, qai_appbuilder,
OpenCV, numba or Ray (imported only when a command runs with ``--ray``)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("rclpy", "onnxruntime", "onnx", "tokenizers", "qai_appbuilder", "rosbags", "cv2",
         "numba", "libero", "mujoco", "robosuite", "imageio", "matplotlib", "ray")


def test_import_pulls_in_nothing_heavy():
    code = (
        "import sys, molmoact2_ros, molmoact2_ros.policy, molmoact2_ros.control.controller, "
        "molmoact2_ros.bundle.golden, molmoact2_ros.cli.app, molmoact2_ros.replay.replay, "
        "molmoact2_ros.runtime.htp_backend, molmoact2_ros.sim.runner, molmoact2_ros.sim.ledger, "
        "molmoact2_ros.sim.summary, molmoact2_ros.sim.video, molmoact2_ros.sim.evaluation, "
        "molmoact2_ros.cluster.connect, molmoact2_ros.cluster.fanout, "
        "molmoact2_ros.cli.replay_many, molmoact2_ros.bench.scale_out; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
