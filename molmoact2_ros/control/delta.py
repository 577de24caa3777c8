"""Delta rows as the robot takes them: absolute end-effector targets integrated from a pose.

A LIBERO delta row ``[dx, dy, dz, drx, dry, drz, gripper]`` moves the end effector by
``scale_m·(dx, dy, dz)`` and rotates it by the axis-angle ``scale_rad·(drx, dry, drz)`` in the
base frame (left-multiplied, as robosuite's OSC_POSE controller applies it); the gripper is an
absolute command. Poses are ``[x, y, z, rx, ry, rz]`` with an axis-angle orientation (the
8-D LIBERO state's first six values).
"""

from __future__ import annotations

import numpy as np


def rotvec_to_matrix(v: np.ndarray) -> np.ndarray:
    """Rodrigues: the rotation matrix of axis-angle ``v``."""
    v = np.asarray(v, np.float64)
    angle = float(np.linalg.norm(v))
    if angle < 1e-12:
        return np.eye(3)
    k = v / angle
    kx = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + np.sin(angle) * kx + (1.0 - np.cos(angle)) * kx @ kx


def matrix_to_rotvec(r: np.ndarray) -> np.ndarray:
    """The axis-angle vector (angle in [0, π]) of rotation matrix ``r``."""
    r = np.asarray(r, np.float64)
    cos = min(max((np.trace(r) - 1.0) / 2.0, -1.0), 1.0)
    angle = float(np.arccos(cos))
    if angle < 1e-9:
        return np.zeros(3)
    if np.pi - angle < 1e-6:  # near π: the axis from the symmetric part
        b = (r + np.eye(3)) / 2.0
        axis = np.sqrt(np.clip(np.diag(b), 0.0, None))
        i = int(np.argmax(axis))
        axis = b[:, i] / np.sqrt(b[i, i])
        return axis * angle
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    return axis / (2.0 * np.sin(angle)) * angle


def integrate_targets(
    actions: np.ndarray, pose: np.ndarray, delta: np.ndarray, scale_m: float, scale_rad: float
) -> np.ndarray:
    """Absolute targets [H, D] of delta ``actions`` [H, D] from ``pose`` (x, y, z, rx, ry, rz).

    With the LIBERO layout (dims 0-5 integrated, 6 absolute) target i is the pose after rows
    0..i; in any other layout the integrated dims add ``scale_m``·row to the pose value of the
    same index. Dims not marked in ``delta`` pass through.
    """
    actions = np.asarray(actions, np.float64)
    pose = np.asarray(pose, np.float64)
    delta = np.asarray(delta, bool)
    out = actions.copy()
    if actions.shape[1] >= 6 and delta[:6].all():
        position = pose[:3].copy()
        rotation = rotvec_to_matrix(pose[3:6])
        for i, row in enumerate(actions):
            position = position + scale_m * row[:3]
            rotation = rotvec_to_matrix(scale_rad * row[3:6]) @ rotation
            out[i, :3] = position
            out[i, 3:6] = matrix_to_rotvec(rotation)
        rest = delta.copy()
        rest[:6] = False
    else:
        rest = delta
    for d in np.flatnonzero(rest):
        base = pose[d] if d < len(pose) else 0.0
        out[:, d] = base + scale_m * np.cumsum(actions[:, d])
    return out
