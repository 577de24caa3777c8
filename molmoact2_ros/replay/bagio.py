"""Rosbag2 access through ``rosbags``: typestores, checked opening and one-line bag errors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..control.topics import COMPRESSED_TYPE, IMAGE_TYPE, JOINT_STATE_TYPE  # noqa: F401 (re-exported)
from ..errors import BagError, MolmoActError

ACTION_CHUNK_TYPE = "molmoact2_ros/msg/ActionChunk"
#: rosbag2 metadata versions the writer can produce: 8 is read by Humble and Jazzy, 9 is
#: Jazzy's own (Humble rejects its list-form QoS).
BAG_VERSIONS = (8, 9)


def rosbags_modules():
    """``(highlevel, rosbag2, typesys)`` of rosbags, or a one-line error saying how to install."""
    try:
        from rosbags import highlevel, rosbag2, typesys
    except ImportError:
        raise MolmoActError("replay needs rosbags: pip install -e '.[replay]' in the "
                            "source checkout (or pip install 'rosbags>=0.10,<0.12')") from None
    return highlevel, rosbag2, typesys


def action_chunk_definition() -> str:
    """The text of msg/ActionChunk.msg (installed share folder, or the source tree)."""
    candidates = [Path(__file__).resolve().parents[2] / "msg" / "ActionChunk.msg"]
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
    _, _, typesys = rosbags_modules()
    store = typesys.get_typestore(
        typesys.Stores.ROS2_JAZZY if distro == "jazzy" else typesys.Stores.ROS2_HUMBLE
    )
    store.register(typesys.get_types_from_msg(action_chunk_definition(), ACTION_CHUNK_TYPE))
    return store


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) < 200 else text[:197] + "..."


@contextmanager
def open_bag(path: Path, what: str = "bag") -> Iterator:
    """An open ``AnyReader``; a missing path, a folder or file that is not a rosbag2 and a
    truncated or corrupt bag all become one-line ``BagError``s naming the path."""
    highlevel, _, _ = rosbags_modules()
    path = Path(path)
    if not path.exists():
        raise BagError(f"{what} {path} does not exist; give a rosbag2 folder (metadata.yaml + "
                       ".db3/.mcap) or an .mcap file")
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        raise BagError(f"{what} {path} is a folder without metadata.yaml, not a rosbag2; give "
                       "the folder `ros2 bag record` wrote")
    try:
        reader = highlevel.AnyReader([path], default_typestore=typestore())
        reader.open()
    except MolmoActError:
        raise
    except Exception as exc:  # rosbags raises several types for unreadable or truncated bags
        raise BagError(f"{what} {path} cannot be read as a rosbag2 ({_reason(exc)}); is it a "
                       "complete bag?") from None
    try:
        yield reader
    except MolmoActError:
        raise
    except Exception as exc:  # a bag truncated after its index fails while messages are read
        raise BagError(f"{what} {path} is truncated or corrupt ({_reason(exc)})") from None
    finally:
        try:
            reader.close()
        except Exception:  # noqa: S110 - closing a broken bag must not hide the first error
            pass


@dataclass(frozen=True)
class BagTopics:
    """The checked input topics of a bag: message counts and the first message's log time."""

    counts: dict[str, int]
    types: dict[str, str]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def check_bag(path: Path, topics: Sequence[str], types: Sequence[Sequence[str]]) -> BagTopics:
    """Check a bag before anything is written: it opens, holds each topic with one of its
    accepted types and a message, and every message of those topics can be read and
    deserialised (a truncated bag fails here, not half-way through a run)."""
    with open_bag(path) as reader:
        held = {c.topic: c.msgtype for c in reader.connections}
        listing = ", ".join(f"{t} [{k}]" for t, k in sorted(held.items())) or "no topics"
        missing = [t for t in topics if t not in held]
        if missing:
            raise BagError(f"bag {path} has no topic {', '.join(missing)}; it has {listing} "
                           "(set the topics.* parameters, --namespace or compressed_images)")
        for topic, accepted in zip(topics, types):
            if held[topic] not in accepted:
                raise BagError(f"bag {path}: topic {topic} holds {held[topic]}, expected "
                               f"{' or '.join(accepted)}")
        conns = [c for c in reader.connections if c.topic in topics]
        counts = {t: 0 for t in topics}
        for conn, _, raw in reader.messages(connections=conns):
            if counts[conn.topic] == 0:
                reader.deserialize(raw, conn.msgtype)
            counts[conn.topic] += 1
    empty = [t for t, n in counts.items() if n == 0]
    if empty:
        raise BagError(f"bag {path} holds no message on {', '.join(empty)}; nothing to replay")
    return BagTopics(counts, {t: held[t] for t in topics})


def check_output(path: Path, force: bool, what: str = "output bag") -> Path:
    """Refuse an existing output unless ``force``, and even then anything but a bag this
    package recorded (``util/outputs.py``): a symlink, a file, a folder it did not write.
    Writes nothing; call before any work."""
    from ..util.outputs import check_bag

    return check_bag(path, force=force, what=what)


def prepare_output(path: Path, force: bool, what: str = "output bag") -> Path:
    """``check_output``, then remove the old output; call once the input has been checked."""
    from ..util.outputs import remove

    path = check_output(path, force, what)
    remove(path, what=what)
    return path
