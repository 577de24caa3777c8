"""Input topic names, one resolution for the node and replay: compressed suffix, namespace,
leading and repeated slashes."""

from __future__ import annotations

from ..errors import MolmoActError

#: The ROS message types of the inputs, as rosbag2 names them.
IMAGE_TYPE = "sensor_msgs/msg/Image"
COMPRESSED_TYPE = "sensor_msgs/msg/CompressedImage"
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"

COMPRESSED_SUFFIX = "/compressed"


def image_topic(name: str, compressed: bool) -> str:
    """The image topic to subscribe to: ``<name>/compressed`` for CompressedImage (as
    image_transport publishes it) unless the name already ends in it."""
    name = name.rstrip("/")
    if compressed and not name.endswith(COMPRESSED_SUFFIX):
        return name + COMPRESSED_SUFFIX
    return name


def subscription_topics(settings) -> list[str]:
    """Primary image, wrist image, joint states as the node passes them to rclpy (relative
    names stay relative so rclpy applies the node's namespace)."""
    compressed = bool(settings["compressed_images"])
    return [image_topic(settings["topics.image_primary"], compressed),
            image_topic(settings["topics.image_wrist"], compressed),
            settings["topics.joint_states"].rstrip("/")]


def resolve(name: str, namespace: str = "") -> str:
    """A fully qualified topic name, the way rclpy resolves it for a node in ``namespace``:
    absolute names stay, relative ones go below the namespace; repeated slashes collapse."""
    if not name or name.startswith("~"):
        raise MolmoActError(f"topic {name!r} cannot be an input topic; use a name like "
                            "'camera/agentview/image'")
    parts = [p for p in name.split("/") if p]
    if not name.startswith("/"):
        parts = [p for p in namespace.split("/") if p] + parts
    if not parts:
        raise MolmoActError(f"topic {name!r} has no name")
    return "/" + "/".join(parts)


def input_topics(settings, namespace: str = "") -> list[str]:
    """The fully qualified input topics (what ``ros2 bag record`` writes into a bag)."""
    return [resolve(t, namespace) for t in subscription_topics(settings)]


def input_types(settings) -> list[tuple[str, ...]]:
    """Accepted message types per input topic."""
    image = (COMPRESSED_TYPE,) if settings["compressed_images"] else (IMAGE_TYPE,)
    return [image, image, (JOINT_STATE_TYPE,)]
