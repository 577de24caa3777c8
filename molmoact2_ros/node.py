"""The ROS 2 lifecycle node: the only module that imports rclpy.

It adapts messages, parameters, timers and the lifecycle to ``Controller``; all decisions
(validation, staleness, triggers, swaps, safety) live there, ROS-free.
"""

from __future__ import annotations

import logging
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import rclpy
import rclpy.node
from builtin_interfaces.msg import Duration
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import JumpThreshold
from rclpy.context import Context
from rclpy.duration import Duration as RclDuration
from rclpy.executors import (
    Executor,
    ExternalShutdownException,
    MultiThreadedExecutor,
    SingleThreadedExecutor,
)

# Short lifecycle aliases, as in ros2/demos lifecycle_py: Node is rclpy's LifecycleNode.
from rclpy.lifecycle import Node, State, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from .chunk_io import PolicyFactory, load_policy
from .chunk_match import LiveCheck, Tolerance, default_tolerance, format_summary
from .chunkbag import read_chunk_bag, settings_differences
from .controller import Controller, Published, chunk_message_fields, trajectory_message_fields
from .errors import MolmoActError
from .host.image_header import check_image_side
from .host.images import decode_compressed, decode_image
from .host.state import state_from_joint_state, state_from_pose
from .params import PARAMS, PARAMS_BY_NAME, Settings
from .stamps import CLOCK_JUMP_BACK_S, CLOCK_JUMP_FORWARD_S
from .sync import ApproxTimeSync
from .topics import input_topics, subscription_topics

NODE_NAME = "molmoact2_policy"
TICK_PERIOD_S = 0.01


def _descriptor(spec) -> ParameterDescriptor:
    d = ParameterDescriptor(description=f"{spec.description} [applies: {spec.apply}]")
    if spec.int_range:
        d.integer_range = [IntegerRange(from_value=spec.int_range[0], to_value=spec.int_range[1],
                                        step=1)]
    if spec.float_range:
        d.floating_point_range = [FloatingPointRange(from_value=float(spec.float_range[0]),
                                                     to_value=float(spec.float_range[1]))]
    return d


def _stamp_ns(msg) -> int:
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def _duration(ns: int) -> Duration:
    sec, nanosec = divmod(int(ns), 1_000_000_000)
    return Duration(sec=sec, nanosec=nanosec)


class _RosLogHandler(logging.Handler):
    """Forwards the ROS-free layers' Python logging to the node's ROS logger."""

    def __init__(self, logger) -> None:
        super().__init__()
        self._logger = logger

    def emit(self, record: logging.LogRecord) -> None:
        message = self.format(record)
        if record.levelno >= logging.ERROR:
            self._logger.error(message)
        elif record.levelno >= logging.WARNING:
            self._logger.warn(message)
        else:
            self._logger.info(message)


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
            from .msg import ActionChunk

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
        self._sync = ApproxTimeSync(3, int(s["sync.slop_s"] * 1e9), s["sync.queue_size"],
                                    self._on_synced)
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
        if sync is not None:
            sync.add(stream, _stamp_ns(msg), msg)

    def _on_synced(self, items) -> None:
        try:
            images = [self._to_rgb(items[0].msg), self._to_rgb(items[1].msg)]
            state = self._state(items[2].msg)
        except MolmoActError as exc:
            self.controller.on_invalid(type(exc).__name__)
            self.get_logger().warn(f"observation skipped: {exc}", throttle_duration_sec=2.0)
            return
        self.controller.on_observation(images, state, min(i.stamp_ns for i in items))

    def _to_rgb(self, msg) -> np.ndarray:
        max_side = self.controller.settings["max_image_side_px"]
        if isinstance(msg, CompressedImage):
            return decode_compressed(msg.format, bytes(msg.data), max_side_px=max_side)
        check_image_side(msg.width, msg.height, max_side, "Image")
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
        from .msg import ActionChunk

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
        t = trajectory_message_fields(out)
        traj = JointTrajectory()
        # header stamp: the observation stamp (execution.start=observation) or zero, which
        # joint_trajectory_controller reads as "start when first sampled" (receipt)
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
        changes = {}
        for p in params:
            if p.name in PARAMS_BY_NAME:
                value = p.value
                changes[p.name] = list(value) if isinstance(value, (list, tuple)) or (
                    hasattr(value, "tolist")) else value
        if not changes:
            return SetParametersResult(successful=True)
        # One step under the controller's lock; values equal to the running ones (as the
        # revert after a failed swap sets) are accepted without effect.
        ok, reason, how = self.controller.request(changes)
        if ok:
            if how == "configure":
                self.get_logger().info(f"{sorted(changes)} apply at the next configure")
            elif how == "reload":
                self.get_logger().info(f"reloading sessions in the background for {changes}")
        return SetParametersResult(successful=ok, reason=reason)

    def _swap_done(self, ok: bool, reason: str, settings: Settings) -> None:
        if ok:
            self.get_logger().info(f"now running {settings['variant']}")
            return
        self.get_logger().error(reason)
        # Put the parameters back to what actually runs; equal to the controller's settings,
        # they pass _on_set_parameters without effect (no reload is triggered).
        self.set_parameters([Parameter(p.name, value=settings[p.name]) for p in PARAMS
                             if p.apply == "reload"])

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


class SamplePublisher(rclpy.node.Node):
    """Publishes one recorded observation (a golden trace npz) as two cameras + JointState,
    freshly stamped at ``rate_hz``: a stand-in robot for walkthroughs and smoke tests."""

    def __init__(self) -> None:
        super().__init__("molmoact2_sample_publisher")
        from .golden import load_npz

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


def new_executor(context=None) -> Executor:
    """The executor the node is spun with (``main``, and the bench's node row)."""
    return MultiThreadedExecutor(context=context)


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


class ReplayChecker(rclpy.node.Node):
    """Checker node of ``replay.launch.py``: collects ~/action_chunk during ``ros2 bag play``,
    matches chunks with a golden chunk bag by stamp (``chunk_match.LiveCheck``), prints the
    summary; exit 0 (pass) or 1 (fail)."""

    def __init__(self) -> None:
        super().__init__("molmoact2_replay_checker")
        p = {name: self.declare_parameter(name, default).value for name, default in (
            ("golden", ""), ("chunk_topic", "/molmoact2_policy/action_chunk"),
            ("backend", "onnx"), ("min_cosine", -1.0), ("atol", -1.0), ("rtol", -1.0),
            ("min_within", -1.0), ("min_produced", 0.5), ("idle_timeout_s", 15.0),
            ("timeout_s", 300.0))}
        if not p["golden"]:
            raise MolmoActError("parameter golden is empty: give the chunk bag recorded with "
                                "`molmoact2 replay BAG ... --record GOLDEN`")
        self.golden = read_chunk_bag(p["golden"])
        base = default_tolerance(p["backend"])
        tol = Tolerance(*(getattr(base, k) if p[k] < 0 else p[k]
                          for k in ("min_cosine", "atol", "rtol", "min_within")))
        self.check = LiveCheck(self.golden.chunks, tol, min_produced=p["min_produced"],
                               idle_timeout_s=p["idle_timeout_s"], timeout_s=p["timeout_s"],
                               start_s=time.monotonic())
        self.reason = ""
        from .msg import ActionChunk

        reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(ActionChunk, p["chunk_topic"], self._on_chunk, reliable)
        self.create_timer(0.2, self._on_timer)
        self.get_logger().info(f"checking {p['chunk_topic']} against {p['golden']} "
                               f"({len(self.golden.chunks)} golden chunks)")

    def _on_chunk(self, msg) -> None:
        stamp = int(msg.header.stamp.sec) * 10**9 + int(msg.header.stamp.nanosec)
        actions = [float(a) for a in msg.actions]
        self.check.add(stamp, np.asarray(actions, np.float32).reshape(msg.horizon,
                                                                       msg.action_dim),
                       time.monotonic(), variant=msg.variant, instruction=msg.instruction,
                       flow_steps=int(msg.flow_steps))

    def _on_timer(self) -> None:
        if not self.reason:
            self.reason = self.check.finished(time.monotonic())

    def report(self) -> bool:
        """Print the summary (the same lines as ``molmoact2 replay --golden``); True = pass."""
        differences = settings_differences(self.golden.settings, self.check.fields)
        if differences:
            print("settings differ from the golden's: " + "; ".join(differences))
        summary = self.check.summary()
        print(f"run over: {self.reason or 'interrupted'}")
        print(format_summary(summary, self.golden.action_names))
        sys.stdout.flush()
        return summary.ok


def replay_checker_main(args: list[str] | None = None) -> int:
    """Spin the checker until the run is over; exit status 0 pass, 1 fail, 2 bad golden."""
    rclpy.init(args=args)
    try:
        node = ReplayChecker()
    except MolmoActError as exc:
        print(f"error: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    ok = False
    try:
        while rclpy.ok() and not node.reason:
            rclpy.spin_once(node, timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        ok = node.report()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0 if ok else 1


# -- the node row of ``molmoact2 bench`` (bench_host.bench_node drives both sides) ----------------
def _spin_until(node, context, until: Callable[[], object]) -> None:
    """Spin ``node`` with ``new_executor`` (as ``main`` spins it) in a thread until ``until()``
    returns, then stop the executor."""
    executor = new_executor(context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, name="molmoact2-bench-spin", daemon=True)
    spinner.start()
    try:
        until()
    finally:
        executor.shutdown()
        spinner.join(10.0)


def serve_for_bench(policy_factory: PolicyFactory, parameters: dict[str, Any], namespace: str,
                    until: Callable[[], object]) -> dict[str, Any]:
    """The node side of the bench's node row, in the calling process: a ``PolicyNode`` on
    ``policy_factory`` with ``parameters``, taken through configure and activate, spun as
    ``main`` spins it until ``until()`` returns.

    :return: the controller's counts and drops, once the node is released.
    """
    context = Context()
    rclpy.init(context=context)
    node = None
    try:
        node = PolicyNode(namespace=namespace, context=context, policy_factory=policy_factory,
                          parameter_overrides=[Parameter(k, value=v)
                                               for k, v in parameters.items()])
        if (node.trigger_configure() != TransitionCallbackReturn.SUCCESS
                or node.trigger_activate() != TransitionCallbackReturn.SUCCESS):
            raise MolmoActError("the bench node did not reach active (its log says why)")
        _spin_until(node, context, until)
        return {"counts": dict(node.controller.counts), "drops": dict(node.controller.drops)}
    finally:
        if node is not None:
            node.release()
            node.destroy_node()
        rclpy.try_shutdown(context=context)


class BenchRelay(rclpy.node.Node):
    """The floor of the bench's node row: named and subscribed like ``PolicyNode`` (the same
    topics, QoS and one mutually exclusive callback group, spun by the same executor), it
    publishes a prebuilt ActionChunk and JointTrajectory with an observation's stamp as soon
    as its three messages are in, from the callback: rclpy and DDS with none of the node's
    own work (no decoding, synchroniser, inference thread, controller or message building)."""

    def __init__(self, settings: Settings, namespace: str, context) -> None:
        super().__init__(NODE_NAME, namespace=namespace, context=context)
        from .msg import ActionChunk
        from .variants import get_variant

        reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self._chunk_pub = self.create_publisher(ActionChunk, "~/action_chunk", reliable)
        self._traj_pub = self.create_publisher(JointTrajectory, "~/trajectory", reliable)
        names = list(settings["action_names"])
        horizon = get_variant(settings["variant"]).horizon
        period_ns = int(round(settings["control_period_s"] * 1e9))
        self._chunk = ActionChunk(variant=settings["variant"], action_names=names,
                                  horizon=horizon, action_dim=len(names),
                                  actions=[0.0] * (horizon * len(names)))
        self._traj = JointTrajectory(joint_names=names, points=[
            JointTrajectoryPoint(positions=[0.0] * len(names),
                                 time_from_start=_duration((i + 1) * period_ns))
            for i in range(horizon)])
        self._seen: dict[int, int] = {}
        group = MutuallyExclusiveCallbackGroup()
        topics = subscription_topics(settings)
        for stream, (msg_type, topic) in enumerate(zip((Image, Image, JointState), topics)):
            self.create_subscription(msg_type, topic, lambda m, i=stream: self._on_message(i, m),
                                     qos_profile_sensor_data, callback_group=group)

    def _on_message(self, stream: int, msg) -> None:
        stamp = _stamp_ns(msg)
        seen = self._seen.pop(stamp, 0) | (1 << stream)
        if seen != 0b111:
            self._seen[stamp] = seen
            return
        self._chunk.header.stamp = self._traj.header.stamp = msg.header.stamp
        self._chunk_pub.publish(self._chunk)
        self._traj_pub.publish(self._traj)


def serve_relay_for_bench(settings: Settings, namespace: str,
                          until: Callable[[], object]) -> dict[str, Any]:
    """The floor side of the bench's node row: ``BenchRelay`` spun as ``main`` spins the node
    until ``until()`` returns. :return: no counts (the relay keeps none)."""
    context = Context()
    rclpy.init(context=context)
    node = None
    try:
        node = BenchRelay(settings, namespace, context)
        _spin_until(node, context, until)
        return {"counts": {}, "drops": {}}
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown(context=context)


def _cdr_stamp_ns(data: bytes) -> int:
    """``header.stamp`` of a serialized message that starts with a std_msgs/Header: after the
    4-byte CDR encapsulation (odd id = little endian), int32 sec and uint32 nanosec."""
    sec, nanosec = struct.unpack_from("<iI" if data[1] & 1 else ">iI", data, 4)
    return sec * 1_000_000_000 + nanosec


def drive_for_bench(namespace: str, settings: Settings, frames: list[np.ndarray],
                    state: np.ndarray, *, observations: int, warmup: int, period_s: float,
                    timeout_s: float, ready_timeout_s: float,
                    alive: Callable[[], bool]) -> list[dict[str, Any]]:
    """The driving side of the bench's node row (its own context, in the calling process),
    for a ``PolicyNode`` in ``namespace`` running elsewhere.

    Publishes ``warmup + observations`` observations, one every ``period_s`` and one at a time
    (the next after both outputs of this one or ``timeout_s``): the two rgb8 ``frames`` as
    sensor_msgs/Image, then ``state`` as JointState, all with one fresh stamp, on the node's
    input topics (sensor-data QoS). ``~/action_chunk`` and ``~/trajectory`` are taken
    serialized (no deserialisation in the timed part) and matched by header stamp.

    :return: per measured observation its stamp, ``sent`` (``perf_counter`` just before the
        JointState, the last input, is published), ``chunk`` and ``trajectory`` (arrival, or
        None) and ``valid`` (both decode to a horizon x action_dim chunk and as many points).
    """
    from rclpy.serialization import deserialize_message

    from .msg import ActionChunk

    context = Context()
    rclpy.init(context=context)
    driver = executor = None
    try:
        driver = rclpy.create_node("molmoact2_bench_driver", namespace=namespace,
                                   context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(driver)
        arrived: dict[tuple[str, int], tuple[float, bytes]] = {}

        def receiver(kind: str) -> Callable[[bytes], None]:
            def on_raw(data: bytes) -> None:
                arrived[(kind, _cdr_stamp_ns(data))] = (time.perf_counter(), data)
            return on_raw

        reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        node_ns = "/" + "/".join(p for p in (namespace.strip("/"), NODE_NAME) if p)
        outputs = {"chunk": (ActionChunk, f"{node_ns}/action_chunk"),
                   "trajectory": (JointTrajectory, f"{node_ns}/trajectory")}
        for kind, (msg_type, topic) in outputs.items():
            driver.create_subscription(msg_type, topic, receiver(kind), reliable, raw=True)
        topics = input_topics(settings, namespace)
        pubs = [driver.create_publisher(Image, t, qos_profile_sensor_data) for t in topics[:2]]
        pubs.append(driver.create_publisher(JointState, topics[2], qos_profile_sensor_data))
        images = [Image(height=f.shape[0], width=f.shape[1], encoding="rgb8",
                        step=f.shape[1] * 3, data=f.tobytes()) for f in frames]
        joints = JointState(name=list(settings["state.joint_names"]),
                            position=[float(x) for x in state])

        deadline = time.monotonic() + ready_timeout_s
        while not (all(p.get_subscription_count() > 0 for p in pubs)
                   and all(driver.count_publishers(t) > 0 for _, t in outputs.values())):
            if not alive():
                raise MolmoActError("the bench node process ended before it was active")
            if time.monotonic() > deadline:
                raise MolmoActError(f"the bench node did not subscribe and publish within "
                                    f"{ready_timeout_s:.0f} s")
            executor.spin_once(timeout_sec=0.05)

        measured: list[dict[str, Any]] = []
        start = time.monotonic()
        for i in range(warmup + observations):
            time.sleep(max(0.0, start + i * period_s - time.monotonic()))
            now = driver.get_clock().now()
            stamp, stamp_ns = now.to_msg(), now.nanoseconds
            for msg in (*images, joints):
                msg.header.stamp = stamp
            pubs[0].publish(images[0])
            pubs[1].publish(images[1])
            sent = time.perf_counter()
            pubs[2].publish(joints)
            keys = [(kind, stamp_ns) for kind in outputs]
            while (any(k not in arrived for k in keys)
                   and time.perf_counter() - sent < timeout_s):
                executor.spin_once(timeout_sec=0.1)
            if any(k not in arrived for k in keys) and not alive():
                raise MolmoActError("the bench node process ended during the run")
            got = [arrived.pop(k, None) for k in keys]
            if i < warmup:
                continue
            valid = False
            if all(got):
                chunk = deserialize_message(got[0][1], ActionChunk)
                traj = deserialize_message(got[1][1], JointTrajectory)
                valid = (chunk.horizon * chunk.action_dim == len(chunk.actions) > 0
                         and len(traj.points) == chunk.horizon)
            measured.append({"stamp_ns": stamp_ns, "sent": sent,
                             "chunk": got[0][0] if got[0] else None,
                             "trajectory": got[1][0] if got[1] else None, "valid": valid})
        return measured
    finally:
        if executor is not None:
            executor.shutdown()
        if driver is not None:
            driver.destroy_node()
        rclpy.try_shutdown(context=context)


__all__ = ["BenchRelay", "PolicyNode", "ReplayChecker", "SamplePublisher", "drive_for_bench",
           "main", "new_executor", "replay_checker_main", "sample_publisher_main",
           "serve_for_bench", "serve_relay_for_bench"]
