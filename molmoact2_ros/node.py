"""Deprecated: the ROS nodes moved to ``molmoact2_ros.ros`` (one module per node).

Kept for one release so that ``from molmoact2_ros.node import main`` in existing launchers
keeps working; import from ``molmoact2_ros.ros.policy_node`` (and ``ros.replay_checker``,
``ros.sample_publisher``, ``ros.bench_nodes``) instead. Removed in 0.3.
"""

from __future__ import annotations

import warnings

from .ros.policy_node import PolicyNode, main  # noqa: F401
from .ros.replay_checker import ReplayChecker, replay_checker_main  # noqa: F401
from .ros.sample_publisher import SamplePublisher, sample_publisher_main  # noqa: F401

warnings.warn("molmoact2_ros.node is deprecated: import molmoact2_ros.ros.policy_node "
              "(or ros.replay_checker, ros.sample_publisher) instead", DeprecationWarning,
              stacklevel=2)
