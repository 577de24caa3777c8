"""Both ends of ``molmoact2 bench``'s node row: the policy node on null sessions, rclpy's
relay floor, and the driver that publishes observations and times the outputs."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import rclpy
import rclpy.node
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.context import Context
from rclpy.executors import (
    SingleThreadedExecutor,
)
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..control.chunk_io import PolicyFactory
from ..control.params import Settings
from ..control.topics import input_topics, subscription_topics
from ..errors import MolmoActError
from .common import NODE_NAME, _duration, _stamp_ns, new_executor
from .policy_node import PolicyNode


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
        from ..bundle.variants import get_variant
        from ..msg import ActionChunk

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

    from ..msg import ActionChunk

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
