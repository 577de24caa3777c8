"""Helpers every node of the package shares: stamps, durations, logging into ROS, the executor."""

from __future__ import annotations

import logging

from builtin_interfaces.msg import Duration
from rclpy.executors import (
    Executor,
    MultiThreadedExecutor,
)

NODE_NAME = "molmoact2_policy"
TICK_PERIOD_S = 0.01


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


def new_executor(context=None) -> Executor:
    """The executor the node is spun with (``main``, and the bench's node row)."""
    return MultiThreadedExecutor(context=context)
