"""Robot state → 8 discrete state tokens (host_glue §3.2), and the LIBERO state layout."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bundle.normstats import FeatureStats
from ..errors import ObservationError

NUM_STATE_BINS = 256


def check_state(state, width: int) -> np.ndarray:
    """Return the state as float32 [width], or say what is wrong with it."""
    try:
        arr = np.asarray(state, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ObservationError(
            f"state {state!r:.80} is not a list of numbers; the robot state source is broken"
        ) from None
    if arr.shape[0] != width:
        raise ObservationError(
            f"state has {arr.shape[0]} values but the policy needs {width} "
            "(LIBERO: eef xyz, eef axis-angle, 2 gripper fingers); check state.joint_names"
        )
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ObservationError(
            f"state has NaN/inf at index {bad.tolist()}; the robot state source is broken, "
            "no action is computed from it"
        )
    return arr.astype(np.float32)


def state_bins(
    state: np.ndarray, stats: FeatureStats, num_bins: int = NUM_STATE_BINS
) -> np.ndarray:
    """Normalise, clip and discretise: ``rint((s+1)/2·(bins−1))`` with half-to-even rounding."""
    s = stats.normalize(check_state(state, stats.width))
    s = np.nan_to_num(s, nan=0.0, posinf=1.0, neginf=-1.0)
    s = np.clip(s, -1.0, 1.0)
    bins = np.rint((s + np.float32(1.0)) / np.float32(2.0) * np.float32(num_bins - 1))
    return np.clip(bins, 0, num_bins - 1).astype(np.int64)


def quat_to_axis_angle(quat_xyzw) -> np.ndarray:
    """Quaternion (x, y, z, w) → axis-angle, as LeRobot's LIBERO processor (no hemisphere fix)."""
    try:
        q = np.asarray(quat_xyzw, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ObservationError(f"quaternion {quat_xyzw!r:.80} is not 4 numbers") from None
    if q.shape != (4,):
        raise ObservationError(f"quaternion has {q.size} values; expected 4 (x, y, z, w)")
    if not np.all(np.isfinite(q)):
        raise ObservationError(f"quaternion {q.tolist()} has NaN/inf")
    norm = np.linalg.norm(q)
    if not 0.5 < norm < 1.5:
        raise ObservationError(
            f"quaternion {q.tolist()} has norm {norm:.3f}; expected a unit quaternion"
        )
    q = q / norm
    w = float(np.clip(q[3], -1.0, 1.0))
    den = np.sqrt(1.0 - w * w)
    if den <= 1e-10:
        return np.zeros(3, dtype=np.float32)
    angle = 2.0 * np.arccos(w)
    return (q[:3] / den * angle).astype(np.float32)


def state_from_joint_state(
    names: list[str], positions, wanted: list[str]
) -> np.ndarray:
    """Pick the state vector out of a JointState by name (``state.joint_names`` order).

    Duplicate names and a positions/names length mismatch are refused: which value belongs to
    which joint would be a guess."""
    names = list(names)
    positions = list(positions)
    if len(positions) != len(names):
        raise ObservationError(
            f"JointState has {len(names)} names but {len(positions)} positions; every name "
            "needs exactly one position (fix the publisher)"
        )
    seen: set = set()
    duplicates = sorted({n for n in names if n in seen or seen.add(n)})
    if duplicates:
        raise ObservationError(
            f"JointState names {duplicates} appear more than once; each joint must be "
            "published once (fix the publisher or merge the JointState sources)"
        )
    index = {n: i for i, n in enumerate(names)}
    missing = [n for n in wanted if n not in index]
    if missing:
        raise ObservationError(
            f"JointState lacks {missing} (it has {names[:12]}); set state.joint_names "
            "to the names your robot publishes"
        )
    return check_state([positions[index[n]] for n in wanted], len(wanted))


def state_from_pose(xyz, quat_xyzw, gripper) -> np.ndarray:
    """LIBERO state from an end-effector pose and two gripper finger positions."""
    try:
        xyz = np.asarray(xyz, dtype=np.float64).reshape(-1)
        gripper = np.asarray(gripper, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ObservationError("pose or gripper values are not numbers") from None
    if xyz.shape != (3,) or gripper.shape != (2,):
        raise ObservationError(
            f"pose needs 3 positions and 2 gripper values, got {xyz.size} and {gripper.size}"
        )
    aa = quat_to_axis_angle(quat_xyzw)
    return check_state(np.concatenate([xyz, aa, gripper]), 8)


# -- a real robot's state in the policy's convention -------------------------------------------
#: How the eef quaternion's sign is chosen: as given, or per observation the sign whose
#: axis-angle is nearest the training statistics (LIBERO's runs past pi near home).
HEMISPHERES = ("keep", "nearest_stats")
IDENTITY = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)


def axis_angle_to_quat(aa) -> np.ndarray:
    """Axis-angle → quaternion (x, y, z, w), keeping the hemisphere the angle implies (an
    angle past pi gives w < 0, as the LIBERO state's does)."""
    aa = np.asarray(aa, dtype=np.float64).reshape(3)
    angle = float(np.linalg.norm(aa))
    if angle < 1e-12:
        return np.array([0.0, 0.0, 0.0, 1.0])
    return np.concatenate([aa / angle * np.sin(angle / 2), [np.cos(angle / 2)]])


def quat_mul(a, b) -> np.ndarray:
    """Hamilton product of (x, y, z, w) quaternions: the rotation ``b`` then ``a``."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw,
                     aw * bw - ax * bx - ay * by - az * bz])


def quat_rotate(q, v) -> np.ndarray:
    """``v`` rotated by the unit quaternion ``q`` (x, y, z, w)."""
    p = quat_mul(quat_mul(q, [*v, 0.0]), [-q[0], -q[1], -q[2], q[3]])
    return p[:3]


def other_hemisphere(aa) -> np.ndarray:
    """The axis-angle of the same rotation from the quaternion of the other sign: the angle
    becomes 2 pi minus it about the opposite axis."""
    aa = np.asarray(aa, dtype=np.float64)
    angle = float(np.linalg.norm(aa))
    if angle < 1e-12:
        return aa.copy()
    return -aa / angle * (2 * np.pi - angle)


@dataclass(frozen=True)
class StateConvention:
    """How a robot's 8 state values become the policy's: ``transform`` (x, y, z, qx, qy, qz,
    qw) takes the pose from the frame it is read in to the frame the policy was trained in
    (LIBERO's world); ``hemisphere`` picks the quaternion's sign; ``finger_signs`` multiply the
    two finger values (LIBERO reads +q, -q where a real Franka reports both positive)."""

    transform: tuple[float, ...] = IDENTITY
    hemisphere: str = "keep"
    finger_signs: tuple[float, float] = (1.0, 1.0)

    @classmethod
    def from_settings(cls, settings) -> StateConvention:
        return cls(tuple(float(v) for v in settings["state.frame_transform"]),
                   settings["state.quaternion_hemisphere"],
                   tuple(float(v) for v in settings["state.finger_signs"]))

    @property
    def is_identity(self) -> bool:
        return (tuple(self.transform) == IDENTITY and self.hemisphere == "keep"
                and tuple(self.finger_signs) == (1.0, 1.0))

    def apply(self, state, stats: FeatureStats | None = None) -> np.ndarray:
        """The state in the policy's frame and convention (float32 [8]; the identity
        convention hands the state on untouched)."""
        if self.is_identity:
            return state
        s = check_state(state, 8).astype(np.float64)
        pos, aa = s[:3], s[3:6]
        if tuple(self.transform) != IDENTITY:
            t = np.asarray(self.transform[:3], np.float64)
            q = np.asarray(self.transform[3:], np.float64)
            q = q / np.linalg.norm(q)
            pos = quat_rotate(q, pos) + t
            aa = quat_to_axis_angle(quat_mul(q, axis_angle_to_quat(aa))).astype(np.float64)
        if self.hemisphere == "nearest_stats" and stats is not None:
            aa = nearest_to_stats(aa, stats)
        fingers = s[6:8] * np.asarray(self.finger_signs, np.float64)
        return check_state(np.concatenate([pos, aa, fingers]), 8)


def nearest_to_stats(aa, stats: FeatureStats, dims: slice = slice(3, 6)) -> np.ndarray:
    """Of the two axis-angles of one rotation, the one nearest the middle of the statistics'
    range (in ranges); the given one on a tie."""
    mid = (stats.q01[dims] + stats.q99[dims]) / 2
    half = np.maximum((stats.q99[dims] - stats.q01[dims]) / 2, 1e-6)
    other = other_hemisphere(aa)

    def distance(x):
        return float(np.sum(((x - mid) / half) ** 2))

    return other if distance(other) < distance(aa) else np.asarray(aa, np.float64)
