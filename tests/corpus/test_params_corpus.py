"""Bad parameter values: each refused with one line naming the parameter and what is allowed."""

from __future__ import annotations

import pytest

from molmoact2_ros.control.params import PARAMS, Settings, validate_changes

pytestmark = pytest.mark.usefixtures("no_leaks")

CASES = [
    # (changes, words the one-line reason must contain)
    ({"flow_steps": "5"}, ["flow_steps='5'", "str", "an integer"]),
    ({"flow_steps": True}, ["flow_steps=True", "an integer"]),
    ({"flow_steps": 2.5}, ["flow_steps=2.5", "an integer"]),
    ({"flow_steps": -1}, ["flow_steps=-1", "out of range [0, 100]"]),
    ({"flow_steps": 101}, ["flow_steps=101", "out of range"]),
    ({"instruction": 5}, ["instruction=5", "a string"]),
    ({"instruction": None}, ["instruction=None", "a string"]),
    ({"instruction": "pick\x00up"}, ["instruction", "NUL"]),
    ({"state.joint_names": "abcdefgh"}, ["state.joint_names='abcdefgh'", "a list of strings"]),
    ({"state.joint_names": ["a"] * 8}, ["state.joint_names", "8 distinct"]),
    ({"state.joint_names": list("abcdefg")}, ["state.joint_names", "8 distinct"]),
    ({"state.joint_names": [1, 2, 3, 4, 5, 6, 7, 8]}, ["state.joint_names", "list of strings"]),
    ({"state.gripper_joint_names": "ab"}, ["state.gripper_joint_names", "list of strings"]),
    ({"state.gripper_joint_names": ["f", ""]}, ["state.gripper_joint_names", "non-empty"]),
    ({"action_names": "xyzrpyg"}, ["action_names", "list of strings"]),
    ({"action_names": list("xyzrpy")}, ["action_names", "7 distinct"]),
    ({"action_min": [0.1, 0.2, 0.3]}, ["action_min", "7 finite values"]),
    ({"action_min": [float("nan")] * 7}, ["action_min", "7 finite values"]),
    ({"action_max": ["1"] * 7}, ["action_max", "a list of numbers"]),
    ({"action_min": [1.0] * 7, "action_max": [0.5] * 7}, ["action_min must be <= action_max"]),
    ({"max_step_delta": [0.0] * 7}, ["max_step_delta", "> 0"]),
    ({"execution.action_type": "velocity"}, ["execution.action_type='velocity'", "delta"]),
    ({"execution.delta_scale": [0.05]}, ["execution.delta_scale", "2 positive finite"]),
    ({"execution.delta_scale": [0.05, -0.5]}, ["execution.delta_scale", "positive"]),
    ({"execution.delta_scale": "0.05"}, ["execution.delta_scale", "a list of numbers"]),
    ({"execution.inpaint_method": "rtc"}, ["execution.inpaint_method='rtc'", "pigdm"]),
    ({"execution.inpaint_schedule": "cosine"}, ["execution.inpaint_schedule", "exp"]),
    ({"execution.inpaint_beta": -1.0}, ["execution.inpaint_beta=-1.0", "out of range"]),
    ({"rate_hz": "2"}, ["rate_hz='2'", "a number"]),
    ({"rate_hz": 0.0}, ["rate_hz=0.0", "out of range [0.01, 100.0]"]),
    ({"rate_hz": float("nan")}, ["rate_hz=nan", "out of range"]),
    ({"control_period_s": float("inf")}, ["control_period_s=inf", "out of range"]),
    ({"max_observation_age_s": -1.0}, ["max_observation_age_s=-1.0", "out of range"]),
    ({"max_future_stamp_s": -0.1}, ["max_future_stamp_s=-0.1", "out of range"]),
    ({"max_image_side_px": 0}, ["max_image_side_px=0", "out of range [16, 65535]"]),
    ({"max_image_side_px": "4096"}, ["max_image_side_px='4096'", "an integer"]),
    ({"seed": 1.5}, ["seed=1.5", "an integer"]),
    ({"seed": -2}, ["seed=-2", "out of range"]),
    ({"compressed_images": "false"}, ["compressed_images='false'", "a boolean"]),
    ({"flip_images.primary": True}, ["flip_images.primary=True", "a string"]),
    ({"flip_images.wrist": "upside"}, ["flip_images.wrist='upside'", "none, 180, vflip, hflip"]),
    ({"sync.queue_size": 0}, ["sync.queue_size=0", "out of range [1, 1000]"]),
    ({"sync.slop_s": "0.05"}, ["sync.slop_s='0.05'", "a number"]),
    ({"variant": "huge"}, ["unknown variant 'huge'", "grid_sampler"]),
    ({"variant": 5}, ["variant=5", "a string"]),
    ({"backend": "gpu"}, ["unknown backend 'gpu'", "onnx"]),
    ({"trigger": "sometimes"}, ["trigger='sometimes'", "on_observation"]),
    ({"state.source": "imu"}, ["state.source='imu'", "joint_state, tf"]),
    ({"state.frame_transform": [0.0, 0.0, 0.0]}, ["state.frame_transform", "7 finite numbers"]),
    ({"state.frame_transform": [0.0] * 7}, ["state.frame_transform", "unit quaternion"]),
    ({"state.frame_transform": "identity"}, ["frame_transform='identity'", "list of numbers"]),
    ({"state.quaternion_hemisphere": "up"}, ["quaternion_hemisphere='up'", "nearest_stats"]),
    ({"state.finger_signs": [1.0, 2.0]}, ["state.finger_signs", "1.0 or -1.0"]),
    ({"state.finger_signs": [1.0]}, ["state.finger_signs", "2 values"]),
    ({"context_suffix.llm": "../x"}, ["context_suffix.llm='../x'", "'_w4a16'"]),
    ({"context_suffix.vision": 4}, ["context_suffix.vision=4", "a string"]),
    ({"bundle.fused": "x" * 5000}, ["bundle.fused", "not a usable folder path", "too long"]),
    ({"bundle.fused": "a\x00b"}, ["bundle.fused", "not a usable folder path"]),
    ({"bundle.fused": "/nonexistent/molmoact2"}, ["bundle.fused", "does not exist"]),
    ({"topics.joint_states": ["a"]}, ["topics.joint_states", "a string"]),
    # names checked at configure, not at activate (or never)
    ({"topics.image_wrist": ""}, ["topics.image_wrist=''", "is empty"]),
    ({"topics.image_wrist": "/"}, ["topics.image_wrist='/'", "is empty"]),
    ({"topics.image_primary": "camera/1st/image"}, ["not a valid ROS topic name", "'1st'"]),
    ({"topics.image_primary": "camera//image"}, ["not a valid ROS topic name", "empty part"]),
    ({"topics.joint_states": "joint states"}, ["topics.joint_states", "'joint states'"]),
    ({"topics.joint_states": "joints/"}, ["topics.joint_states", "trailing"]),
    ({"topics.image_wrist": "camera/agentview/image"},
     ["topics.image_wrist and topics.image_primary are both", "own topic"]),
    ({"topics.image_wrist": "/camera/agentview/image/"}, ["not a valid ROS topic name"]),
    ({"topics.image_primary": "cam", "topics.image_wrist": "/cam"}, ["are both"]),
    ({"state.base_frame": ""}, ["state.base_frame=''", "tf frame id"]),
    ({"state.ee_frame": " ee"}, ["state.ee_frame", "no spaces"]),
    ({"state.ee_frame": "/ee_link"}, ["state.ee_frame", "leading '/'"]),
    ({"state.source": "tf", "state.ee_frame": "base_link"}, ["both 'base_link'"]),
    ({"runtime.release_on_exit": "yes"}, ["runtime.release_on_exit", "a boolean"]),
    ({"autostart": "true"}, ["autostart", "a boolean"]),
    ({"runtime.call_timeout_s": "5"}, ["runtime.call_timeout_s", "a number"]),
    ({"runtime.call_timeout_s": 0.0}, ["runtime.call_timeout_s", "out of range"]),
    ({"runtime.load_order": "random"}, ["runtime.load_order", "parallel, sequential"]),
    ({"runtime.state_dir": 3}, ["runtime.state_dir", "a string"]),
    ({"runtime.bundle_libs": "no"}, ["runtime.bundle_libs", "a boolean"]),
    ({"execution.start": "later"}, ["execution.start", "observation, receipt"]),
    ({"execution.blend": 1}, ["execution.blend", "a string"]),
    ({"execution.blend": "smooth"}, ["execution.blend", "crossfade, ensemble, inpaint"]),
    ({"execution.overlap_s": "0.2"}, ["execution.overlap_s", "a number"]),
    ({"execution.crossfade_ramp": "cubic"}, ["execution.crossfade_ramp", "linear, cosine"]),
    ({"execution.ensemble_decay": -0.1}, ["execution.ensemble_decay", "out of range"]),
    ({"context_suffix.action_context": "w4a16"}, ["context_suffix.action_context"]),
    # what reaches the arm: a scale no arm moves by, a gripper not a dimension, a box inside out
    ({"execution.delta_scale": [1e300, 1e300]}, ["execution.delta_scale", "at most [0.05, 0.5]"]),
    ({"execution.delta_scale": [1000.0, 100.0]}, ["execution.delta_scale", "at most"]),
    ({"execution.delta_scale": [0.06, 0.11]}, ["execution.delta_scale", "at most"]),
    ({"execution.delta_scale": [0.0125, 0.6]}, ["execution.delta_scale", "at most"]),
    ({"execution.gripper_dim": 7}, ["execution.gripper_dim=7", "out of range [-1, 6]"]),
    ({"execution.gripper_dim": "6"}, ["execution.gripper_dim='6'", "an integer"]),
    ({"safety.workspace_min": [0.0, 0.0]}, ["safety.workspace_min", "3 finite values"]),
    ({"safety.workspace_max": [float("inf")] * 3}, ["safety.workspace_max", "3 finite"]),
    ({"safety.workspace_min": [0.5, 0.0, 0.0], "safety.workspace_max": [0.4, 1.0, 1.0]},
     ["safety.workspace_min", "must be below safety.workspace_max"]),
    ({"safety.workspace_mode": "stop"}, ["safety.workspace_mode='stop'", "clamp, hold"]),
    ({"safety.sanity_state_abs": 0.0}, ["safety.sanity_state_abs=0.0", "out of range"]),
    ({"safety.sanity_target_abs": float("inf")}, ["safety.sanity_target_abs=inf", "range"]),
]


@pytest.mark.parametrize("changes,words", CASES, ids=[repr(c)[:60] for c, _ in CASES])
def test_bad_parameter_is_refused_in_one_line(changes, words, tmp_path):
    settings = Settings().with_changes({"bundle.grid_sampler": str(tmp_path)})
    ok, reason = validate_changes(changes, settings)
    assert not ok
    assert "\n" not in reason and len(reason) < 400, reason
    for word in words:
        assert word in reason, (word, reason)


def test_every_parameter_has_a_type_case():
    covered = {name for changes, _ in CASES for name in changes}
    typed = {p.name for p in PARAMS if not p.name.startswith(("bundle.", "topics.", "state.b",
                                                               "state.e", "context_suffix.a"))}
    assert typed - covered <= {"bundle.grid_sampler", "bundle.lp_vtp_sd"}, typed - covered


def test_defaults_and_good_values_pass(tmp_path):
    settings = Settings().with_changes({"bundle.grid_sampler": str(tmp_path)})
    good = {"flow_steps": 5, "instruction": "put the bowl on the plate", "rate_hz": 2,
            "state.joint_names": [f"j{i}" for i in range(8)], "max_image_side_px": 1024,
            "compressed_images": True, "action_min": [0.0]}
    assert validate_changes(good, settings) == (True, "")
