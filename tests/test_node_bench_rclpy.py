"""The node row of ``molmoact2 bench`` under a real rclpy (skipped where ROS 2 is absent): the
rclpy node on the null pipeline and its floor relay, each in a process of its own, driven
from this one. Structure and causality only, no timing limits.

Run from the colcon install (``source install/setup.bash``), so ``molmoact2_ros.msg`` exists.
"""

from __future__ import annotations

import math

import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("molmoact2_ros.msg", reason="build with colcon and source install/setup.bash")

from molmoact2_ros.bench.host import bench_node, format_host, host_bundle  # noqa: E402
from molmoact2_ros.bench.verdicts import NODE_MS, verdicts  # noqa: E402


def test_stamps_are_read_from_serialized_outputs():
    from builtin_interfaces.msg import Time
    from molmoact2_ros.msg import ActionChunk
    from rclpy.serialization import serialize_message
    from trajectory_msgs.msg import JointTrajectory

    from molmoact2_ros.ros.bench_nodes import _cdr_stamp_ns

    for msg in (ActionChunk(variant="lp_vtp_sd", actions=[1.0] * 70), JointTrajectory()):
        msg.header.stamp = Time(sec=1_700_000_123, nanosec=456_789_012)
        msg.header.frame_id = "base"
        assert _cdr_stamp_ns(serialize_message(msg)) == 1_700_000_123_456_789_012


def test_node_row_gets_both_outputs_of_every_observation(tmp_path):
    folder = host_bundle(tmp_path, "lp_vtp_sd")
    row = bench_node(folder, "lp_vtp_sd", 4)["node"]
    assert "skipped" not in row, row["skipped"]
    # every measured observation came back as an ActionChunk and a JointTrajectory with its
    # stamp, both decoding to a chunk of horizon x action_dim and as many points
    assert (row["observations"], row["received"], row["lost"], row["invalid"]) == (4, 4, 0, 0)
    assert row["drops"] == {} and 4 <= row["published"] <= 4 + row["warmup"]
    for key in ("end_to_end", "predict (null)", "rclpy floor"):
        assert row[key]["n"] == 4 and 0 < row[key]["median"] < math.inf, key
    # predict runs between the last input and the outputs, so each observation's overhead is
    # positive and below its end-to-end time (the medians keep that order)
    assert row["n"] == 4 and 0 < row["median"] < row["end_to_end"]["median"]
    assert row["median"] <= row["p95"] < math.inf
    host = {"preprocess 256x256": {"median": 1.0}, "preprocess 640x480": {"median": 1.0},
            "controller overhead": {"median": 0.1}, "node": row}
    verdict = next(v for v in verdicts(host, []) if v["target"] == "rclpy node overhead (ms)")
    assert verdict["measured"] == row["median"] and verdict["limit"] == f"<= {NODE_MS}"
    assert verdict["verdict"] in ("meets", "misses") and "rclpy floor" in verdict["note"]
    assert "rclpy node overhead" in format_host({"node": row})
