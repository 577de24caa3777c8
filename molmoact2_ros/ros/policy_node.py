"""The ROS 2 lifecycle policy node: the production node of the package.

It adapts messages, parameters, timers and the lifecycle to ``Controller``; all decisions
(validation, staleness, triggers, swaps, safety) live there, ROS-free.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import rclpy
import rclpy.node
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import JumpThreshold
from rclpy.duration import Duration as RclDuration
from rclpy.executors import (
    ExternalShutdownException,
)

# Short lifecycle aliases, as in ros2/demos lifecycle_py: Node is rclpy's LifecycleNode.
from rclpy.lifecycle import Node, State, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..control.chunk_io import PolicyFactory, load_policy
from ..control.controller import (
    Controller,
    Published,
    chunk_message_fields,
    trajectory_message_fields,
)
from ..control.params import PARAMS, PARAMS_BY_NAME, Settings
from ..control.stamps import CLOCK_JUMP_BACK_S, CLOCK_JUMP_FORWARD_S
from ..control.sync import ApproxTimeSync, observation_stamp_ns, observation_sync
from ..control.topics import subscription_topics
from ..errors import MolmoActError
from ..host.image_header import check_image_area
from ..host.images import decode_compressed, decode_image
from ..host.state import state_from_joint_state, state_from_pose
from .common import NODE_NAME, TICK_PERIOD_S, _duration, _RosLogHandler, _stamp_ns, new_executor


def _descriptor(spec) -> ParameterDescriptor:
    d = ParameterDescriptor(description=f"{spec.description} [applies: {spec.apply}]")
    if spec.int_range:
        d.integer_range = [IntegerRange(from_value=spec.int_range[0], to_value=spec.int_range[1],
                                        step=1)]
    if spec.float_range:
        d.floating_point_range = [FloatingPointRange(from_value=float(spec.float_range[0]),
                                                     to_value=float(spec.float_range[1]))]
    return d


class PolicyNode(Node):
    """MolmoAct2 policy as a managed node: two cameras + joint state in, action chunks out."""

    def __init__(self, node_name: str = NODE_NAME, *,
                 policy_factory: PolicyFactory | None = None, **kwargs: Any) -> None:
        """``policy_factory`` (default: the bundle on the selected backend) builds the policy at
        configure and on swaps; the bench passes a null pipeline. Other keywords go to rclpy."""
        self._subs: list = []
        self._timer = None
        self._chunk_pub = None
        self._traj_pub = None
        self._sync: ApproxTimeSync | None = None
        self._reverting = False
        self._tf_buffer = None
        self._tf_listener = None
        self._bridge = None
        super().__init__(node_name, **kwargs)
        for spec in PARAMS:
            self.declare_parameter(spec.name, spec.default, _descriptor(spec))
        self.controller = Controller(
            self._read_settings(),
            publish=self._publish,
            policy_factory=policy_factory or load_policy,
            clock_ns=lambda: self.get_clock().now().nanoseconds,
            on_swap_done=self._swap_done,
        )
        # Sim-time resets and bag loops move the clock back: the controller then resets the
        # synchroniser, the observation slot and the triggers (rclpy calls this after the jump).
        self._jump_handle = self.get_clock().create_jump_callback(
            JumpThreshold(min_forward=RclDuration(seconds=CLOCK_JUMP_FORWARD_S),
                          min_backward=RclDuration(seconds=-CLOCK_JUMP_BACK_S),
                          on_clock_change=True),
            post_callback=lambda jump: self.controller.on_time_jump(jump.delta.nanoseconds))
        self._log_handler = _RosLogHandler(self.get_logger())
        logging.getLogger("molmoact2_ros").addHandler(self._log_handler)
        logging.getLogger("molmoact2_ros").setLevel(logging.INFO)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._sensor_group = MutuallyExclusiveCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()
        self._diagnostics = self._make_diagnostics()
        self._autostart_timer = None
        if self.get_parameter("autostart").value:
            # Once the executor spins: a respawned process cannot rely on the launch file's
            # ChangeState request, which may still find the dead process's service.
            self._autostart_timer = self.create_timer(0.0, self._autostart,
                                                      callback_group=self._timer_group)
        try:
            from cv_bridge import CvBridge

            self._bridge = CvBridge()
        except ImportError:
            self.get_logger().info("cv_bridge not found: decoding images with the core decoder")

    # -- lifecycle ---------------------------------------------------------------------------------
    def _autostart(self) -> None:
        """configure, then activate, once (``autostart``); a failure is logged by the
        transition and leaves the node where it stopped."""
        self.destroy_timer(self._autostart_timer)
        self._autostart_timer = None
        self.get_logger().info("autostart: configuring and activating")
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    def on_configure(self, state: State) -> TransitionCallbackReturn:
        """Validate parameters, load the bundle, start the runtime, warm up.

        :return: SUCCESS → inactive; FAILURE (logged reason) → unconfigured.
        """
        try:
            self.controller.settings = self._read_settings()
            self.controller.configure()
            reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
            from ..msg import ActionChunk

            self._chunk_pub = self.create_lifecycle_publisher(ActionChunk, "~/action_chunk",
                                                              reliable)
            self._traj_pub = self.create_lifecycle_publisher(JointTrajectory, "~/trajectory",
                                                             reliable)
        except Exception as exc:  # rclpy swallows exceptions in transitions: report them
            self.get_logger().error(f"configure failed: {exc}")
            self._safe(self.controller.shutdown_runtime)
            return TransitionCallbackReturn.FAILURE
        s = self.controller.settings
        self.get_logger().info(f"configured: variant {s['variant']} on {s['backend']}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: State) -> TransitionCallbackReturn:
        """Subscribe, synchronise, start the inference worker, enable publishers.

        :return: SUCCESS → active; FAILURE → inactive.
        """
        try:
            self._start_inputs()
            self.controller.activate()
        except Exception as exc:
            self.get_logger().error(f"activate failed: {exc}")
            self._stop_inputs()
            return TransitionCallbackReturn.FAILURE
        # The parent enables the lifecycle publishers; without it they drop every message.
        return super().on_activate(state)

    def on_deactivate(self, state: State) -> TransitionCallbackReturn:
        """Stop inputs and the worker. :return: SUCCESS → inactive."""
        self._stop_inputs()
        self._safe(self.controller.deactivate)
        return super().on_deactivate(state)

    def on_cleanup(self, state: State) -> TransitionCallbackReturn:
        """Release the runtime (workers, NPU memory). :return: SUCCESS → unconfigured."""
        self._safe(self.controller.cleanup)
        self._destroy_publishers()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: State) -> TransitionCallbackReturn:
        """Release everything from any state. :return: SUCCESS → finalized."""
        self.release()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: State) -> TransitionCallbackReturn:
        """Release the runtime after an error. :return: SUCCESS → unconfigured."""
        self._stop_inputs()
        self._safe(self.controller.shutdown_runtime)
        self._destroy_publishers()
        return TransitionCallbackReturn.SUCCESS

    def release(self) -> None:
        """Stop inputs and release the runtime; also used on Ctrl-C / SIGTERM."""
        self._stop_inputs()
        self._safe(self.controller.shutdown)
        self._destroy_publishers()
        logging.getLogger("molmoact2_ros").removeHandler(self._log_handler)

    def _safe(self, fn) -> None:
        try:
            fn()
        except Exception as exc:
            self.get_logger().warn(f"{getattr(fn, '__name__', fn)}: {exc}")

    def _destroy_publishers(self) -> None:
        for pub in (self._chunk_pub, self._traj_pub):
            if pub is not None:
                self.destroy_lifecycle_publisher(pub)
        self._chunk_pub = self._traj_pub = None

    # -- inputs ----------------------------------------------------------------------------------
    def _start_inputs(self) -> None:
        s = self.controller.settings
        self._sync = observation_sync(s["sync.slop_s"], s["sync.queue_size"], self._on_synced)
        self.controller.attach_sync(self._sync)
        image_type = CompressedImage if s["compressed_images"] else Image
        topics = subscription_topics(s)  # the same names replay resolves
        for stream, topic in enumerate(topics[:2]):
            self._subs.append(self.create_subscription(
                image_type, topic, lambda m, i=stream: self._on_message(i, m),
                qos_profile_sensor_data, callback_group=self._sensor_group))
        self._subs.append(self.create_subscription(
            JointState, topics[2], lambda m: self._on_message(2, m),
            qos_profile_sensor_data, callback_group=self._sensor_group))
        if s["state.source"] == "tf":
            from tf2_ros import Buffer, TransformListener

            self._tf_buffer = Buffer()
            self._tf_listener = TransformListener(self._tf_buffer, self)
        self._timer = self.create_timer(TICK_PERIOD_S, self.controller.tick,
                                        callback_group=self._timer_group)

    def _stop_inputs(self) -> None:
        for sub in self._subs:
            self.destroy_subscription(sub)
        self._subs = []
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
        self._sync = None
        self._tf_listener = None

    def _on_message(self, stream: int, msg) -> None:
        sync = self._sync
        if sync is not None:  # future stamps are refused before they reach the synchroniser
            self.controller.offer(sync, stream, _stamp_ns(msg), msg)

    def _on_synced(self, items) -> None:
        try:
            images = [self._to_rgb(items[0].msg), self._to_rgb(items[1].msg)]
            state = self._state(items[2].msg)
        except MolmoActError as exc:
            self.controller.on_invalid(type(exc).__name__)
            self.get_logger().warn(f"observation skipped: {exc}", throttle_duration_sec=2.0)
            return
        self.controller.on_observation(images, state, observation_stamp_ns(items))

    def _to_rgb(self, msg) -> np.ndarray:
        max_side = self.controller.settings["max_image_side_px"]
        if isinstance(msg, CompressedImage):
            return decode_compressed(msg.format, bytes(msg.data), max_side_px=max_side)
        check_image_area(msg.width, msg.height, max_side, "Image")
        if self._bridge is not None and msg.encoding in ("rgb8", "bgr8", "rgba8", "bgra8",
                                                         "mono8"):
            try:
                return np.ascontiguousarray(self._bridge.imgmsg_to_cv2(msg, "rgb8"))
            except Exception as exc:  # cv_bridge errors are untyped; the core decoder says why
                self.get_logger().debug(f"cv_bridge could not convert: {exc}")
        return decode_image(msg.encoding, msg.height, msg.width, msg.step, msg.data,
                            max_side_px=max_side)

    def _state(self, joint_state: JointState) -> np.ndarray:
        s = self.controller.settings
        if s["state.source"] == "joint_state":
            return state_from_joint_state(list(joint_state.name), joint_state.position,
                                          list(s["state.joint_names"]))
        fingers = state_from_joint_state(list(joint_state.name), joint_state.position,
                                         list(s["state.gripper_joint_names"]))
        try:
            tf = self._tf_buffer.lookup_transform(s["state.base_frame"], s["state.ee_frame"],
                                                  rclpy.time.Time())
        except Exception as exc:
            raise MolmoActError(
                f"no transform {s['state.base_frame']} -> {s['state.ee_frame']} ({exc}); "
                "check state.base_frame/state.ee_frame"
            ) from None
        t, q = tf.transform.translation, tf.transform.rotation
        return state_from_pose([t.x, t.y, t.z], [q.x, q.y, q.z, q.w], fingers)

    # -- outputs ---------------------------------------------------------------------------------
    def _publish(self, out: Published) -> None:
        from ..msg import ActionChunk

        f = chunk_message_fields(out)
        msg = ActionChunk()
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(f["stamp_ns"], 1_000_000_000)
        for name in ("sequence", "variant", "context_suffix_vision", "context_suffix_llm",
                     "context_suffix_action", "context_suffix_action_context", "flow_steps",
                     "instruction", "action_names", "horizon", "action_dim"):
            setattr(msg, name, f[name])
        msg.actions = f["actions"].tolist()
        msg.period = _duration(f["period_ns"])
        msg.inference_latency = _duration(f["inference_latency_ns"])
        msg.start_stamp.sec, msg.start_stamp.nanosec = divmod(f["start_stamp_ns"], 1_000_000_000)
        msg.first_future_index = f["first_future_index"]
        msg.action_type, msg.start_mode = f["action_type"], f["start_mode"]
        msg.inpaint_method = f["inpaint_method"]
        msg.inpaint_frozen_rows = f["inpaint_frozen_rows"]
        msg.inpaint_weights = f["inpaint_weights"].tolist()
        t = trajectory_message_fields(out)
        traj = JointTrajectory()
        # header stamp: the observation stamp (observation timing) or zero, which
        # joint_trajectory_controller reads as "start when first sampled" (receipt timing);
        # positions are absolute targets (delta chunks integrated from the observed pose)
        traj.header.stamp.sec, traj.header.stamp.nanosec = divmod(t["stamp_ns"], 1_000_000_000)
        traj.joint_names = t["joint_names"]
        traj.points = [
            JointTrajectoryPoint(positions=positions, time_from_start=_duration(tfs_ns))
            for positions, tfs_ns in t["points"]
        ]
        if self._chunk_pub is not None:
            self._chunk_pub.publish(msg)
        if self._traj_pub is not None:
            self._traj_pub.publish(traj)
        if out.safety.clamped:
            self.get_logger().warn(f"chunk {out.sequence}: {out.safety.describe()}",
                                   throttle_duration_sec=5.0)

    # -- parameters ------------------------------------------------------------------------------
    def _read_settings(self) -> Settings:
        values = {}
        for spec in PARAMS:
            value = self.get_parameter(spec.name).value
            values[spec.name] = list(value) if isinstance(spec.default, list) else value
        return Settings(values)

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        """rclpy's parameter callback (it has no try): never raises, refuses with a reason."""
        try:
            return self._set_parameters(params)
        except Exception as exc:
            reason = f"refused: the check failed ({type(exc).__name__}: {exc})"
            self.get_logger().error(reason)
            return SetParametersResult(successful=False, reason=reason)

    def _set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        changes = {}
        for p in params:
            if p.name in PARAMS_BY_NAME:
                value = p.value
                changes[p.name] = list(value) if isinstance(value, (list, tuple)) or (
                    hasattr(value, "tolist")) else value
        running = self.controller.settings
        if not changes or (self._reverting and all(running[k] == v for k, v in changes.items())):
            return SetParametersResult(successful=True)  # the revert sets what already runs
        # One step under the controller's lock; values equal to the running ones (as the
        # revert after a failed swap sets) are accepted without effect.
        ok, reason, how = self.controller.request(changes)
        if ok:
            if how.endswith("configure"):
                later = sorted(k for k in changes if PARAMS_BY_NAME[k].apply == "configure")
                self.get_logger().info(f"{later} apply at the next configure")
            if how.startswith("reload"):
                self.get_logger().info(f"reloading sessions in the background for {changes}")
        return SetParametersResult(successful=ok, reason=reason)

    def _swap_done(self, ok: bool, reason: str, settings: Settings) -> None:
        if ok:
            self.get_logger().info(f"now running {settings['variant']}")
            return
        self.get_logger().error(reason)
        # Put the parameters back to what actually runs; equal to the controller's settings,
        # they pass _on_set_parameters without effect (no reload is triggered, even with no
        # runtime loaded, where setting a reload value again is a reload).
        self._reverting = True
        try:
            self.set_parameters([Parameter(p.name, value=settings[p.name]) for p in PARAMS
                                 if p.apply == "reload"])
        finally:
            self._reverting = False

    # -- diagnostics -----------------------------------------------------------------------------
    def _make_diagnostics(self):
        try:
            from diagnostic_msgs.msg import DiagnosticStatus
            from diagnostic_updater import Updater
        except ImportError:
            self.get_logger().warn("diagnostic_updater not found: no /diagnostics")
            return None
        levels = {"ok": DiagnosticStatus.OK, "warn": DiagnosticStatus.WARN,
                  "error": DiagnosticStatus.ERROR}
        updater = Updater(self)
        updater.setHardwareID("molmoact2")

        def task(stat):
            d = self.controller.diagnostics()
            stat.summary(levels[d["level"]], d["message"])
            for key, value in d["values"].items():
                stat.add(key, str(value))
            return stat

        updater.add("policy", task)
        return updater


def main(args: list[str] | None = None) -> int:
    """Spin the node with a multi-threaded executor; release the NPU on Ctrl-C / SIGTERM."""
    rclpy.init(args=args)
    node = PolicyNode()
    executor = new_executor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.release()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0
