"""What the controller exchanges: the policy seam, published chunks, bundle checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import MolmoActError
from ..policy import ActionChunk, Observation
from .params import Settings
from .safety import SafetyReport


class PolicyLike(Protocol):
    """What the controller needs from a policy (``molmoact2_ros.policy.Policy``)."""

    flow_steps: int

    def predict(self, obs: Observation) -> ActionChunk:
        """Also called as ``predict(obs, guidance=InpaintGuidance)`` with blend=inpaint."""
    def plan(self, instruction: str) -> Any: ...
    def set_instruction(self, instruction: str) -> None: ...
    def set_flow_steps(self, steps: int) -> None: ...
    def reseed(self, seed: int | None) -> None: ...
    def recover(self) -> None: ...
    def close(self) -> None: ...


PolicyFactory = Callable[[Settings], PolicyLike]


def load_policy(settings: Settings) -> PolicyLike:
    """Default factory: the bundle of the selected variant on the selected backend."""
    from ..bundle.bundle import Suffixes
    from ..policy import Policy

    seed = settings["seed"]
    return Policy.load(
        settings.bundle_path(),
        settings["variant"],
        backend=settings["backend"],
        suffixes=Suffixes.from_mapping(settings.suffixes()),
        pipeline_options=settings.runtime_options() if settings["backend"] == "htp" else {},
        flow_steps=settings.flow_steps(),
        seed=None if seed < 0 else seed,
        instruction=settings["instruction"] or None,
    )


@dataclass
class Published:
    """A chunk that passed safety, ready for the node to publish."""

    chunk: ActionChunk
    actions: np.ndarray
    sequence: int
    safety: SafetyReport
    settings: Settings
    received_ns: int
    ready_ns: int
    #: row i is due at start_ns + (i+1)·period; rows before first_future_index were due already
    start_ns: int = 0
    trajectory_stamp_ns: int = 0
    first_future_index: int = 0
    #: ``absolute`` rows are targets; ``delta`` rows are steps the robot integrates
    action_type: str = "absolute"
    #: delta: the pose (x, y, z, rx, ry, rz) the trajectory's targets are integrated from
    base_pose: np.ndarray | None = None
    #: the timing the chunk runs on: observation or receipt (execution.start=auto picks one)
    start_mode: str = "observation"
    #: inpainting: the frozen rows d and the mask the flow loop was given (0 and empty: none)
    inpaint_frozen_rows: int = 0
    inpaint_weights: np.ndarray | None = None
    inpaint_method: str = ""
    #: the trajectory's targets as checked by the safety stage (None: from the rows)
    targets: np.ndarray | None = None


def delta_mask(out: Published) -> np.ndarray | None:
    """The dims of a published chunk the robot integrates (None for absolute chunks)."""
    from .execution import delta_dims

    return delta_dims(out.action_type, out.settings["execution.gripper_dim"],
                      int(np.asarray(out.actions).shape[1]))


def chunk_message_fields(out: Published) -> dict[str, Any]:
    """The ActionChunk.msg fields of a published chunk as plain values (times in ns).

    One mapping for the node (rclpy messages) and replay (rosbags messages).
    """
    s, chunk = out.settings, out.chunk
    return {
        "stamp_ns": chunk.observation_stamp_ns,
        "sequence": out.sequence,
        "variant": chunk.variant,
        "context_suffix_vision": s["context_suffix.vision"],
        "context_suffix_llm": s["context_suffix.llm"],
        "context_suffix_action": s["context_suffix.action"],
        "context_suffix_action_context": s["context_suffix.action_context"],
        "flow_steps": chunk.flow_steps,
        "instruction": chunk.instruction,
        "action_names": list(s["action_names"]),
        "horizon": int(out.actions.shape[0]),
        "action_dim": int(out.actions.shape[1]),
        "actions": out.actions.reshape(-1).astype(np.float32),
        "period_ns": int(round(s["control_period_s"] * 1e9)),
        "inference_latency_ns": int(out.ready_ns - out.received_ns),
        "start_stamp_ns": int(out.start_ns),
        "first_future_index": int(out.first_future_index),
        "action_type": out.action_type,
        "start_mode": out.start_mode,
        "inpaint_method": out.inpaint_method,
        "inpaint_frozen_rows": int(out.inpaint_frozen_rows),
        "inpaint_weights": (np.zeros(0, np.float32) if out.inpaint_weights is None
                            else np.asarray(out.inpaint_weights, np.float32).reshape(-1)),
    }


def trajectory_targets(out: Published) -> np.ndarray:
    """What a trajectory controller follows, [H, D]: the targets the safety stage checked, or
    from the rows (``targets_of``)."""
    if out.targets is not None:
        return np.asarray(out.targets, np.float64)
    return targets_of(out.actions, delta_mask(out), out.base_pose, out.settings)


def targets_of(actions: np.ndarray, mask: np.ndarray | None, base_pose: np.ndarray | None,
               settings: Settings) -> np.ndarray:
    """Absolute rows as they are; delta rows (dims ``mask``) integrated from ``base_pose`` with
    ``execution.delta_scale`` (the gripper as commanded)."""
    if mask is None or base_pose is None:
        return np.asarray(actions, np.float64)
    from .delta import integrate_targets

    scale_m, scale_rad = (float(v) for v in settings["execution.delta_scale"])
    return integrate_targets(actions, base_pose, mask, scale_m, scale_rad)


def trajectory_message_fields(out: Published) -> dict[str, Any]:
    """JointTrajectory of a published chunk as plain values: header stamp (0 = start on
    receipt), joint names, and per point its positions (``trajectory_targets``: absolute
    end-effector targets also for delta chunks) and ``time_from_start`` (ns)."""
    period_ns = int(round(out.settings["control_period_s"] * 1e9))
    targets = trajectory_targets(out)
    return {
        "stamp_ns": int(out.trajectory_stamp_ns),
        "joint_names": list(out.settings["action_names"]),
        "points": [
            (row.astype(float).tolist(), (i + 1) * period_ns) for i, row in enumerate(targets)
        ],
    }


def check_instruction(settings: Settings) -> tuple[bool, str]:
    """The instruction fits the prompt of the variant ``settings`` select, checked from the
    bundle's host files before a reload (a load that fails on it would fail its rollback
    too, which keeps the same instruction)."""
    from ..bundle.bundle import Bundle
    from ..host.budget import builder_for

    try:
        builder_for(Bundle.open(settings.bundle_path(), settings["variant"])).plan(
            settings["instruction"])
    except MolmoActError as exc:
        return False, f"for {settings['variant']}: {exc}"
    except OSError as exc:
        return False, f"bundle.{settings['variant']}: cannot read the bundle ({exc})"
    return True, ""


def prompt_refusal(settings: Settings) -> str:
    """Why the instruction cannot fit the selected variant's prompt (its token count, the
    budget, the tokens to cut), or "" when it fits or the bundle cannot be read yet (configure
    reports that): an instruction is refused when set, not at the next chunk."""
    from ..bundle.bundle import Bundle
    from ..errors import PromptError
    from ..host.budget import builder_for

    try:
        builder = builder_for(Bundle.open(settings.bundle_path(), settings["variant"]))
    except (MolmoActError, OSError):
        return ""
    try:
        builder.plan(settings["instruction"])
    except PromptError as exc:
        return str(exc)
    return ""


def check_bundle(settings: Settings) -> tuple[bool, str]:
    """The bundle and context files a reload would need exist (cheap file checks only)."""
    from ..bundle.bundle import Bundle, Suffixes

    try:
        bundle = Bundle.open(settings.bundle_path(), settings["variant"])
        bundle.check(settings["backend"], Suffixes.from_mapping(settings.suffixes()))
    except MolmoActError as exc:
        return False, str(exc)
    except OSError as exc:
        return False, f"bundle.{settings['variant']}: cannot read the bundle ({exc})"
    return True, ""
