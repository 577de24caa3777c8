"""The node under sim time: a /clock that jumps back (a sim reset, ``ros2 bag play --loop`` or a
second ``ros2 bag play --clock``) reaches the controller through rclpy's jump callback and
resets it; a forward jump is only counted. Skipped where ROS 2 is absent."""

from __future__ import annotations

import threading
import uuid

import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("molmoact2_ros.msg", reason="build with colcon and source install/setup.bash")

from builtin_interfaces.msg import Time  # noqa: E402
from launch_helpers import wait_for  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402

from molmoact2_ros.ros.policy_node import PolicyNode  # noqa: E402


def test_a_clock_jump_back_resets_the_controller_and_reaches_diagnostics():
    rclpy.init()
    executor = SingleThreadedExecutor()
    ns = "c" + uuid.uuid4().hex[:8]
    node = PolicyNode(namespace=ns, parameter_overrides=[Parameter("use_sim_time", value=True)])
    source = rclpy.create_node("sim_clock", namespace=ns)
    clock_pub = source.create_publisher(Clock, "/clock", 10)
    executor.add_node(node)
    executor.add_node(source)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        ctl = node.controller

        def play_until(sec: int) -> bool:
            return wait_for(lambda: (clock_pub.publish(Clock(clock=Time(sec=sec))),
                                      node.get_clock().now().nanoseconds == sec * 10**9)[1])

        assert play_until(1000)
        resets, forward = ctl.counts["clock_resets"], ctl.counts["clock_jumps_forward"]
        assert play_until(1001)  # an ordinary tick: no jump
        assert ctl.counts["clock_resets"] == resets
        assert play_until(10)  # 991 s back: the bag started again
        assert wait_for(lambda: ctl.counts["clock_resets"] == resets + 1)
        values = ctl.diagnostics()["values"]
        assert values["count.clock_resets"] == resets + 1
        assert "back" in values["last_clock_event"] and "991" in values["last_clock_event"]
        assert play_until(5000)  # far ahead: counted, nothing reset
        assert wait_for(lambda: ctl.counts["clock_jumps_forward"] == forward + 1)
        assert ctl.counts["clock_resets"] == resets + 1
    finally:
        executor.shutdown()
        node.release()
        node.destroy_node()
        source.destroy_node()
        rclpy.try_shutdown()
