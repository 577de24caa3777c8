"""Flow-matching loop: seeded noise, timesteps ``t_i = i/N`` and the Euler update (§8).

With in-graph Euler the export baked ``dt0 = 1/baked_steps``; for another ``N`` the host
recovers the velocity ``(next − x)/dt0`` and applies ``x + v/N`` instead, so ``flow_steps``
can change without new contexts. The same functions run in-process and in the action worker.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .conventions import Conventions


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


def run_flow(
    step: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x0: np.ndarray,
    pad: np.ndarray,
    num_steps: int,
    conv: Conventions,
) -> np.ndarray:
    """Integrate from noise to data; ``step(x, t)`` runs action_step and returns its output."""
    keep = (np.float32(1.0) - pad.reshape(1, 1, -1)).astype(np.float32)
    x = np.asarray(x0, dtype=np.float32)
    for t in timesteps(num_steps):
        x = euler_update(x, step(x, np.full((1,), t, dtype=np.float32)), keep, num_steps, conv)
    return x
