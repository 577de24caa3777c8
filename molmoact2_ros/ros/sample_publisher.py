"""A stand-in robot: one recorded observation published as two cameras + JointState."""

from __future__ import annotations

import rclpy
import rclpy.node
from rclpy.executors import (
    ExternalShutdownException,
)
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState

from ..control.params import PARAMS_BY_NAME


class SamplePublisher(rclpy.node.Node):
    """Publishes one recorded observation (a golden trace npz) as two cameras + JointState,
    freshly stamped at ``rate_hz``: a stand-in robot for walkthroughs and smoke tests."""

    def __init__(self) -> None:
        super().__init__("molmoact2_sample_publisher")
        from ..bundle.golden import load_npz

        trace_path = self.declare_parameter("trace", "").value
        self._names = list(self.declare_parameter(
            "joint_names", PARAMS_BY_NAME["state.joint_names"].default).value)
        rate = float(self.declare_parameter("rate_hz", 2.0).value)
        trace = load_npz(trace_path, ["image_primary", "image_wrist", "state"])
        self._images = (trace["image_primary"], trace["image_wrist"])
        self._state = [float(x) for x in trace["state"]]
        self._pubs = [self.create_publisher(Image, t, qos_profile_sensor_data)
                      for t in ("camera/agentview/image", "camera/wrist/image")]
        self._joints = self.create_publisher(JointState, "joint_states", qos_profile_sensor_data)
        self.create_timer(1.0 / rate, self._tick)

    def _tick(self) -> None:
        stamp = self.get_clock().now().to_msg()
        for pub, img in zip(self._pubs, self._images):
            msg = Image(height=img.shape[0], width=img.shape[1], encoding="rgb8",
                        step=img.shape[1] * 3, data=img.tobytes())
            msg.header.stamp = stamp
            pub.publish(msg)
        js = JointState(name=self._names, position=self._state)
        js.header.stamp = stamp
        self._joints.publish(js)


def sample_publisher_main(args: list[str] | None = None) -> int:
    """Entry point of ``ros2 run molmoact2_ros sample_publisher``."""
    rclpy.init(args=args)
    node = SamplePublisher()
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
