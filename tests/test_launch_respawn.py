"""launch_testing test of ``policy.launch.py respawn:=true``: a node process killed with SIGKILL
is started again and comes back active by itself (skipped without ROS).

Run from a colcon install: ``source install/setup.bash && pytest src/molmoact2_ros/tests``.
"""

from __future__ import annotations

import os
import signal
import time
import unittest
import uuid
from pathlib import Path

import pytest
from launch_helpers import MISSING, policy_launch_description, wait_active

if not MISSING:
    import rclpy
    from lifecycle_msgs.srv import GetState

NAMESPACE = "respawn_" + uuid.uuid4().hex[:8]


def _node_pids() -> list[int]:
    """PIDs of this test's policy node processes (by executable and namespace)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in cmdline]
        if any(a.endswith("policy_node") for a in args) and f"__ns:=/{NAMESPACE}" in args:
            pids.append(int(entry.name))
    return pids


if MISSING:

    def test_launch_needs_ros():
        pytest.skip(MISSING)

else:

    @pytest.mark.launch_test
    def generate_test_description():
        return policy_launch_description(NAMESPACE, respawn="true", respawn_delay="1.0")


@unittest.skipIf(MISSING, MISSING)
class TestRespawn(unittest.TestCase):
    def test_a_killed_node_comes_back_active(self, proc_output):
        proc_output.assertWaitFor("configured: variant grid_sampler on onnx", timeout=120)
        rclpy.init()
        node = rclpy.create_node("respawn_probe")
        try:
            client = node.create_client(GetState, f"/{NAMESPACE}/molmoact2_policy/get_state")
            self.assertEqual(wait_active(node, client, 60), "active")
            (first,) = _node_pids()
            os.kill(first, signal.SIGKILL)
            deadline = time.time() + 60
            while time.time() < deadline and not [p for p in _node_pids() if p != first]:
                time.sleep(0.2)
            (second,) = [p for p in _node_pids() if p != first]
            node.destroy_client(client)  # a fresh client: the dead server may linger in discovery
            client = node.create_client(GetState, f"/{NAMESPACE}/molmoact2_policy/get_state")
            self.assertEqual(wait_active(node, client, 120), "active")
            self.assertEqual(_node_pids(), [second])
        finally:
            node.destroy_node()
            rclpy.shutdown()
