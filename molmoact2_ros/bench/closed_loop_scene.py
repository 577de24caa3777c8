"""Closed-loop scene and a synthetic flow policy: a moving target seen by a camera, a robot whose
state the observation carries, and a smooth target-tracking policy with the Policy interface.

The synthetic policy samples its chunk with the package's own ``run_flow`` from the exact
velocity field of a Gaussian over chunks (mean: the tracking plan; covariance: a random offset
shared by all rows plus a smooth wiggle). Like a real flow policy, two chunks from nearby
observations differ, so switches jump unless they are reconciled; and rows are correlated, so
inpainting the first rows moves the rest consistently. With ``action_type="delta"`` (LIBERO's
kind) the same Gaussian is mapped to per-tick steps in controller units (``delta_unit_m``
metres per unit) and sampled there, so inpainting works on the steps as the real model does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..bundle.conventions import Conventions
from ..host.flow import InpaintGuidance, run_flow
from ..policy import ActionChunk, Observation

DELTA_UNIT_M = 0.05  # the integrating robot's metres per action unit (OSC_POSE's goal offset)
IMAGE_PX = 64
VIEW_M = 0.25  # the camera sees x, y in [-VIEW_M, VIEW_M]
ACTION_DIM = 7


@dataclass
class Scene:
    """A target moving on a Lissajous path in x, y; the robot is a 7-D commanded pose."""

    name = "lissajous"
    amplitude_m: tuple[float, float] = (0.15, 0.10)
    period_s: tuple[float, float] = (10.0, 7.5)

    def target(self, t_s: float) -> np.ndarray:
        ax, ay = self.amplitude_m
        px, py = self.period_s
        out = np.zeros(ACTION_DIM)
        out[0] = ax * math.sin(2 * math.pi * t_s / px)
        out[1] = ay * math.sin(2 * math.pi * t_s / py + 0.5)
        return out

    def observe(self, t_ns: int, robot: np.ndarray) -> Observation:
        """Two camera frames (target blob in red, robot blob in green) and the 8-D state."""
        frame = np.zeros((IMAGE_PX, IMAGE_PX, 3), np.uint8)
        frame[..., 0] = _blob(self.target(t_ns / 1e9)[:2])
        frame[..., 1] = _blob(robot[:2])
        state = np.zeros(8, np.float32)
        state[:6] = robot[:6]
        state[6], state[7] = robot[6], -robot[6]
        return Observation(images=(frame, frame[::-1].copy()), state=state, stamp_ns=int(t_ns))


@dataclass
class Waypoints(Scene):
    """LIBERO-like: the target stands still and jumps to the next point of a seeded sequence
    every ``dwell_s`` (a task's next phase: reach, lift, place). Between jumps two chunks
    differ by sampling noise; at a jump the policy's intent changes."""

    name = "waypoints"
    dwell_s: float = 2.5
    seed: int = 0

    def __post_init__(self) -> None:
        rng = np.random.default_rng(10_000 + self.seed)
        self._points = rng.uniform(-1.0, 1.0, (64, 2)) * np.asarray(self.amplitude_m)

    def target(self, t_s: float) -> np.ndarray:
        out = np.zeros(ACTION_DIM)
        out[:2] = self._points[int(t_s // self.dwell_s) % len(self._points)]
        return out


SCENES = ("waypoints", "lissajous")


def make_scene(name: str, seed: int = 0) -> Scene:
    """The bench's scene by name (``SCENES``); ``seed`` draws the waypoints."""
    if name == "lissajous":
        return Scene()
    if name == "waypoints":
        return Waypoints(seed=seed)
    raise ValueError(f"scene={name!r}; choose one of {', '.join(SCENES)}")


def _pixel(xy_m: np.ndarray) -> np.ndarray:
    return (np.asarray(xy_m) / VIEW_M + 1.0) * 0.5 * (IMAGE_PX - 1)


def _blob(xy_m: np.ndarray, sigma_px: float = 3.0) -> np.ndarray:
    cx, cy = _pixel(xy_m)
    cols, rows = np.meshgrid(np.arange(IMAGE_PX), np.arange(IMAGE_PX))
    g = np.exp(-((cols - cx) ** 2 + (rows - cy) ** 2) / (2 * sigma_px**2))
    return np.round(255 * g).astype(np.uint8)


def locate_target(frame: np.ndarray) -> np.ndarray:
    """x, y (metres) of the red blob: intensity-weighted centroid (0, 0 without one)."""
    red = frame[..., 0].astype(np.float64)
    total = red.sum()
    if frame.shape[:2] != (IMAGE_PX, IMAGE_PX) or total <= 0:
        return np.zeros(2)
    cols, rows = np.meshgrid(np.arange(IMAGE_PX), np.arange(IMAGE_PX))
    px = np.array([(cols * red).sum() / total, (rows * red).sum() / total])
    return (px / (0.5 * (IMAGE_PX - 1)) - 1.0) * VIEW_M


class TargetTrackingPolicy:
    """Synthetic smooth tracking policy with the ``Policy`` interface (predict with guidance).

    Plan: row i = p + (g − p)·(1 − exp(−(i+1)·period/τ)) for the target g seen in the image
    and the robot p in the state. Sample: ``run_flow`` over the Gaussian's exact velocity field;
    delta chunks are the plan's differences (from p) in units of ``delta_unit_m``. With
    guidance the unguided sample from the same noise is kept in ``unguided[stamp]``.
    """

    variant_name = "synthetic"

    def __init__(
        self,
        horizon: int = 20,
        period_s: float = 0.05,
        *,
        flow_steps: int = 10,
        seed: int = 0,
        scale_m: float = 0.1,
        offset_sigma_m: float = 0.02,
        wiggle_sigma_m: float = 0.01,
        tau_s: float = 0.3,
        action_type: str = "absolute",
        inpaint_method: str | None = None,
        delta_unit_m: float = DELTA_UNIT_M,
        delta_unit_rad: float | None = None,
    ) -> None:
        self.horizon, self.period_s, self.flow_steps = horizon, period_s, flow_steps
        #: delta rows: metres and radians the robot moves per unit (the LIBERO arm:
        #: execution.delta_scale); the synthetic robots take one scale for both
        self.delta_unit_m = float(delta_unit_m)
        self.delta_unit_rad = float(delta_unit_m if delta_unit_rad is None else delta_unit_rad)
        self.action_type = action_type
        self.inpaint_method = inpaint_method  # overrides the guidance's method (bench)
        self.tau_s = tau_s
        self._rng = np.random.default_rng(seed)
        rows = np.arange(horizon, dtype=np.float64)
        wiggle = np.exp(-0.5 * ((rows[:, None] - rows[None, :]) / 4.0) ** 2)
        if action_type == "delta":  # steps: a bias shared by all rows plus a smooth wiggle,
            # sized so that their sum over the chunk spreads as the absolute plan's offset
            cov_m = ((offset_sigma_m / horizon) ** 2 * np.ones((horizon, horizon))
                     + (wiggle_sigma_m / horizon) ** 2 * wiggle)
            scale_m = self.delta_unit_m
        else:
            cov_m = (offset_sigma_m ** 2 * np.ones((horizon, horizon))
                     + wiggle_sigma_m ** 2 * wiggle)
        self.scale_m = scale_m  # metres per normalised flow unit
        #: published rows per flow unit: metres (absolute) or controller units (delta: 1)
        self.action_scale = np.full(ACTION_DIM, 1.0 if action_type == "delta" else scale_m)
        if action_type == "delta":  # the rotation rows in radians per unit, not metres
            self.action_scale[3:6] = self.delta_unit_m / self.delta_unit_rad
        self.cov = cov_m / scale_m**2 + 1e-6 * np.eye(horizon)
        self._pad = np.zeros((1, ACTION_DIM), np.float32)
        self._conv = Conventions(euler_in_graph=False)
        self.unguided: dict[int, np.ndarray] = {}

    def plan_mean(self, obs: Observation) -> np.ndarray:
        """The noise-free tracking plan [H, 7] (metres)."""
        p = np.zeros(ACTION_DIM)
        p[:6] = obs.state[:6]
        p[6] = obs.state[6]
        goal = np.zeros(ACTION_DIM)
        goal[:2] = locate_target(obs.images[0])
        times = (np.arange(self.horizon) + 1) * self.period_s
        alpha = 1.0 - np.exp(-times / self.tau_s)
        plan = p[None, :] + alpha[:, None] * (goal - p)[None, :]
        if self.action_type == "delta":  # steps from p; the gripper stays absolute
            steps = np.diff(np.concatenate([p[None, :], plan]), axis=0)
            steps[:, 6] = plan[:, 6] * self.scale_m
            return steps
        return plan

    def velocity(self, mean_n: np.ndarray):
        """``step(x, t)``: E[x1 − x0 | x_t] for x1 ~ N(mean, cov) per dim, x0 ~ N(0, I)."""
        cov, eye = self.cov, np.eye(self.horizon)

        def step(x: np.ndarray, t: np.ndarray) -> np.ndarray:
            tt = float(t[0])
            c = tt * tt * cov + (1.0 - tt) ** 2 * eye
            s = np.linalg.solve(c, x[0].astype(np.float64) - tt * mean_n)
            v = mean_n + tt * cov @ s - (1.0 - tt) * s
            return v[None].astype(np.float32)

        return step

    def predict(self, obs: Observation, *, noise=None, guidance: InpaintGuidance | None = None):
        mean_n = self.plan_mean(obs) / self.scale_m
        shape = (1, self.horizon, ACTION_DIM)
        x0 = (self._rng.standard_normal(shape) if noise is None else noise).astype(np.float32)
        prefix = weights = None
        method, beta = "pull", 5.0
        if guidance is not None:
            prefix = (np.asarray(guidance.prefix, np.float32) / self.action_scale)[None]
            weights = np.asarray(guidance.weights, np.float32)
            method, beta = self.inpaint_method or guidance.method, guidance.beta
        step = self.velocity(mean_n)
        x = run_flow(step, x0, self._pad, self.flow_steps, self._conv, prefix, weights,
                     method, beta)
        normalized = x[0].astype(np.float32)
        actions = (normalized * self.action_scale).astype(np.float32)
        if guidance is not None:
            plain = run_flow(step, x0, self._pad, self.flow_steps, self._conv)
            self.unguided[int(obs.stamp_ns)] = (plain[0] * self.action_scale).astype(np.float32)
        return ActionChunk(actions, normalized, self.variant_name, self.flow_steps,
                           obs.stamp_ns, "track the target", {"total": 0.0})

    # the rest of the PolicyLike interface
    def plan(self, instruction: str) -> None: ...
    def set_instruction(self, instruction: str) -> None: ...
    def set_flow_steps(self, steps: int) -> None: ...
    def reseed(self, seed: int | None) -> None: ...
    def recover(self) -> None: ...
    def close(self) -> None: ...
