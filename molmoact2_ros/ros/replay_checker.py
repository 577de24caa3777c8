"""The checker node of ``replay.launch.py``: chunks from the policy node against a golden."""

from __future__ import annotations

import sys
import time

import numpy as np
import rclpy
import rclpy.node
from rclpy.executors import (
    ExternalShutdownException,
)
from rclpy.qos import QoSProfile, ReliabilityPolicy

from ..bundle.comparison import Limits
from ..errors import MolmoActError
from ..replay.chunk_match import LiveCheck, default_tolerance, format_summary
from ..replay.chunkbag import (
    action_scale,
    noise_stream_problem,
    read_chunk_bag,
    settings_differences,
)


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
        tol = Limits(*(getattr(base, k) if p[k] < 0 else p[k]
                       for k in ("min_cosine", "atol", "rtol", "min_within")))
        self.noise_problem = noise_stream_problem(self.golden.settings)
        self.check = LiveCheck(self.golden.chunks, tol, min_produced=p["min_produced"],
                               idle_timeout_s=p["idle_timeout_s"], timeout_s=p["timeout_s"],
                               start_s=time.monotonic(),
                               scale=action_scale(self.golden.settings))
        self.reason = ""
        from ..msg import ActionChunk

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
        if self.noise_problem:
            print(self.noise_problem)
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
