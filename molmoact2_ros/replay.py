"""Rosbag2 replay without ROS: bag messages → the same synchroniser and controller as the
node, one inference per synchronised observation, outputs compared with golden chunks or
written to a bag. Reads and writes real rosbag2 files (sqlite3 or mcap) through ``rosbags``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .controller import (
    Controller,
    PolicyFactory,
    Published,
    chunk_message_fields,
    load_policy,
)
from .errors import MolmoActError
from .host.images import decode_compressed, decode_image
from .host.state import state_from_joint_state
from .params import Settings
from .sync import ApproxTimeSync

ACTION_CHUNK_TYPE = "molmoact2_ros/msg/ActionChunk"


def _rosbags():
    try:
        from rosbags import highlevel, rosbag2, typesys
    except ImportError:
        raise MolmoActError("replay needs rosbags: pip install 'molmoact2_ros[replay]'") from None
    return highlevel, rosbag2, typesys


def action_chunk_definition() -> str:
    """The text of msg/ActionChunk.msg (installed share folder, or the source tree)."""
    candidates = [Path(__file__).resolve().parents[1] / "msg" / "ActionChunk.msg"]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.insert(0, Path(get_package_share_directory("molmoact2_ros")) / "msg"
                          / "ActionChunk.msg")
    except Exception:  # noqa: S110 - no ROS here: the source tree copy is the one to use
        pass
    for path in candidates:
        if path.is_file():
            return path.read_text()
    raise MolmoActError("msg/ActionChunk.msg not found; run from a source checkout or a ROS "
                        "install of molmoact2_ros")


def typestore(distro: str = "humble"):
    """A rosbags typestore for Humble or Jazzy with ActionChunk registered."""
    _, _, typesys = _rosbags()
    store = typesys.get_typestore(
        typesys.Stores.ROS2_JAZZY if distro == "jazzy" else typesys.Stores.ROS2_HUMBLE
    )
    store.register(typesys.get_types_from_msg(action_chunk_definition(), ACTION_CHUNK_TYPE))
    return store


def _stamp_ns(msg) -> int:
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def _image(msg) -> np.ndarray:
    if hasattr(msg, "format"):
        return decode_compressed(msg.format, bytes(msg.data))
    return decode_image(msg.encoding, msg.height, msg.width, msg.step, msg.data)


@dataclass
class ReplayResult:
    """What a replay produced and dropped."""

    published: list[Published] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    synced: int = 0


def replay(
    bag: Path,
    settings: Settings,
    *,
    policy_factory: PolicyFactory = load_policy,
    on_published: Callable[[Published, int], None] | None = None,
) -> ReplayResult:
    """Replay a bag through the node logic with the bag's clock (like ``use_sim_time``)."""
    highlevel, _, _ = _rosbags()
    topics = [settings["topics.image_primary"], settings["topics.image_wrist"],
              settings["topics.joint_states"]]
    result = ReplayResult()
    now = {"ns": 0}
    controller = Controller(settings, publish=result.published.append,
                            policy_factory=policy_factory, clock_ns=lambda: now["ns"])
    pending: list = []
    sync = ApproxTimeSync(3, int(settings["sync.slop_s"] * 1e9), settings["sync.queue_size"],
                          pending.append)
    controller.configure()
    controller.activate(worker=False)
    try:
        with highlevel.AnyReader([Path(bag)], default_typestore=typestore()) as reader:
            wanted = {"/" + t.lstrip("/"): i for i, t in enumerate(topics)}
            conns = [c for c in reader.connections if c.topic in wanted]
            found = {c.topic for c in conns}
            missing = [t for t in wanted if t not in found]
            if missing:
                raise MolmoActError(f"{bag} has no topic {missing}; it has "
                                    f"{sorted(c.topic for c in reader.connections)}")
            for conn, log_ns, raw in reader.messages(connections=conns):
                now["ns"] = log_ns
                msg = reader.deserialize(raw, conn.msgtype)
                sync.add(wanted[conn.topic], _stamp_ns(msg), msg)
                while pending:
                    _feed(controller, settings, pending.pop(0))
                    result.synced += 1
                    before = len(result.published)
                    controller.process_pending()
                    if on_published and len(result.published) > before:
                        on_published(result.published[-1], log_ns)
    finally:
        result.drops = dict(controller.drops)
        controller.shutdown()
    return result


def _feed(controller: Controller, settings: Settings, items) -> None:
    try:
        images = [_image(items[0].msg), _image(items[1].msg)]
        joint = items[2].msg
        state = state_from_joint_state(list(joint.name), joint.position,
                                       list(settings["state.joint_names"]))
    except MolmoActError as exc:
        controller.on_invalid(type(exc).__name__)
        return
    controller.on_observation(images, state, min(i.stamp_ns for i in items))


class ChunkBagWriter:
    """Writes published chunks as ActionChunk messages into a new rosbag2 (mcap or sqlite3)."""

    def __init__(self, path: Path, topic: str = "/molmoact2_policy/action_chunk",
                 *, mcap: bool = True) -> None:
        _, rosbag2, _ = _rosbags()
        self.store = typestore()
        plugin = rosbag2.StoragePlugin.MCAP if mcap else rosbag2.StoragePlugin.SQLITE3
        # version 8: Humble's rosbag2 reads it (version 9 writes QoS as a list it rejects)
        self._writer = rosbag2.Writer(Path(path), version=8, storage_plugin=plugin)
        self._writer.open()
        self._conn = self._writer.add_connection(topic, ACTION_CHUNK_TYPE, typestore=self.store)

    def write(self, out: Published, log_ns: int) -> None:
        self._writer.write(self._conn, log_ns,
                           self.store.serialize_cdr(to_message(self.store, out), ACTION_CHUNK_TYPE))

    def close(self) -> None:
        self._writer.close()


def to_message(store, out: Published) -> Any:
    """A rosbags ActionChunk from a published chunk (the fields the node publishes)."""
    types = store.types
    f = chunk_message_fields(out)
    time_t, dur_t = types["builtin_interfaces/msg/Time"], types["builtin_interfaces/msg/Duration"]
    sec, nanosec = divmod(f.pop("stamp_ns"), 10**9)
    header = types["std_msgs/msg/Header"](stamp=time_t(sec=sec, nanosec=nanosec), frame_id="")
    period = dur_t(*divmod(f.pop("period_ns"), 10**9))
    latency = dur_t(*divmod(f.pop("inference_latency_ns"), 10**9))
    start = time_t(*divmod(f.pop("start_stamp_ns"), 10**9))
    return types[ACTION_CHUNK_TYPE](header=header, period=period, inference_latency=latency,
                                    start_stamp=start, **f)


def write_observation_bag(
    path: Path,
    frames: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
    settings: Settings,
    *,
    mcap: bool = False,
    wrist_offset_ns: int = 3_000_000,
) -> None:
    """A bag of rgb8 images + JointState from ``(stamp_ns, primary, wrist, state)`` frames
    (used to turn golden traces into replayable bags)."""
    _, rosbag2, _ = _rosbags()
    store = typestore()
    t = store.types
    plugin = rosbag2.StoragePlugin.MCAP if mcap else rosbag2.StoragePlugin.SQLITE3
    names = list(settings["state.joint_names"])
    with rosbag2.Writer(Path(path), version=8, storage_plugin=plugin) as writer:
        topics = [settings["topics.image_primary"], settings["topics.image_wrist"],
                  settings["topics.joint_states"]]
        kinds = ["sensor_msgs/msg/Image", "sensor_msgs/msg/Image", "sensor_msgs/msg/JointState"]
        conns = [writer.add_connection("/" + tp.lstrip("/"), k, typestore=store)
                 for tp, k in zip(topics, kinds)]

        def header(ns):
            return t["std_msgs/msg/Header"](
                stamp=t["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                frame_id="camera")

        for stamp, primary, wrist, state in frames:
            for conn, img, ns in ((conns[0], primary, stamp), (conns[1], wrist,
                                                                stamp + wrist_offset_ns)):
                h, w = img.shape[:2]
                msg = t["sensor_msgs/msg/Image"](header=header(ns), height=h, width=w,
                                                 encoding="rgb8", is_bigendian=0, step=w * 3,
                                                 data=np.ascontiguousarray(img).reshape(-1))
                writer.write(conn, ns, store.serialize_cdr(msg, conn.msgtype))
            js = t["sensor_msgs/msg/JointState"](
                header=header(stamp + 1_000_000), name=names,
                position=np.asarray(state, np.float64), velocity=np.zeros(0), effort=np.zeros(0))
            writer.write(conns[2], stamp + 1_000_000, store.serialize_cdr(js, conns[2].msgtype))
