"""Rosbag2 replay without ROS: bag messages → the same synchroniser and controller as the
node, one inference per synchronised observation, outputs compared with golden chunks or
written to a bag. Reads and writes real rosbag2 files (sqlite3 or mcap) through ``rosbags``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..control.controller import (
    Controller,
    PolicyFactory,
    Published,
    chunk_message_fields,
    load_policy,
)
from ..control.params import Settings
from ..control.sync import observation_stamp_ns, observation_sync
from ..control.topics import input_topics, input_types
from ..errors import BagError, MolmoActError
from ..host.image_header import check_image_side
from ..host.images import decode_compressed, decode_image
from ..host.state import state_from_joint_state
from ..util.outputs import begin_bag, seal_bag
from .bagio import (
    ACTION_CHUNK_TYPE,
    BAG_VERSIONS,
    COMPRESSED_TYPE,
    IMAGE_TYPE,
    JOINT_STATE_TYPE,
    BagTopics,
    check_bag,
    open_bag,
    rosbags_modules,
    typestore,
)
from .chunkbag import ChunkBagWriter, to_message


def _stamp_ns(msg) -> int:
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def _image(msg, max_side_px: int) -> np.ndarray:
    """Decode like the node: frames larger than ``max_image_side_px`` refused from the header."""
    if hasattr(msg, "format"):
        return decode_compressed(msg.format, bytes(msg.data), max_side_px=max_side_px)
    check_image_side(msg.width, msg.height, max_side_px, "Image")
    return decode_image(msg.encoding, msg.height, msg.width, msg.step, msg.data,
                        max_side_px=max_side_px)


class _FirstMessages(logging.Handler):
    """Keeps the controller's last warning so a drop reason can be shown with its message."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


@dataclass
class ReplayResult:
    """What a replay produced and dropped (with the first message of each drop reason)."""

    published: list[Published] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    synced: int = 0
    messages: int = 0
    interrupted: bool = False
    #: every synchronised state as read (before state.* conventions), for the report
    states: list = field(default_factory=list)


def replay(
    bag: Path,
    settings: Settings,
    *,
    policy_factory: PolicyFactory = load_policy,
    on_published: Callable[[Published, int], None] | None = None,
    on_active: Callable[[Controller, BagTopics], None] | None = None,
    on_message: Callable[[], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    namespace: str = "",
) -> ReplayResult:
    """Replay a bag through the node logic with the bag's clock (like ``use_sim_time``).

    The bag is checked (topics, types, readable to the end) before the policy loads;
    ``on_active`` runs once the policy is ready (create outputs there), ``should_stop`` is
    polled after every message (SIGINT/SIGTERM end the run cleanly).
    """
    topics = input_topics(settings, namespace)
    bag_topics = check_bag(bag, topics, input_types(settings))
    result = ReplayResult()
    now = {"ns": 0}
    controller = Controller(settings, publish=result.published.append,
                            policy_factory=policy_factory, clock_ns=lambda: now["ns"])
    pending: list = []
    sync = observation_sync(settings["sync.slop_s"], settings["sync.queue_size"], pending.append)
    controller.attach_sync(sync)
    wanted = {t: i for i, t in enumerate(topics)}
    handler = _FirstMessages()
    logger = logging.getLogger("molmoact2_ros.control.controller")
    logger.addHandler(handler)
    try:
        controller.configure()
        controller.activate(worker=False)
        if on_active is not None:
            on_active(controller, bag_topics)
        with open_bag(bag) as reader:
            conns = [c for c in reader.connections if c.topic in wanted]
            for conn, log_ns, raw in reader.messages(connections=conns):
                now["ns"] = log_ns
                msg = reader.deserialize(raw, conn.msgtype)
                result.messages += 1
                controller.offer(sync, wanted[conn.topic], _stamp_ns(msg), msg)
                while pending:
                    _feed(controller, settings, pending.pop(0), result)
                    result.synced += 1
                    before, drops = len(result.published), dict(controller.drops)
                    handler.last = ""
                    controller.process_pending()
                    for key in controller.drops:
                        if key not in drops and key not in result.reasons:
                            result.reasons[key] = handler.last or key
                    if on_published and len(result.published) > before:
                        on_published(result.published[-1], log_ns)
                if on_message is not None:
                    on_message()
                if should_stop is not None and should_stop():
                    result.interrupted = True
                    break
    finally:
        logger.removeHandler(handler)
        result.drops = dict(controller.drops)
        controller.shutdown()
    return result


def _feed(controller: Controller, settings: Settings, items, result: ReplayResult) -> None:
    try:
        side = settings["max_image_side_px"]
        images = [_image(items[0].msg, side), _image(items[1].msg, side)]
        joint = items[2].msg
        state = state_from_joint_state(list(joint.name), joint.position,
                                       list(settings["state.joint_names"]))
    except MolmoActError as exc:
        result.reasons.setdefault(type(exc).__name__, str(exc))
        controller.on_invalid(type(exc).__name__)
        return
    result.states.append(state)
    controller.on_observation(images, state, observation_stamp_ns(items))


def encode_image(img: np.ndarray, fmt: str) -> bytes:
    """JPEG (quality 95) or PNG bytes of an RGB uint8 image, for compressed test bags."""
    import io

    try:
        from PIL import Image
    except ImportError:
        raise MolmoActError("writing compressed images needs Pillow: pip install pillow") from None
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).save(
        buf, format="JPEG" if fmt == "jpeg" else "PNG", **({"quality": 95} if fmt == "jpeg"
                                                            else {}))
    return buf.getvalue()


def write_observation_bag(
    path: Path,
    frames: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
    settings: Settings,
    *,
    mcap: bool = False,
    wrist_offset_ns: int = 3_000_000,
    compressed: str = "",
    version: int = 8,
    namespace: str = "",
) -> None:
    """A bag of rgb8 (or jpeg/png CompressedImage) images + JointState from
    ``(stamp_ns, primary, wrist, state)`` frames (turns golden traces into replayable bags).
    A fifth item, when present, is the header stamp written instead of ``stamp_ns`` (which
    stays the recording time): a sensor clock glitch."""
    _, rosbag2, _ = rosbags_modules()
    if compressed not in ("", "jpeg", "png"):
        raise BagError(f"compressed format {compressed!r}: choose jpeg or png")
    if version not in BAG_VERSIONS:
        raise BagError(f"bag version {version} cannot be written; choose one of "
                       f"{', '.join(map(str, BAG_VERSIONS))}")
    store = typestore()
    t = store.types
    plugin = rosbag2.StoragePlugin.MCAP if mcap else rosbag2.StoragePlugin.SQLITE3
    names = list(settings["state.joint_names"])
    image_type = COMPRESSED_TYPE if compressed else IMAGE_TYPE
    topics = input_topics(settings.with_changes({"compressed_images": bool(compressed)}),
                          namespace)
    with rosbag2.Writer(Path(path), version=version, storage_plugin=plugin) as writer:
        begin_bag(path)  # the folder exists now: mark it as this package's recording
        kinds = [image_type, image_type, JOINT_STATE_TYPE]
        conns = [writer.add_connection(tp, k, typestore=store) for tp, k in zip(topics, kinds)]

        def header(ns):
            return t["std_msgs/msg/Header"](
                stamp=t["builtin_interfaces/msg/Time"](sec=ns // 10**9, nanosec=ns % 10**9),
                frame_id="camera")

        def image(img, ns):
            if compressed:
                data = np.frombuffer(encode_image(img, compressed), np.uint8)
                return t[COMPRESSED_TYPE](header=header(ns), format=compressed, data=data)
            h, w = img.shape[:2]
            return t[IMAGE_TYPE](header=header(ns), height=h, width=w, encoding="rgb8",
                                 is_bigendian=0, step=w * 3,
                                 data=np.ascontiguousarray(img).reshape(-1))

        for row in frames:
            stamp, primary, wrist, state = row[:4]
            glitch = (row[4] - stamp) if len(row) > 4 else 0  # header stamp - recording time
            for conn, img, ns in ((conns[0], primary, stamp), (conns[1], wrist,
                                                                stamp + wrist_offset_ns)):
                writer.write(conn, ns, store.serialize_cdr(image(img, ns + glitch),
                                                           conn.msgtype))
            js = t[JOINT_STATE_TYPE](
                header=header(stamp + 1_000_000 + glitch), name=names,
                position=np.asarray(state, np.float64), velocity=np.zeros(0), effort=np.zeros(0))
            writer.write(conns[2], stamp + 1_000_000, store.serialize_cdr(js, conns[2].msgtype))
    seal_bag(path)


__all__ = ["ACTION_CHUNK_TYPE", "ChunkBagWriter", "ReplayResult", "chunk_message_fields",
           "replay", "to_message", "typestore", "write_observation_bag"]
