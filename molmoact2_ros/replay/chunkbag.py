"""Golden chunk bags: every chunk of a run (ActionChunk + JointTrajectory, stamped with its
observation) and, as the first message, the run's settings as JSON on a String topic."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..control.controller import Published, chunk_message_fields, trajectory_message_fields
from ..errors import BagError, GoldenError
from .bagio import ACTION_CHUNK_TYPE, BAG_VERSIONS, open_bag, rosbags_modules, typestore

CHUNK_TOPIC = "/molmoact2_policy/action_chunk"
TRAJECTORY_TOPIC = "/molmoact2_policy/trajectory"
SETTINGS_TOPIC = "/molmoact2_replay/settings"
STRING_TYPE = "std_msgs/msg/String"
TRAJECTORY_TYPE = "trajectory_msgs/msg/JointTrajectory"
FORMAT = "molmoact2_chunks.v1"
#: the settings a golden fixes; a run that differs in one of these is named before comparing
COMPARED_SETTINGS = ("variant", "instruction", "seed", "flow_steps", "context_suffix.vision",
                     "context_suffix.llm", "context_suffix.action",
                     "context_suffix.action_context", "execution.start",
                     "execution.blend")


def run_info(settings, *, flow_steps: int, source_bag: str = "") -> dict[str, Any]:
    """The settings a chunk bag records (``flow_steps`` is the effective number)."""
    from .. import __version__

    return {
        "format": FORMAT,
        "variant": settings["variant"],
        "backend": settings["backend"],
        "instruction": settings["instruction"],
        "seed": int(settings["seed"]),
        "flow_steps": int(flow_steps),
        **{f"context_suffix.{g}": v for g, v in settings.suffixes().items()},
        "compressed_images": bool(settings["compressed_images"]),
        # blending makes a chunk depend on the previous one: a check must use the same
        "execution.start": settings["execution.start"],
        "execution.blend": settings["execution.blend"],
        "package_version": __version__,
        "source_bag": source_bag,
    }


class ChunkBagWriter:
    """Writes chunks into a new rosbag2 (mcap or sqlite3, version 8 or 9); the settings go in
    first. Close it (also on SIGINT/SIGTERM) so the bag's metadata is written."""

    def __init__(self, path: Path, info: dict[str, Any] | None = None, *, mcap: bool = True,
                 version: int = 8) -> None:
        _, rosbag2, _ = rosbags_modules()
        if version not in BAG_VERSIONS:
            raise BagError(f"bag version {version} cannot be written; choose one of "
                           f"{', '.join(map(str, BAG_VERSIONS))}")
        self.store = typestore()
        self.path = Path(path)
        self.count = 0
        plugin = rosbag2.StoragePlugin.MCAP if mcap else rosbag2.StoragePlugin.SQLITE3
        self._writer = rosbag2.Writer(self.path, version=version, storage_plugin=plugin)
        self._writer.open()
        self._info = info
        self._closed = False
        self._chunk = self._writer.add_connection(CHUNK_TOPIC, ACTION_CHUNK_TYPE,
                                                  typestore=self.store)
        self._traj = self._writer.add_connection(TRAJECTORY_TOPIC, TRAJECTORY_TYPE,
                                                 typestore=self.store)
        self._settings = (self._writer.add_connection(SETTINGS_TOPIC, STRING_TYPE,
                                                      typestore=self.store)
                          if info is not None else None)

    def _write_settings(self, log_ns: int) -> None:
        if self._settings is not None:
            msg = self.store.types[STRING_TYPE](data=json.dumps(self._info, sort_keys=True))
            self._writer.write(self._settings, log_ns, self.store.serialize_cdr(msg, STRING_TYPE))
            self._settings = None

    def write(self, out: Published, log_ns: int) -> None:
        self._write_settings(log_ns)
        self._writer.write(self._chunk, log_ns,
                           self.store.serialize_cdr(to_message(self.store, out), ACTION_CHUNK_TYPE))
        self._writer.write(self._traj, log_ns, self.store.serialize_cdr(
            to_trajectory(self.store, out), TRAJECTORY_TYPE))
        self.count += 1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._write_settings(0)
            self._writer.close()


def _time(types, ns: int, kind: str = "builtin_interfaces/msg/Time"):
    sec, nanosec = divmod(int(ns), 10**9)
    return types[kind](sec=sec, nanosec=nanosec)


def to_message(store, out: Published) -> Any:
    """A rosbags ActionChunk from a published chunk (the fields the node publishes)."""
    types = store.types
    f = chunk_message_fields(out)
    header = types["std_msgs/msg/Header"](stamp=_time(types, f.pop("stamp_ns")), frame_id="")
    dur = "builtin_interfaces/msg/Duration"
    period = _time(types, f.pop("period_ns"), dur)
    latency = _time(types, f.pop("inference_latency_ns"), dur)
    start = _time(types, f.pop("start_stamp_ns"))
    return types[ACTION_CHUNK_TYPE](header=header, period=period, inference_latency=latency,
                                    start_stamp=start, **f)


def to_trajectory(store, out: Published) -> Any:
    """The JointTrajectory the node publishes with a chunk (same stamp rules as the node)."""
    types = store.types
    t = trajectory_message_fields(out)
    point = types["trajectory_msgs/msg/JointTrajectoryPoint"]
    empty = np.zeros(0, np.float64)
    points = [point(positions=np.asarray(positions, np.float64), velocities=empty,
                    accelerations=empty, effort=empty,
                    time_from_start=_time(types, tfs_ns, "builtin_interfaces/msg/Duration"))
              for positions, tfs_ns in t["points"]]
    header = types["std_msgs/msg/Header"](stamp=_time(types, t["stamp_ns"]), frame_id="")
    return types[TRAJECTORY_TYPE](header=header, joint_names=t["joint_names"], points=points)


@dataclass
class GoldenChunks:
    """A golden run: its settings and its chunks [horizon, action_dim] by observation stamp."""

    path: Path
    settings: dict[str, Any]
    chunks: dict[int, np.ndarray] = field(default_factory=dict)
    action_names: list[str] = field(default_factory=list)
    period_ns: int = 50_000_000


def read_chunk_bag(path: Path) -> GoldenChunks:
    """Read a chunk bag written by ``--record`` (or recorded from the node's ~/action_chunk)."""
    golden = GoldenChunks(Path(path), {})
    with open_bag(path, "golden bag") as reader:
        conns = [c for c in reader.connections
                 if c.msgtype in (ACTION_CHUNK_TYPE, STRING_TYPE) and
                 (c.msgtype == ACTION_CHUNK_TYPE or c.topic == SETTINGS_TOPIC)]
        if not any(c.msgtype == ACTION_CHUNK_TYPE for c in conns):
            held = ", ".join(sorted(f"{c.topic} [{c.msgtype}]" for c in reader.connections))
            raise GoldenError(f"golden bag {path} holds no {ACTION_CHUNK_TYPE} topic; it has "
                              f"{held or 'no topics'}")
        for conn, _, raw in reader.messages(connections=conns):
            msg = reader.deserialize(raw, conn.msgtype)
            if conn.msgtype == STRING_TYPE:
                try:
                    settings = json.loads(msg.data)
                except ValueError:
                    raise GoldenError(f"golden bag {path}: {SETTINGS_TOPIC} is not JSON") from None
                if not isinstance(settings, dict):
                    kind = type(settings).__name__.replace("dict", "object")
                    raise GoldenError(f"golden bag {path}: {SETTINGS_TOPIC} holds a JSON {kind}; "
                                      "the settings must be an object of name: value (as "
                                      "replay --record writes them)")
                golden.settings = settings
                continue
            stamp = int(msg.header.stamp.sec) * 10**9 + int(msg.header.stamp.nanosec)
            actions = np.asarray(msg.actions, np.float32)
            if actions.size != msg.horizon * msg.action_dim:
                raise GoldenError(f"golden bag {path}: chunk at stamp {stamp} holds "
                                  f"{actions.size} values, not horizon x action_dim = "
                                  f"{msg.horizon} x {msg.action_dim}")
            golden.chunks[stamp] = actions.reshape(msg.horizon, msg.action_dim)
            golden.action_names = list(msg.action_names)
            golden.period_ns = int(msg.period.sec) * 10**9 + int(msg.period.nanosec)
            for key in ("variant", "instruction", "flow_steps"):
                golden.settings.setdefault(key, getattr(msg, key))
    if not golden.chunks:
        raise GoldenError(f"golden bag {path} holds no chunk; record one with "
                          "`molmoact2 replay BAG ... --record GOLDEN`")
    return golden


def settings_differences(golden: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """Human-readable ``name: run value (golden value)`` for every compared setting that
    differs; settings the golden does not record are not compared."""
    out = []
    for key in COMPARED_SETTINGS:
        if key in golden and key in run and golden[key] != run[key]:
            out.append(f"{key} {run[key]!r} (golden {golden[key]!r})")
    return out
