"""Robot state → 8 discrete state tokens (host_glue §3.2), and the LIBERO state layout."""

from __future__ import annotations

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
