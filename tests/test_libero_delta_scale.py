"""What one delta unit moves LIBERO's arm, measured in the real simulator (physics only, no
rendering), against ``execution.delta_scale``: the scale the JointTrajectory's absolute targets
are integrated with, so a trajectory controller following them moves as the policy's own
controller moved in the data it was trained on."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("libero")

from molmoact2_ros.control.chunk_io import Published, trajectory_targets  # noqa: E402
from molmoact2_ros.control.delta import rotvec_to_matrix  # noqa: E402
from molmoact2_ros.control.params import Settings  # noqa: E402

SUITE, TASK = "libero_spatial", 0
OPEN = -1.0


def _hold(sim, rows):
    """Reset, then play ``rows`` (LIBERO actions); the 8-D state before and after each."""
    first = sim.reset(SUITE, TASK, 0)
    assert first.images == ()  # physics only
    states = [first.state.astype(np.float64)]
    for row in rows:
        states.append(sim.step(row).state.astype(np.float64))
    return np.asarray(states)


def _angle(a, b):
    r = rotvec_to_matrix(b) @ rotvec_to_matrix(a).T
    return float(np.arccos(np.clip((np.trace(r) - 1.0) / 2.0, -1.0, 1.0)))


@pytest.mark.parametrize("dim", [0, 1, 2, 3, 4, 5])
def test_one_unit_moves_the_arm_by_the_default_delta_scale(libero_arm, dim):
    scale_m, scale_rad = Settings()["execution.delta_scale"]
    u, n = 0.3, 20
    row = np.zeros(7)
    row[dim], row[6] = u, OPEN
    s = _hold(libero_arm, [row] * n)
    late = slice(n // 2, n)  # the arm has reached its steady speed
    if dim < 3:
        per_step = np.diff(s[:, dim])[late].mean() / u
        assert per_step == pytest.approx(scale_m, rel=0.2), (dim, per_step)
        # the other axes barely move
        others = [d for d in range(3) if d != dim]
        assert np.abs(s[-1, others] - s[0, others]).max() < 0.25 * abs(s[-1, dim] - s[0, dim])
    else:
        angles = [_angle(s[0, 3:6], x[3:6]) for x in s]
        per_step = np.diff(angles)[late].mean() / u
        assert per_step == pytest.approx(scale_rad, rel=0.25), (dim, per_step)


def test_the_trajectory_of_a_delta_chunk_ends_where_libero_puts_the_arm(libero_arm):
    # a 10-row chunk from rest, the way a new chunk starts after a stop
    rows = np.tile(np.array([0.5, -0.3, 0.2, 0.0, 0.0, 0.0, OPEN], np.float32), (10, 1))
    s = _hold(libero_arm, rows)
    settings = Settings().with_changes({"execution.action_type": "delta"})
    out = Published(None, rows, 1, None, settings, 0, 0, 0, 0, 0, action_type="delta",
                    base_pose=s[0, :6])
    targets = trajectory_targets(out)
    moved = np.linalg.norm(s[-1, :3] - s[0, :3])
    # the last target is where the arm got to, but for the arm's lag from rest (measured: 0.26
    # of the distance moved; at 0.05 m per unit, the controller's goal offset, it is 3.9)
    assert np.linalg.norm(targets[-1, :3] - s[-1, :3]) <= 0.35 * moved
    assert targets[-1, 6] == OPEN
