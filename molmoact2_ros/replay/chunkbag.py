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
from ..util.outputs import begin_bag, seal_bag
from .bagio import ACTION_CHUNK_TYPE, BAG_VERSIONS, open_bag, rosbags_modules, typestore
from .chunk_match import ActionScale

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
                     "execution.blend", "flip_images.primary", "flip_images.wrist")
#: noise values a golden fingerprints: the first ones its seed draws (stamp 0)
FINGERPRINT_VALUES = 16


def noise_fingerprint(seed: int) -> str:
    """A fingerprint of the first noise values ``seed`` draws here (numpy's generator): two
    machines whose fingerprints differ cannot produce the same chunks from the same seed."""
    import hashlib

    from ..host.flow import observation_rng

    first = observation_rng(int(seed), 0).standard_normal(FINGERPRINT_VALUES).astype("<f4")
    return hashlib.sha256(first.tobytes()).hexdigest()[:16]


def noise_stream_problem(golden: dict[str, Any]) -> str:
    """One line when this machine draws other noise for the golden's seed than the golden
    recorded (another numpy generator): the cause of every mismatch that follows."""
    want = golden.get("noise_fingerprint")
    seed = golden.get("seed")
    if not want or not isinstance(seed, int) or seed < 0:
        return ""
    here = noise_fingerprint(seed)
    if here == want:
        return ""
    return (f"noise stream differs from the golden's: seed {seed} draws fingerprint {here} with "
            f"numpy {np.__version__} here, {want} with numpy "
            f"{golden.get('numpy_version', '?')} in the golden; every chunk starts from other "
            "noise, so none can match (use the golden's numpy version)")


def scale_of(norm_action) -> ActionScale:
    """The normalised-units map of a bundle's action statistics (``FeatureStats``)."""
    mask = np.asarray(norm_action.mask, bool)
    q01 = np.asarray(norm_action.q01, np.float64)
    q99 = np.asarray(norm_action.q99, np.float64)
    half = np.maximum((q99 - q01) / 2.0, 1e-6)
    return ActionScale(tuple(float(x) for x in np.where(mask, (q99 + q01) / 2.0, 0.0)),
                       tuple(float(x) for x in np.where(mask, half, 1.0)))


def action_scale(settings: dict[str, Any], variant: str | None = None,
                 bundle_root: Any = None) -> ActionScale | None:
    """The golden's recorded action scale, else the bundle's, else None (action units)."""
    rec = settings.get("action_scale")
    if isinstance(rec, dict) and "offset" in rec and "scale" in rec:
        return ActionScale(tuple(map(float, rec["offset"])), tuple(map(float, rec["scale"])))
    if bundle_root is None:
        return None
    from ..bundle.bundle import Bundle

    try:
        bundle = Bundle.open(bundle_root, variant or settings.get("variant"))
        return scale_of(bundle.norm_stats().action)
    except Exception:  # no readable bundle: compare in action units
        return None


def run_info(settings, *, flow_steps: int, source_bag: str = "",
             scale: ActionScale | None = None) -> dict[str, Any]:
    """The settings a chunk bag records (``flow_steps`` is the effective number) and its
    provenance: package and numpy versions, the noise fingerprint of its seed, the action
    scale its chunks are compared in."""
    import platform

    from .. import __version__

    seed = int(settings["seed"])
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
        "flip_images.primary": settings["flip_images.primary"],
        "flip_images.wrist": settings["flip_images.wrist"],
        "package_version": __version__,
        "numpy_version": np.__version__,
        "noise_fingerprint": noise_fingerprint(seed) if seed >= 0 else "",
        "machine": f"{platform.node()} ({platform.machine()})",
        "source_bag": source_bag,
        **({"action_scale": {"offset": list(scale.offset), "scale": list(scale.scale)}}
           if scale is not None else {}),
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
        begin_bag(self.path)
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
            seal_bag(self.path)


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

    @property
    def provenance(self) -> dict[str, Any]:
        """Where the golden came from: backend, versions, machine, source bag, settings."""
        keys = ("backend", "package_version", "numpy_version", "noise_fingerprint", "machine",
                "source_bag")
        return {"path": str(self.path), **{k: self.settings.get(k, "") for k in keys},
                "settings": dict(self.settings)}


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
            if stamp in golden.chunks:
                raise GoldenError(f"golden bag {path} holds two chunks stamped {stamp} ns; "
                                  "chunks are matched by stamp, so it cannot be a golden: "
                                  "record it again from a bag with one observation per stamp")
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
