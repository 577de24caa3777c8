"""launch_testing test of ``policy.launch.py``: the node reaches active through the autostart
lifecycle events, answers its lifecycle service and shuts down cleanly (skipped without ROS).

Run from a colcon install: ``source install/setup.bash && pytest src/molmoact2_ros/tests``.
"""

from __future__ import annotations

import unittest
import uuid

import pytest
from launch_helpers import MISSING, policy_launch_description, wait_active

if not MISSING:
    import launch_testing.asserts
    import rclpy
    from lifecycle_msgs.srv import GetState

NAMESPACE = "launch_" + uuid.uuid4().hex[:8]


if MISSING:

    def test_launch_needs_ros():
        pytest.skip(MISSING)

else:

    @pytest.mark.launch_test
    def generate_test_description():
        return policy_launch_description(NAMESPACE)


@unittest.skipIf(MISSING, MISSING)
class TestPolicyLaunch(unittest.TestCase):
    def test_autostart_reaches_active(self, proc_output):
        proc_output.assertWaitFor("configured: variant grid_sampler on onnx", timeout=120)
        rclpy.init()
        node = rclpy.create_node("launch_probe")
        try:
            client = node.create_client(GetState, f"/{NAMESPACE}/molmoact2_policy/get_state")
            self.assertTrue(client.wait_for_service(timeout_sec=30.0))
            self.assertEqual(wait_active(node, client, 30), "active")
        finally:
            node.destroy_node()
            rclpy.shutdown()


if not MISSING:

    @launch_testing.post_shutdown_test()
    class TestPolicyShutdown(unittest.TestCase):
        def test_exit_code(self, proc_info):
            # launch stops the node with SIGINT; the node releases the runtime and exits 0
            launch_testing.asserts.assertExitCodes(proc_info, allowable_exit_codes=[0])
