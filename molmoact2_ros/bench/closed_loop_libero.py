"""The closed-loop bench's third robot: LIBERO's Panda under its OSC_POSE controller.

Each tick the delta row due (chosen as ``DeltaRobot`` chooses it) is the simulator's action;
the arm's measured end-effector pose, relative to where the run started, is what the scene
observes and the target error measures. So blending is judged against the controller the
policy was trained with (its lag and its impedance) instead of an ideal integrator. Physics
only (``LiberoSim(cameras=False)``): the policy sees the bench scene's camera, not LIBERO's.
"""

from __future__ import annotations

import numpy as np

from ..control.delta import matrix_to_rotvec, rotvec_to_matrix
from .closed_loop import DeltaRobot

SUITE, TASK, INIT = "libero_spatial", 0, 0
OPEN = -1.0  # LIBERO's gripper: -1 opens, +1 closes


class LiberoArm(DeltaRobot):
    """Rows go to LIBERO's arm; ``pose`` is the arm's x, y, z and orientation (axis-angle)
    relative to the start of the run, and the commanded gripper."""

    def __init__(self, sim, *, hold_old: bool = False, unit_m: float, seed: int = 0) -> None:
        first = sim.reset(SUITE, TASK, INIT, seed=seed)
        self.sim = sim
        self._origin = first.state[:3].astype(np.float64)
        self._origin_rotation = rotvec_to_matrix(first.state[3:6])
        pose = np.zeros(7)
        pose[6] = OPEN
        super().__init__(pose, hold_old=hold_old, unit_m=unit_m)

    def sample(self, now_ns: int) -> tuple[np.ndarray, bool]:
        """Step the simulator with this tick's row (zero, gripper held, when none is due);
        returns (the commanded step in metres, whether nothing was due)."""
        row = self.row(now_ns)
        action = np.zeros(7)
        action[6] = self.pose[6]
        step = np.zeros_like(self.pose)
        if row is not None:
            action[:] = row
            step[:6] = row[:6] * self.unit_m
        state = self.sim.step(action).state.astype(np.float64)
        self.pose[:3] = state[:3] - self._origin
        self.pose[3:6] = matrix_to_rotvec(rotvec_to_matrix(state[3:6]) @ self._origin_rotation.T)
        self.pose[6] = float(np.clip(action[6], -1.0, 1.0))
        self.step = step
        return step, row is None
