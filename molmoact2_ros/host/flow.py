"""Flow-matching loop: seeded noise, timesteps ``t_i = i/N`` and the Euler update (§8).

With in-graph Euler the export baked ``dt0 = 1/baked_steps``; for another ``N`` the host
recovers the velocity ``(next − x)/dt0`` and applies ``x + v/N`` instead, so ``flow_steps``
can change without new contexts. The same functions run in-process and in the action worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..bundle.conventions import Conventions


@dataclass(frozen=True)
class InpaintGuidance:
    """Previous actions (de-normalised, [H, D]) and per-row weights for the flow loop."""

    prefix: np.ndarray
    weights: np.ndarray
    frozen_rows: int
    overlap_rows: int


def initial_noise(
    seed: int | np.random.Generator | None, shape: tuple[int, ...], pad: np.ndarray
) -> np.ndarray:
    """x0 ~ N(0, 1) in float32 with the padded action dims zeroed."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    x0 = rng.standard_normal(shape).astype(np.float32)
    return x0 * (np.float32(1.0) - pad.reshape(1, 1, -1).astype(np.float32))


def observation_rng(seed: int, stamp_ns: int) -> np.random.Generator:
    """The noise generator of one observation: seeded by (seed, stamp in ns), so two runs of a
    bag draw the same noise per observation whatever they skipped or ran before."""
    return np.random.default_rng([int(seed), int(stamp_ns)])


def timesteps(num_steps: int) -> np.ndarray:
    """``t_i = i / N`` for i = 0..N−1 (t = 0 is noise, t = 1 is data)."""
    if num_steps < 1:
        raise ValueError(f"flow steps must be >= 1, got {num_steps}")
    return (np.arange(num_steps, dtype=np.float32) / np.float32(num_steps)).astype(np.float32)


def euler_update(
    x: np.ndarray,
    step_output: np.ndarray,
    keep: np.ndarray,
    num_steps: int,
    conv: Conventions,
) -> np.ndarray:
    """One Euler step from the action_step output; ``keep`` is ``1 − action_dim_is_pad``."""
    x = np.asarray(x, dtype=np.float32)
    out = np.asarray(step_output, dtype=np.float32)
    if conv.euler_in_graph:
        if num_steps == conv.euler_baked_steps:
            nxt = out
        else:
            ratio = np.float32(conv.euler_baked_steps / num_steps)
            nxt = x + (out - x) * ratio
    else:
        nxt = x + out * np.float32(1.0 / num_steps)
    return (nxt * keep).astype(np.float32)


def guidance_pull(
    x: np.ndarray, x0: np.ndarray, prefix: np.ndarray, weights: np.ndarray, t: float
) -> np.ndarray:
    """Pull the rows with weight w > 0 towards the flow interpolation of ``prefix`` at time t:
    ``x ← (1 − w)·x + w·((1 − t)·x0 + t·prefix)`` (rows with w = 0 are left untouched)."""
    rows = np.flatnonzero(weights > 0)
    out = np.array(x, dtype=np.float32)
    if rows.size == 0:
        return out
    tt = np.float32(t)
    w = weights[rows].astype(np.float32).reshape(1, -1, 1)
    target = (np.float32(1.0) - tt) * x0[:, rows] + tt * prefix[:, rows]
    out[:, rows] = (np.float32(1.0) - w) * out[:, rows] + w * target
    return out


def run_flow(
    step: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x0: np.ndarray,
    pad: np.ndarray,
    num_steps: int,
    conv: Conventions,
    prefix: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Integrate from noise to data; ``step(x, t)`` runs action_step and returns its output.

    With ``prefix`` [1, T, A] (normalised, padded) and per-row ``weights`` [T], every step
    starts from ``guidance_pull`` at its time and the result gets the pull at t = 1
    (training-free inpainting): weight 1 rows end exactly on the prefix; all-zero weights
    (or none) leave the loop untouched.
    """
    keep = (np.float32(1.0) - pad.reshape(1, 1, -1)).astype(np.float32)
    x = np.asarray(x0, dtype=np.float32)
    guided = weights is not None and prefix is not None and bool(np.any(weights > 0))
    if guided:
        x0 = x
        prefix = np.asarray(prefix, dtype=np.float32).reshape(x.shape) * keep
        weights = np.clip(np.asarray(weights, dtype=np.float32).reshape(-1), 0.0, 1.0)
    for t in timesteps(num_steps):
        if guided:
            x = guidance_pull(x, x0, prefix, weights, t)
        x = euler_update(x, step(x, np.full((1,), t, dtype=np.float32)), keep, num_steps, conv)
    if guided:
        x = guidance_pull(x, x0, prefix, weights, 1.0)
    return x
