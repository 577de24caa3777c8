"""Node parameters as one table (name, default, description, range, how a change applies),
and their validation as pure functions returning ``(ok, reason)``.

The node declares its ROS parameters from ``PARAMS``; ``config/policy.yaml`` documents the
same table (a test keeps them in step).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..bundle.variants import SUFFIX_GROUPS, VARIANTS
from ..host.flow import INPAINT_METHODS
from ..host.images import MOUNT_ROTATIONS
from ..host.state import HEMISPHERES
from .execution import ACTION_TYPES, BLENDS, RAMPS, SCHEDULES, START_MODES

#: How a change applies: ``live`` on the next chunk, ``reload`` by a background session swap,
#: ``configure`` only on the next configure transition (topics, QoS, sync).
LIVE, RELOAD, CONFIGURE = "live", "reload", "configure"
BACKENDS = ("onnx", "htp")
TRIGGERS = ("on_observation", "rate", "chunk_consumed")
STATE_SOURCES = ("joint_state", "tf")
LOAD_ORDERS = ("parallel", "sequential")
MAX_FLOW_STEPS = 100
#: Largest noise seed (numpy seeds are unsigned; ROS integer parameters are 64-bit).
SEED_MAX = 2**31 - 1


@dataclass(frozen=True)
class ParamSpec:
    """One ROS parameter."""

    name: str
    default: Any
    description: str
    apply: str = LIVE
    int_range: tuple[int, int] | None = None
    float_range: tuple[float, float] | None = None
    #: a list of exactly this many positive finite numbers
    float_list: int | None = None
    #: with ``float_list``: the largest value of each element
    list_max: tuple[float, ...] | None = None


def _p(name, default, description, apply=LIVE, **kw) -> ParamSpec:
    return ParamSpec(name, default, description, apply, **kw)


PARAMS: tuple[ParamSpec, ...] = (
    _p("variant", "grid_sampler", f"model variant: {', '.join(VARIANTS)}", RELOAD),
    *(
        _p(f"bundle.{v}", "", f"folder of the {v} bundle (ctx/, onnx/, golden/, host/)", RELOAD)
        for v in VARIANTS
    ),
    _p("backend", "htp", "runtime: htp (qai_appbuilder on the NPU) or onnx (ONNX Runtime)", RELOAD),
    _p("context_suffix.vision", "", "context suffix of vision: '' (fp16) or e.g. '_w4a16'", RELOAD),
    _p("context_suffix.llm", "", "context suffix of llm_split0..3", RELOAD),
    _p("context_suffix.action", "",
       "context suffix of action_step only (action_context stays fp16)", RELOAD),
    _p("context_suffix.action_context", "",
       "context suffix of action_context: '' (fp16, as the reference runtime loads it) or an "
       "explicitly named quantised context, e.g. '_w4a16'", RELOAD),
    _p("runtime.call_timeout_s", 30.0,
       "htp: deadline of one worker call; a worker that misses it is killed and restarted",
       CONFIGURE, float_range=(0.1, 3600.0)),
    _p("runtime.release_on_exit", False,
       "htp: on stop also release every context (off: release the perf vote, then exit)",
       CONFIGURE),
    _p("runtime.load_order", "parallel",
       "htp: load the contexts in parallel, or sequential (largest first)", CONFIGURE),
    _p("runtime.state_dir", "",
       "htp: folder of the restart record (restart times, an earlier crash), so the restart cap "
       "and the reboot hint survive a node restart (e.g. ~/.ros/molmoact2); '' keeps it in memory",
       CONFIGURE),
    _p("runtime.bundle_libs", True,
       "htp: use a bundle's own qnn_libs/ and dsp_libs/ (false: the wheel's QNN runtime)",
       CONFIGURE),
    _p("autostart", False,
       "configure and activate on its own when the process starts (launch respawn sets it, so a "
       "restarted process comes back active)", CONFIGURE),
    _p("flow_steps", 0, "flow-matching steps; 0 = the variant default (10, or 2 for lp_vtp_sd)",
       int_range=(0, MAX_FLOW_STEPS)),
    _p("instruction", "", "task instruction, e.g. 'put the bowl on the plate'"),
    _p("seed", -1,
       "noise seed: each observation's noise is drawn from (seed, its stamp in ns); -1 = random",
       int_range=(-1, SEED_MAX)),
    _p("trigger", "on_observation",
       "when to infer: on_observation | rate | chunk_consumed"),
    _p("rate_hz", 2.0, "inference rate for trigger=rate", float_range=(0.01, 100.0)),
    _p("control_period_s", 0.05, "time between actions of a chunk (LIBERO: 20 Hz)",
       float_range=(0.001, 10.0)),
    _p("max_observation_age_s", 0.5, "observations older than this are skipped",
       float_range=(0.0, 3600.0)),
    _p("execution.start", "auto",
       "chunk timing: auto (observation while the rows ahead cover the next chunk's latency "
       "plus the overlap, else receipt) | observation (row i due at observation stamp + "
       "(i+1) period) | receipt (row i due at receipt + (i+1) period)"),
    _p("execution.action_type", "bundle",
       "what a row is: bundle (the policy's control mode; LIBERO: delta) | delta (a step the "
       "robot integrates; the gripper stays absolute) | absolute (a target)"),
    _p("execution.delta_scale", [0.0125, 0.11],
       "delta rows: metres and radians the arm moves per action unit and control period; the "
       "trajectory's absolute targets are integrated with it (LIBERO's OSC_POSE offsets its "
       "goal by 0.05 m, 0.5 rad per unit and the arm moves about a quarter of that per 50 ms "
       "step: 0.0125 m, 0.11 rad, measured). At most 0.05 m and 0.5 rad: the goal offset is "
       "the most one unit ever asked of LIBERO's arm in a period, and a target further than a "
       "few centimetres per period is a fault, not a motion", float_list=2,
       list_max=(0.05, 0.5)),
    _p("execution.gripper_dim", 6,
       "delta rows: the action dimension that is the gripper, an absolute command the robot "
       "does not integrate (-1: none; never inferred from action_names)", int_range=(-1, 6)),
    _p("execution.blend", "none",
       "continuity across replans: none | crossfade | ensemble | inpaint (in the flow loop)"),
    _p("execution.overlap_s", 0.1,
       "rows of the current chunk still ahead when the next arrives (the window blending "
       "works in): trigger=chunk_consumed infers that early, start=auto keeps it",
       float_range=(0.0, 10.0)),
    _p("execution.crossfade_ramp", "linear", "crossfade ramp over the overlap: linear | cosine"),
    _p("execution.ensemble_decay", 0.01,
       "ensemble weights exp(-decay k), k = 0 for the oldest prediction (ACT)",
       float_range=(0.0, 10.0)),
    _p("execution.inpaint_method", "pigdm",
       "inpaint: pull (towards the executing rows, per-step weight 1-(1-w)^(1/N)) | pigdm "
       "(real-time chunking's guided velocity, weight min(beta, (1-t)/(t r^2)))"),
    _p("execution.inpaint_schedule", "exp",
       "inpaint mask between the frozen rows and the end of the overlap: hard | linear | exp"),
    _p("execution.inpaint_beta", 5.0, "inpaint=pigdm: the guidance weight cap beta",
       float_range=(0.0, 100.0)),
    _p("max_future_stamp_s", 0.5,
       "inputs stamped further ahead of the node's clock than this are skipped (before "
       "synchronisation)",
       float_range=(0.0, 3600.0)),
    _p("max_image_side_px", 4096,
       "compressed images wider or taller than this are refused from their header, raw ones "
       "with more pixels than its square",
       int_range=(16, 65535)),
    _p("sync.slop_s", 0.05, "max stamp spread of a synchronised observation",
       CONFIGURE, float_range=(0.0, 10.0)),
    _p("sync.queue_size", 10, "messages kept per input for synchronisation", CONFIGURE,
       int_range=(1, 1000)),
    _p("topics.image_primary", "camera/agentview/image", "primary (agentview) camera topic",
       CONFIGURE),
    _p("topics.image_wrist", "camera/wrist/image", "wrist camera topic", CONFIGURE),
    _p("topics.joint_states", "joint_states", "sensor_msgs/JointState topic", CONFIGURE),
    _p("compressed_images", False, "subscribe to sensor_msgs/CompressedImage instead", CONFIGURE),
    _p("flip_images.primary", "none",
       "how the primary camera is mounted, undone before the bundle's own flip: "
       "none | 180 | vflip | hflip"),
    _p("flip_images.wrist", "none",
       "how the wrist camera is mounted, undone before the bundle's own flip: "
       "none | 180 | vflip | hflip"),
    _p("state.source", "joint_state", "robot state from joint_state names or tf (pose + gripper)",
       CONFIGURE),
    _p("state.joint_names", ["eef_x", "eef_y", "eef_z", "eef_rx", "eef_ry", "eef_rz",
                             "finger_left", "finger_right"],
       "JointState names giving the 8-D LIBERO state in order (state.source=joint_state)"),
    _p("state.base_frame", "base_link", "tf: frame the end-effector pose is expressed in",
       CONFIGURE),
    _p("state.ee_frame", "ee_link", "tf: end-effector frame", CONFIGURE),
    _p("state.gripper_joint_names", ["finger_left", "finger_right"],
       "tf: JointState names of the two gripper fingers"),
    _p("state.frame_transform", [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
       "x, y, z, qx, qy, qz, qw taking the pose from the frame it is read in to the frame the "
       "policy was trained in (identity: already in it; a Franka's base_link into LIBERO's "
       "world: [-0.66, 0.0, 0.912, 0.0, 0.0, 0.0, 1.0], measured in the simulator)"),
    _p("state.quaternion_hemisphere", "keep",
       "the eef quaternion's sign: keep (as given) | nearest_stats (per observation the sign "
       "whose axis-angle is nearest the training statistics; LIBERO's roll runs past pi near "
       "home, a tf2 source with w >= 0 gives the other sign)"),
    _p("state.finger_signs", [1.0, 1.0],
       "multipliers of the two finger values: LIBERO reads (+q, -q), a real Franka reports "
       "both positive: [1.0, -1.0] there"),
    _p("action_names", ["x", "y", "z", "roll", "pitch", "yaw", "gripper"],
       "names of the 7 action dimensions (ActionChunk.action_names, JointTrajectory joints)"),
    _p("action_min", [0.0], "per-dimension lower limits; [0.0] (one value) = no limit"),
    _p("action_max", [0.0], "per-dimension upper limits; [0.0] (one value) = no limit"),
    _p("max_step_delta", [0.0],
       "max change between consecutive actions per dimension; [0.0] = no limit"),
    _p("safety.workspace_min", [0.0],
       "lower corner (x, y, z, metres, the state's frame) of the box the trajectory's targets "
       "must stay in; [0.0] (one value) = no lower bound (config/libero_workspace.yaml: LIBERO's "
       "reach)"),
    _p("safety.workspace_max", [0.0],
       "upper corner of the workspace box; [0.0] = no upper bound"),
    _p("safety.workspace_mode", "clamp",
       "a target outside the workspace: clamp (onto the box, counted as count.workspace_clamped; "
       "delta steps follow) | hold (the chunk is not published, drop.outside_workspace)"),
    _p("safety.sanity_state_abs", 10.0,
       "a state value larger than this (metres, radians) is a fault: nothing is published "
       "(drop.unsafe_state); at least 7, above any rotation vector (at most 2 pi)",
       float_range=(7.0, 1e6)),
    _p("safety.sanity_target_abs", 10.0,
       "a trajectory target value larger than this (metres, radians) is a fault: the chunk is "
       "not published (drop.unsafe_target); at least 7, above any rotation vector",
       float_range=(7.0, 1e6)),
)
#: safety.workspace_mode choices
WORKSPACE_MODES = ("clamp", "hold")
PARAMS_BY_NAME = {p.name: p for p in PARAMS}


@dataclass(frozen=True)
class Settings:
    """The validated values of every parameter (attribute names use ``_`` for ``.``)."""

    values: dict = field(default_factory=lambda: {p.name: p.default for p in PARAMS})

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def with_changes(self, changes: dict) -> Settings:
        return replace(self, values={**self.values, **changes})

    def bundle_path(self, variant: str | None = None) -> str:
        return self.values[f"bundle.{variant or self.values['variant']}"]

    def runtime_options(self) -> dict[str, Any]:
        """``runtime.*`` as options of the resident HTP pipeline."""
        return {
            "call_timeout_s": float(self.values["runtime.call_timeout_s"]),
            "release_on_exit": bool(self.values["runtime.release_on_exit"]),
            "load_order": self.values["runtime.load_order"],
            "state_dir": os.path.expanduser(str(self.values["runtime.state_dir"]))
            if self.values["runtime.state_dir"] else "",
            "bundle_libs": bool(self.values["runtime.bundle_libs"]),
        }

    def suffixes(self) -> dict[str, str]:
        return {g: self.values[f"context_suffix.{g}"] for g in SUFFIX_GROUPS}

    def mounts(self) -> tuple[str, str]:
        """``flip_images.primary`` and ``flip_images.wrist``, camera order."""
        return self.values["flip_images.primary"], self.values["flip_images.wrist"]

    def flow_steps(self) -> int | None:
        return self.values["flow_steps"] or None

    def limits(self) -> tuple[list[float] | None, list[float] | None, list[float] | None]:
        def opt(name):
            v = list(self.values[name])
            return None if v == [0.0] or not v else v

        return opt("action_min"), opt("action_max"), opt("max_step_delta")

    def workspace(self) -> tuple[list[float], list[float]] | None:
        """``safety.workspace_min/max`` as (lower, upper) x, y, z (a side not set: ±inf), or
        None when neither is set."""
        lo, hi = (list(self.values[f"safety.workspace_{k}"]) for k in ("min", "max"))
        if lo == [0.0] and hi == [0.0]:
            return None
        inf = float("inf")
        return ([-inf] * 3 if lo == [0.0] else lo), ([inf] * 3 if hi == [0.0] else hi)


def validate_value(name: str, value: Any, settings: Settings) -> tuple[bool, str]:
    """Cheap, synchronous validation of one parameter value; the reason names the fix."""
    spec = PARAMS_BY_NAME.get(name)
    if spec is None:
        return True, ""  # not ours (use_sim_time, diagnostic_updater.*): never reject
    ok, reason = check_type(spec, value)
    if not ok:
        return ok, reason
    if spec.int_range and not (spec.int_range[0] <= value <= spec.int_range[1]):
        return False, f"{name}={value} is out of range [{spec.int_range[0]}, {spec.int_range[1]}]"
    if spec.float_range:
        lo, hi = spec.float_range
        if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
            return False, f"{name}={value} is out of range [{lo}, {hi}]"
    if spec.float_list and (len(value) != spec.float_list or not all(
            math.isfinite(v) and v > 0 for v in value)):
        return False, (f"{name}={list(value)} needs {spec.float_list} positive finite numbers, "
                       f"e.g. {spec.default}")
    if spec.list_max and any(v > m for v, m in zip(value, spec.list_max)):
        return False, (f"{name}={list(value)} is out of range: at most {list(spec.list_max)} "
                       f"(see docs/parameters.md), e.g. {spec.default}")
    check = _CHECKS.get(name) or (_check_suffix if name.startswith("context_suffix.") else None)
    if name.startswith("bundle."):
        check = _check_bundle_path
    return check(name, value, settings) if check else (True, "")


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_type(spec: ParamSpec, value: Any) -> tuple[bool, str]:
    """The value has the parameter's type (bool is not an int; a string is not a list)."""
    want = spec.default
    if isinstance(want, bool):
        ok, kind = isinstance(value, bool), "a boolean (true/false)"
    elif isinstance(want, int):
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(want, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        kind = "a number"
    elif isinstance(want, str):
        ok, kind = isinstance(value, str), "a string"
    elif want and isinstance(want[0], str):
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        kind = "a list of strings, e.g. ['a', 'b']"
    else:
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        kind = "a list of numbers, e.g. [0.0]"
    if ok:
        return True, ""
    return False, f"{spec.name}={value!r} is a {_type_name(value)}; it must be {kind}"


def _check_variant(name, value, settings):
    if value not in VARIANTS:
        return False, f"unknown variant {value!r}; choose one of {', '.join(VARIANTS)}"
    if not settings.bundle_path(value):
        return False, f"bundle.{value} is empty: set it to the {value} bundle folder first"
    return True, ""


def _check_backend(name, value, settings):
    if value not in BACKENDS:
        return False, f"unknown backend {value!r}; choose one of {', '.join(BACKENDS)}"
    return True, ""


def _check_bundle_path(name, value, settings):
    if not value:
        return True, ""
    try:
        if "\x00" in value:
            raise ValueError("it contains a NUL character")
        exists = Path(value).expanduser().is_dir()
    except (OSError, ValueError) as exc:  # name too long, NUL byte, ...
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        shown = repr(value[:80]) + ("..." if len(value) > 80 else "")
        return False, f"{name}: {shown} is not a usable folder path ({why})"
    if not exists:
        return False, f"{name}: folder {value!r} does not exist"
    return True, ""


def _check_suffix(name, value, settings):
    if value and (not value.startswith("_") or "/" in value or ".." in value):
        return False, f"{name}={value!r} must be '' or start with '_' (e.g. '_w4a16')"
    return True, ""


def _check_choice(choices):
    def check(name, value, settings):
        if value not in choices:
            return False, f"{name}={value!r}; choose one of {', '.join(choices)}"
        return True, ""

    return check


def _check_action_names(name, value, settings):
    if len(value) != 7 or len(set(value)) != 7 or not all(value):
        return False, f"{name} needs 7 distinct non-empty names, got {list(value)}"
    return True, ""


def _check_limit_list(name, value, settings):
    vals = list(value)
    if vals == [0.0]:
        return True, ""
    if len(vals) != 7 or not all(math.isfinite(v) for v in vals):
        return False, f"{name} needs 7 finite values (or [0.0] for no limit), got {vals}"
    if name == "max_step_delta" and any(v <= 0 for v in vals):
        return False, f"{name} values must be > 0"
    return True, ""


def _check_workspace(name, value, settings):
    vals = list(value)
    if vals == [0.0]:
        return True, ""
    if len(vals) != 3 or not all(math.isfinite(v) for v in vals):
        return False, (f"{name} needs 3 finite values, x, y, z in metres (or [0.0] for no "
                       f"box), got {vals}")
    return True, ""


def _check_state_names(name, value, settings):
    want = 8 if name == "state.joint_names" else 2
    if len(value) != want or not all(value) or len(set(value)) != want:
        return False, f"{name} needs {want} distinct non-empty names, got {list(value)}"
    return True, ""


def _check_instruction(name, value, settings):
    if "\x00" in value:
        return False, f"{name} contains a NUL character; use plain text"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return False, (f"{name} is not UTF-8 text ({exc.reason} at character {exc.start}: "
                       f"{value[exc.start]!r}); use plain text")
    return True, ""


#: One token of a ROS 2 topic name: letters, digits and '_', not starting with a digit.
_TOPIC_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _check_topic(name, value, settings):
    """A ROS 2 topic name rclpy accepts (relative or absolute), checked at configure rather
    than failing at activate."""
    shown = f"{name}={value!r}"
    if not value.strip("/"):
        return False, f"{shown} is empty; give a topic name, e.g. 'camera/wrist/image'"
    bad = next((tok for tok in value.lstrip("/").split("/") if not _TOPIC_TOKEN.match(tok)),
               None)
    if bad is not None or value.endswith("/"):
        what = "an empty part ('//' or a trailing '/')" if not bad else f"the part {bad!r}"
        return False, (f"{shown} is not a valid ROS topic name ({what}); use letters, digits "
                       "and '_' between '/', not starting with a digit")
    return True, ""


def _check_frame(name, value, settings):
    if not value or value != value.strip() or value.startswith("/") or " " in value:
        return False, (f"{name}={value!r}: give a tf frame id such as 'base_link' (not empty, "
                       "no spaces, no leading '/')")
    return True, ""


def _check_transform(name, value, settings):
    vals = list(value)
    if len(vals) != 7 or not all(math.isfinite(v) for v in vals):
        return False, (f"{name} needs 7 finite numbers x, y, z, qx, qy, qz, qw, got {vals}; "
                       "identity is [0, 0, 0, 0, 0, 0, 1]")
    norm = math.sqrt(sum(v * v for v in vals[3:]))
    if abs(norm - 1.0) > 1e-3:
        return False, (f"{name}: the quaternion {vals[3:]} has norm {norm:.4f}; give a unit "
                       "quaternion (qx, qy, qz, qw)")
    return True, ""


def _check_finger_signs(name, value, settings):
    if len(value) != 2 or any(v not in (1.0, -1.0) for v in value):
        return False, (f"{name} needs 2 values, each 1.0 or -1.0 (LIBERO's (+q, -q) from a "
                       f"Franka's (+q, +q): [1.0, -1.0]), got {list(value)}")
    return True, ""


def _same_topics(settings: Settings) -> str:
    """Two inputs on one topic (e.g. both cameras) would feed one stream as both."""
    seen: dict[str, str] = {}
    for key in ("topics.image_primary", "topics.image_wrist", "topics.joint_states"):
        topic = "/".join(p for p in str(settings[key]).split("/") if p)
        if topic in seen:
            return (f"{key} and {seen[topic]} are both {settings[key]!r}; each input needs its "
                    "own topic (one camera would be fed as both)")
        seen[topic] = key
    return ""


_CHECKS = {
    "topics.image_primary": _check_topic,
    "topics.image_wrist": _check_topic,
    "topics.joint_states": _check_topic,
    "state.base_frame": _check_frame,
    "state.ee_frame": _check_frame,
    "variant": _check_variant,
    "backend": _check_backend,
    "trigger": _check_choice(TRIGGERS),
    "execution.start": _check_choice(START_MODES),
    "execution.blend": _check_choice(BLENDS),
    "execution.crossfade_ramp": _check_choice(RAMPS),
    "execution.action_type": _check_choice(ACTION_TYPES),
    "execution.inpaint_method": _check_choice(INPAINT_METHODS),
    "execution.inpaint_schedule": _check_choice(SCHEDULES),
    "state.source": _check_choice(STATE_SOURCES),
    "runtime.load_order": _check_choice(LOAD_ORDERS),
    "flip_images.primary": _check_choice(MOUNT_ROTATIONS),
    "flip_images.wrist": _check_choice(MOUNT_ROTATIONS),
    "action_names": _check_action_names,
    "action_min": _check_limit_list,
    "action_max": _check_limit_list,
    "max_step_delta": _check_limit_list,
    "safety.workspace_min": _check_workspace,
    "safety.workspace_max": _check_workspace,
    "safety.workspace_mode": _check_choice(WORKSPACE_MODES),
    "state.joint_names": _check_state_names,
    "state.gripper_joint_names": _check_state_names,
    "instruction": _check_instruction,
    "state.frame_transform": _check_transform,
    "state.quaternion_hemisphere": _check_choice(HEMISPHERES),
    "state.finger_signs": _check_finger_signs,
}


def validate_changes(changes: dict, settings: Settings) -> tuple[bool, str]:
    """Validate a batch of changes against the settings they would produce."""
    proposed = settings.with_changes(changes)
    for name, value in changes.items():
        ok, reason = validate_value(name, value, proposed)
        if not ok:
            return False, reason
    lo, hi, _ = proposed.limits()
    if lo and hi and any(a > b for a, b in zip(lo, hi)):
        return False, "action_min must be <= action_max in every dimension"
    box_lo, box_hi = (list(proposed[f"safety.workspace_{k}"]) for k in ("min", "max"))
    if box_lo != [0.0] and box_hi != [0.0] and any(a >= b for a, b in zip(box_lo, box_hi)):
        return False, (f"safety.workspace_min {box_lo} must be below safety.workspace_max "
                       f"{box_hi} in x, y and z")
    if any(k.startswith("topics.") for k in changes):
        same = _same_topics(proposed)
        if same:
            return False, same
    if proposed["state.source"] == "tf" and proposed["state.base_frame"] == \
            proposed["state.ee_frame"]:
        return False, (f"state.base_frame and state.ee_frame are both "
                       f"{proposed['state.ee_frame']!r}; the pose needs two frames")
    return True, ""


def apply_kind(changes: dict) -> str:
    """The heaviest way a batch of changes applies: configure > reload > live."""
    kinds = {PARAMS_BY_NAME[n].apply for n in changes if n in PARAMS_BY_NAME}
    for kind in (CONFIGURE, RELOAD, LIVE):
        if kind in kinds:
            return kind
    return LIVE


__all__ = [
    "PARAMS",
    "PARAMS_BY_NAME",
    "ParamSpec",
    "Settings",
    "apply_kind",
    "check_type",
    "validate_changes",
    "validate_value",
]
