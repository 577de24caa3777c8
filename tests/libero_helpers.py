"""Test policies for the LIBERO loop: a scripted one (fixed chunks, in order) that records what
reaches it, standing in for a model on the policy seam (``control.chunk_io.PolicyLike``)."""

from __future__ import annotations

import numpy as np

from molmoact2_ros.errors import PromptError
from molmoact2_ros.policy import ActionChunk

HORIZON = 10


def rows(action, n: int = HORIZON) -> np.ndarray:
    return np.tile(np.asarray(action, np.float32), (n, 1))


#: +x, then +z, then close the gripper: 10 rows each (LIBERO: -1 opens, +1 closes)
PLUS_X = rows([1, 0, 0, 0, 0, 0, -1])
PLUS_Z = rows([0, 0, 1, 0, 0, 0, -1])
CLOSE = rows([0, 0, 0, 0, 0, 0, 1])


class ScriptedPolicy:
    """Returns ``script[i]`` for the i-th real observation (zeros after the script and for the
    controller's warm-up, which has stamp 0); records every observation it is given."""

    flow_steps = 10
    action_type = "delta"  # LIBERO's rows: end-effector steps

    def __init__(self, script, *, refuse: str = "", on_predict=None) -> None:
        self.script = [np.asarray(c, np.float32) for c in script]
        self.refuse = refuse
        self.on_predict = on_predict
        self.seen = []
        self.instruction = None
        self.closed = False

    def predict(self, obs, guidance=None):
        if obs.stamp_ns:
            self.seen.append(obs)
            if self.on_predict is not None:
                self.on_predict(obs)
        i = len(self.seen) - 1
        acts = self.script[i] if obs.stamp_ns and i < len(self.script) else rows([0] * 7)
        return ActionChunk(actions=acts.copy(), actions_normalized=acts.copy(),
                           variant="grid_sampler", flow_steps=self.flow_steps,
                           observation_stamp_ns=obs.stamp_ns,
                           instruction=self.instruction or "", latency_ms={"total": 0.0})

    def plan(self, instruction: str):
        if self.refuse and self.refuse in instruction:
            raise PromptError(f"instruction {instruction!r:.40} does not fit the test prompt")
        return instruction

    def set_instruction(self, instruction: str) -> None:
        self.plan(instruction)
        self.instruction = instruction

    def set_flow_steps(self, steps: int) -> None:
        self.flow_steps = steps

    def reseed(self, seed) -> None:
        pass

    def recover(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
