"""The robot's side of a chunk: rows played by their stamps, a zero command when none is due.

A published chunk's row ``i`` is due at ``start + (i+1)·period`` (``control/execution.py``), so
it is the command of the control step that starts in ``[start + i·period, start + (i+1)·period)``
and ends at its stamp. A chunk is executable from the moment it is available (its ``ready``
time in sim time); rows due before then are skipped, and a newer chunk replaces the rest of an
older one. After a chunk's last row the command is what the node's execution code says
(``Executing.rows_at``): for delta rows (LIBERO's end-effector steps) zero in the integrated
dims and the gripper held; for absolute rows the last row held. Before the first chunk of an
episode it is zero. The executor also keeps the largest step-to-step change of the pose command,
for the ledgers of both loops (``molmoact2 libero`` and the ROS sim node).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..control.chunk_io import Published, delta_mask
from ..control.execution import Executing

ACTION_DIM = 7
#: the pose dims of a command (x y z roll pitch yaw); the gripper's open/close is no jump
POSE_DIMS = 6


@dataclass
class ExecutedRow:
    """One control step's command: which chunk row it was (sequence 0 = none due)."""

    step_start_ns: int
    sequence: int
    row: int
    due_ns: int


@dataclass
class _Pending:
    published: Published
    available_ns: int


@dataclass
class ChunkExecutor:
    """Plays ``Published`` chunks row by row on a sim clock (integer ns)."""

    period_ns: int
    zero: np.ndarray = field(default_factory=lambda: np.zeros(ACTION_DIM, np.float32))
    current: Published | None = None
    pending: list[_Pending] = field(default_factory=list)
    log: list[ExecutedRow] = field(default_factory=list)
    keep_log: bool = True
    rows_executed: int = 0
    rows_skipped: int = 0
    idle_steps: int = 0
    chunks_superseded: int = 0
    #: largest change of the pose dims from one command to the next since the last ``reset``,
    #: in the action's units: the jump a switch of chunks gives the robot
    largest_command_change: float = 0.0
    _next_row: int = 0
    _previous: np.ndarray | None = None

    def accept(self, published: Published, available_ns: int) -> None:
        """A chunk that becomes executable at ``available_ns`` (its ready time)."""
        self.pending.append(_Pending(published, int(available_ns)))

    def reset(self) -> None:
        """Forget every chunk and the last command (a new episode)."""
        self.current = None
        self.pending.clear()
        self._next_row = 0
        self._previous = None
        self.largest_command_change = 0.0

    def _finish_current(self) -> None:
        if self.current is not None:
            left = self.current.actions.shape[0] - self._next_row
            if left > 0:
                self.rows_skipped += left
                self.chunks_superseded += 1

    def command(self, step_start_ns: int) -> np.ndarray:
        """The command for the control step starting at ``step_start_ns``."""
        action = self._command(int(step_start_ns))
        if self._previous is not None:
            change = float(np.max(np.abs(action[:POSE_DIMS] - self._previous[:POSE_DIMS])))
            self.largest_command_change = max(self.largest_command_change, change)
        self._previous = action.copy()
        return action

    def _command(self, t: int) -> np.ndarray:
        while self.pending and self.pending[0].available_ns <= t:
            self._finish_current()
            self.current = self.pending.pop(0).published
            self._next_row = 0
        out = self.current
        if out is not None:
            row = (t - int(out.start_ns)) // self.period_ns
            rows = out.actions.shape[0]
            if 0 <= row < rows:
                self.rows_skipped += max(row - self._next_row, 0)
                self._next_row = row + 1
                self.rows_executed += 1
                if self.keep_log:
                    self.log.append(ExecutedRow(t, out.sequence, int(row),
                                                int(out.start_ns) + (row + 1) * self.period_ns))
                return np.asarray(out.actions[row], np.float32)
            if row >= rows:
                if self._next_row < rows:
                    self.rows_skipped += rows - self._next_row
                    self._next_row = rows
                executing = Executing(np.asarray(out.actions, np.float32), int(out.start_ns),
                                      self.period_ns,
                                      delta=delta_mask(out))
                self.idle_steps += 1
                if self.keep_log:
                    self.log.append(ExecutedRow(t, 0, -1, t + self.period_ns))
                return executing.rows_at(np.array([row]))[0]
        self.idle_steps += 1
        if self.keep_log:
            self.log.append(ExecutedRow(t, 0, -1, t + self.period_ns))
        return self.zero.copy()

    def busy_until_ns(self) -> int:
        """The stamp of the last row of the newest chunk (0 without one)."""
        newest = self.pending[-1].published if self.pending else self.current
        if newest is None:
            return 0
        return int(newest.start_ns) + newest.actions.shape[0] * self.period_ns
