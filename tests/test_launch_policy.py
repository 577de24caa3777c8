"""launch_testing test of ``policy.launch.py``: the node reaches active through the autostart
lifecycle events, answers its lifecycle service and shuts down cleanly (skipped without ROS).

Run from a colcon install: ``source install/setup.bash && pytest src/molmoact2_ros/tests``.
"""

from __future__ import annotations

import os
import tempfile
import time
import unittest
import uuid
from pathlib import Path

import pytest

pytest.importorskip("launch_testing")
pytest.importorskip("molmoact2_ros.msg", reason="build with colcon and source install/setup.bash")

import launch_testing.actions  # noqa: E402
import launch_testing.asserts  # noqa: E402
import rclpy  # noqa: E402
from ament_index_python.packages import get_package_share_directory  # noqa: E402
from launch.actions import IncludeLaunchDescription  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402
from lifecycle_msgs.srv import GetState  # noqa: E402

import launch  # noqa: E402

NAMESPACE = "launch_" + uuid.uuid4().hex[:8]


def _tiny_bundle() -> str:
    env = os.environ.get("MOLMOACT2_TINY_BUNDLE")
    if env and Path(env, "grid_sampler", "bundle.json").is_file():
        return env
    from molmoact2_ros.synth import write_tiny_bundles

    out = Path(tempfile.mkdtemp(prefix="molmoact2-launch-"))
    write_tiny_bundles(out)
    return str(out)


@pytest.mark.launch_test
def generate_test_description():
    launch_file = Path(get_package_share_directory("molmoact2_ros"), "launch", "policy.launch.py")
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(launch_file)),
        launch_arguments={
            "namespace": NAMESPACE,
            "bundle_root": _tiny_bundle(),
            "backend": "onnx",
            "instruction": "put the bowl on the plate",
        }.items(),
    )
    return launch.LaunchDescription([include, launch_testing.actions.ReadyToTest()])


class TestPolicyLaunch(unittest.TestCase):
    def test_autostart_reaches_active(self, proc_output):
        proc_output.assertWaitFor("configured: variant grid_sampler on onnx", timeout=120)
        rclpy.init()
        node = rclpy.create_node("launch_probe")
        try:
            client = node.create_client(GetState, f"/{NAMESPACE}/molmoact2_policy/get_state")
            self.assertTrue(client.wait_for_service(timeout_sec=30.0))
            label = ""
            deadline = time.time() + 30
            while label != "active" and time.time() < deadline:
                future = client.call_async(GetState.Request())
                rclpy.spin_until_future_complete(node, future, timeout_sec=5.0)
                label = future.result().current_state.label if future.result() else ""
                time.sleep(0.2)
            self.assertEqual(label, "active")
        finally:
            node.destroy_node()
            rclpy.shutdown()


@launch_testing.post_shutdown_test()
class TestPolicyShutdown(unittest.TestCase):
    def test_exit_code(self, proc_info):
        # launch stops the node with SIGINT; the node releases the runtime and exits 0
        launch_testing.asserts.assertExitCodes(proc_info, allowable_exit_codes=[0])
