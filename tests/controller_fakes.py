"""A stand-in policy and clock for controller-level tests (no bundle, no runtime)."""

from __future__ import annotations

import threading
import time

import numpy as np

from molmoact2_ros.control.controller import Controller
from molmoact2_ros.control.params import Settings
from molmoact2_ros.errors import PromptError, RuntimeBackendError
from molmoact2_ros.policy import ActionChunk

VARIANT_WORDS = {"grid_sampler": 20, "lp_vtp_sd": 20, "fused": 6}  # instruction budget
IMAGES = (np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 3), np.uint8))
STATE = np.zeros(8, np.float32)


class FakePolicy:
    """Records what it was told; ``fail`` makes predict raise, ``gate`` blocks predict."""

    def __init__(self, settings: Settings, events: list) -> None:
        self.variant = settings["variant"]
        self.events = events
        self.flow_steps = settings.flow_steps() or 10
        self.instruction = settings["instruction"]
        self.fail: BaseException | None = None
        self.gate: threading.Event | None = None
        self.closed = False
        self.seeds: list = []
        self.check_instruction(self.instruction)
        events.append(("load", self.variant))

    def check_instruction(self, text: str) -> None:
        if text and len(text.split()) > VARIANT_WORDS[self.variant]:
            raise PromptError(f"instruction {text!r} is too long for variant {self.variant}")

    def predict(self, obs):
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail is not None:
            raise self.fail
        actions = np.full((10, 7), 0.1, np.float32)
        return ActionChunk(actions, actions, self.variant, self.flow_steps, obs.stamp_ns,
                           self.instruction, {"total": 1.0})

    def plan(self, instruction):
        self.check_instruction(instruction)

    def set_instruction(self, instruction):
        self.check_instruction(instruction)
        self.instruction = instruction

    def set_flow_steps(self, steps):
        self.flow_steps = steps

    def reseed(self, seed):
        self.seeds.append(seed)

    def recover(self):
        self.fail = None

    def close(self):
        assert not self.closed, "closed twice"
        self.closed = True
        self.events.append(("close", self.variant))


class Clock:
    """A settable clock in ns."""

    def __init__(self, now: int = 1_000_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class QuietPolicy:
    """The policy calls a controller makes besides ``predict``, doing nothing (for scripted
    policies that only time and shape their chunks)."""

    flow_steps = 10

    def plan(self, instruction): ...
    def set_instruction(self, instruction): ...
    def set_flow_steps(self, steps): ...
    def reseed(self, seed): ...
    def recover(self): ...
    def close(self): ...


def bundle_settings(tmp_path, changes: dict) -> Settings:
    """Settings with an (empty) bundle folder per variant under ``tmp_path``, the instruction
    "task", execution timed from the observation, and ``changes``."""
    for v in VARIANT_WORDS:
        (tmp_path / v).mkdir(exist_ok=True)
    return Settings().with_changes(
        {**{f"bundle.{v}": str(tmp_path / v) for v in VARIANT_WORDS}, "instruction": "task",
         "execution.start": "observation", **changes})


class Rig:
    """A controller on fake policies; ``failing`` names variants whose load raises."""

    def __init__(self, bundle_root, **settings) -> None:
        base = {f"bundle.{v}": str(bundle_root / v) for v in VARIANT_WORDS}
        base |= {"backend": "onnx", "instruction": "pick up the bowl"}
        self.events: list = []
        self.published: list = []
        self.swaps: list = []
        self.failing: set[str] = set()
        self.load_delay_s = 0.0
        self.clock = Clock()
        self.ctl = Controller(
            Settings().with_changes(base | settings), publish=self.published.append,
            policy_factory=self._factory, clock_ns=self.clock,
            on_swap_done=lambda ok, reason, s: self.swaps.append((ok, reason, s["variant"])))

    def _factory(self, settings):
        time.sleep(self.load_delay_s)
        if settings["variant"] in self.failing:
            self.events.append(("load_failed", settings["variant"]))
            raise RuntimeBackendError(f"cannot load {settings['variant']}")
        return FakePolicy(settings, self.events)

    def start(self, *, worker: bool = False) -> Controller:
        self.ctl.configure()
        self.ctl.activate(worker=worker)
        return self.ctl

    def observe(self, offset_ns: int = 0) -> None:
        self.ctl.on_observation(IMAGES, STATE, self.clock.now + offset_ns)

    def wait_published(self, n: int, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.published) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(self.published) >= n
