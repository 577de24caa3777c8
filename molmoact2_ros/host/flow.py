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

#: How the flow loop follows the prefix: ``pull`` moves x towards the prefix's interpolation
#: before each step (per-step weight 1 − (1 − w)^(1/N)); ``pigdm`` adds real-time chunking's
#: guidance term to the velocity with ΠGDM's weight min(β, (1 − τ)/(τ·r²)) (forward passes only).
INPAINT_METHODS = ("pull", "pigdm")
#: Real-time chunking's guidance weight cap β (the paper's value).
DEFAULT_BETA = 5.0


@dataclass(frozen=True)
class InpaintGuidance:
    """Previous actions (de-normalised, [H, D]) and per-row weights (the mask) for the flow
    loop, with the method and the ΠGDM cap β."""

    prefix: np.ndarray
    weights: np.ndarray
    frozen_rows: int
    overlap_rows: int
    method: str = "pull"
    beta: float = DEFAULT_BETA


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


def per_step_weights(mask: np.ndarray, num_steps: int) -> np.ndarray:
    """Pull per step ``1 − (1 − w)^(1/N)``: N pulls compound to the mask ``w`` (1 stays 1)."""
    w = np.clip(np.asarray(mask, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore"):  # w = 1: log1p(−1) = −inf, and the pull is exactly 1
        return (-np.expm1(np.log1p(-w) / int(num_steps))).astype(np.float32)


def pigdm_weight(t: float, beta: float) -> float:
    """ΠGDM guidance weight ``min(β, (1 − τ)/(τ·r²))`` with r² = (1 − τ)²/(τ² + (1 − τ)²)
    (τ = t: 0 is noise, 1 is data; β where the expression is unbounded)."""
    t = float(t)
    if t <= 0.0 or t >= 1.0:
        return float(beta)
    r2 = (1.0 - t) ** 2 / (t * t + (1.0 - t) ** 2)
    return float(min(beta, (1.0 - t) / (t * r2)))


def _velocity(x: np.ndarray, out: np.ndarray, conv: Conventions) -> np.ndarray:
    """The velocity behind an action_step output (in-graph Euler: (out − x)/dt0)."""
    if conv.euler_in_graph:
        return (out - x) * np.float32(conv.euler_baked_steps)
    return out


def _with_velocity(x: np.ndarray, v: np.ndarray, conv: Conventions) -> np.ndarray:
    """The action_step output that carries velocity ``v`` (inverse of ``_velocity``)."""
    if conv.euler_in_graph:
        return x + v * np.float32(1.0 / conv.euler_baked_steps)
    return v


def run_flow(
    step: Callable[[np.ndarray, np.ndarray], np.ndarray],
    x0: np.ndarray,
    pad: np.ndarray,
    num_steps: int,
    conv: Conventions,
    prefix: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    method: str = "pull",
    beta: float = DEFAULT_BETA,
) -> np.ndarray:
    """Integrate from noise to data; ``step(x, t)`` runs action_step and returns its output.

    With ``prefix`` [1, T, A] (normalised, padded) and the per-row mask ``weights`` [T]:
    ``pull`` applies ``guidance_pull`` with the per-step weight before every step after the
    first (at t = 0 it would be the identity) and once more at t = 1, N pulls that compound to
    the mask, so weight 1 rows end exactly on the prefix; ``pigdm`` adds
    ``g(τ)·w·(prefix − x̂1)`` to each velocity, x̂1 = x + (1 − τ)·v the one-step data estimate
    (the Jacobian of x̂1 taken as the identity: forward passes only). All-zero weights (or
    none) leave the loop untouched.
    """
    if method not in INPAINT_METHODS:
        raise ValueError(f"inpaint method {method!r}; choose one of {', '.join(INPAINT_METHODS)}")
    keep = (np.float32(1.0) - pad.reshape(1, 1, -1)).astype(np.float32)
    x = np.asarray(x0, dtype=np.float32)
    guided = weights is not None and prefix is not None and bool(np.any(weights > 0))
    if guided:
        x0 = x
        prefix = np.asarray(prefix, dtype=np.float32).reshape(x.shape) * keep
        mask = np.clip(np.asarray(weights, dtype=np.float32).reshape(-1), 0.0, 1.0)
        pull = per_step_weights(mask, num_steps)
        mask3 = mask.reshape(1, -1, 1)
    for i, t in enumerate(timesteps(num_steps)):
        if guided and method == "pull" and i > 0:
            x = guidance_pull(x, x0, prefix, pull, t)
        out = step(x, np.full((1,), t, dtype=np.float32))
        if guided and method == "pigdm":
            v = _velocity(x, np.asarray(out, np.float32), conv)
            x1 = x + (np.float32(1.0) - t) * v
            g = np.float32(pigdm_weight(float(t), beta))
            out = _with_velocity(x, v + g * mask3 * (prefix - x1), conv)
        x = euler_update(x, out, keep, num_steps, conv)
    if guided and method == "pull":
        x = guidance_pull(x, x0, prefix, pull, 1.0)
    return x
