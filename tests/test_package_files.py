"""Package files agree with the code: parameter file, message definition, package manifest."""

from __future__ import annotations

import ast
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from molmoact2_ros.control.params import PARAMS

ROOT = Path(__file__).resolve().parents[1]


def _yaml_params(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ {4}([\w.]+): (.+)$", path.read_text(), flags=re.MULTILINE))


def test_policy_yaml_documents_every_parameter_with_its_default():
    values = _yaml_params(ROOT / "config" / "policy.yaml")
    assert list(values) == [p.name for p in PARAMS]
    for p in PARAMS:
        text = values[p.name].split("#")[0].strip()
        parsed = json.loads(text)
        assert parsed == p.default, p.name
    comments = (ROOT / "config" / "policy.yaml").read_text().count("    # ")
    assert comments >= len(PARAMS)


def test_variant_files_only_set_known_parameters():
    names = {p.name for p in PARAMS}
    for variant in ("grid_sampler", "lp_vtp_sd", "fused"):
        values = _yaml_params(ROOT / "config" / f"{variant}.yaml")
        assert set(values) <= names and values["variant"].split("#")[0].strip() == f'"{variant}"'


def test_action_chunk_message_fields_match_the_published_mapping():
    import numpy as np

    from molmoact2_ros.control.controller import Published, chunk_message_fields
    from molmoact2_ros.control.params import Settings
    from molmoact2_ros.control.safety import SafetyReport
    from molmoact2_ros.policy import ActionChunk

    fields = [line.split()[1] for line in (ROOT / "msg" / "ActionChunk.msg").read_text()
              .splitlines() if line.strip() and not line.startswith("#")]
    actions = np.arange(70, dtype=np.float32).reshape(10, 7)
    chunk = ActionChunk(actions, actions, "lp_vtp_sd", 2, 5 * 10**9 + 7, "task", {})
    out = Published(chunk, actions, 3, SafetyReport(), Settings(), 100, 100 + 2 * 10**6)
    mapped = chunk_message_fields(out)
    assert set(fields) == (set(mapped) - {"stamp_ns", "period_ns", "inference_latency_ns",
                                          "start_stamp_ns"}
                           | {"header", "period", "inference_latency", "start_stamp"})
    assert mapped["stamp_ns"] == 5 * 10**9 + 7 and mapped["period_ns"] == 50_000_000
    assert mapped["inference_latency_ns"] == 2 * 10**6 and mapped["horizon"] == 10
    np.testing.assert_array_equal(mapped["actions"], np.arange(70))


def test_package_xml_is_ament_cmake_with_interfaces():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3"
    assert root.find("export/build_type").text == "ament_cmake"
    assert root.find("member_of_group").text == "rosidl_interface_packages"
    deps = {e.text for e in root if e.tag.endswith("depend")}
    assert {"rclpy", "sensor_msgs", "trajectory_msgs", "cv_bridge", "diagnostic_updater",
            "rosidl_default_generators", "rosidl_default_runtime"} <= deps
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert '"msg/ActionChunk.msg"' in cmake and "ament_python_install_package(" not in cmake


def test_launch_file_declares_the_documented_arguments():
    tree = ast.parse((ROOT / "launch" / "policy.launch.py").read_text())
    declared = {node.args[0].value for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") ==
                "DeclareLaunchArgument" and isinstance(node.args[0], ast.Constant)}
    assert {"namespace", "variant", "backend", "bundle_root", "params_file", "autostart",
            "use_sim_time", "instruction", "respawn", "respawn_delay"} <= declared


def test_the_libero_workspace_example_is_valid_and_holds_libero_start_poses():
    from molmoact2_ros.control.params import Settings, validate_changes

    values = {k: json.loads(v.split("#")[0]) for k, v in
              _yaml_params(ROOT / "config" / "libero_workspace.yaml").items()}
    assert validate_changes(values, Settings()) == (True, "")
    lo, hi = Settings().with_changes(values).workspace()
    # the end effector's start in libero_spatial and libero_goal task 0 (measured)
    for start in ([-0.211, -0.011, 1.174], [-0.217, 0.009, 1.171]):
        assert all(a < x < b for a, x, b in zip(lo, start, hi))


#: parameters the shipped files may set that belong to ROS, not to the node's table
ROS_OWN = {"use_sim_time", "diagnostic_updater.period"}


def _example(name: str) -> dict:
    """A shipped parameter file's settings, typed as JSON, each checked to have a comment."""
    path = ROOT / "config" / name
    lines = path.read_text().splitlines()
    settings = {}
    for line in lines:
        found = re.match(r"^ {4}([\w.]+): (.+)$", line)
        if found:
            settings[found.group(1)] = json.loads(found.group(2).split("#")[0].strip())
    return settings


def test_example_parameter_files_pass_the_parameter_table():
    """config/libero_dds.yaml and config/robot_example.yaml set only known parameters, with
    values the node accepts, and say why in comments."""
    from molmoact2_ros.control.params import PARAMS_BY_NAME, Settings, validate_changes

    for name in ("libero_dds.yaml", "robot_example.yaml"):
        settings = _example(name)
        assert settings, name
        unknown = set(settings) - set(PARAMS_BY_NAME) - ROS_OWN
        assert unknown == set(), f"{name}: not node parameters: {unknown}"
        ours = {k: v for k, v in settings.items() if k in PARAMS_BY_NAME}
        ok, reason = validate_changes(ours, Settings())
        assert ok, f"{name}: {reason}"
        text = (ROOT / "config" / name).read_text()
        assert text.count("    # ") >= len(settings) // 2, f"{name}: comment the settings"


def test_robot_example_sets_topics_state_frame_and_safety_bounds():
    settings = _example("robot_example.yaml")
    assert {"topics.image_primary", "topics.image_wrist", "topics.joint_states"} <= set(settings)
    assert settings["state.source"] == "tf"
    assert settings["state.base_frame"] != settings["state.ee_frame"]
    for key in ("action_min", "action_max", "max_step_delta"):
        assert len(settings[key]) == len(settings["action_names"]) == 7, key
    assert len(settings["safety.workspace_min"]) == len(settings["safety.workspace_max"]) == 3


def test_libero_dds_file_gives_the_node_what_the_launch_file_gives_it():
    """With policy:=false the node runs elsewhere: the shipped file sets every override
    libero.launch.py sets when it starts the node itself (the bundle, backend and variant come
    from the node's own launch arguments)."""
    tree = ast.parse((ROOT / "launch" / "libero.launch.py").read_text())
    overrides = next(node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     and getattr(node.targets[0], "id", "") == "overrides")
    keys = {k.value: v for k, v in zip(overrides.keys, overrides.values)}
    settings = _example("libero_dds.yaml")
    assert set(keys) - {"backend", "variant"} <= set(settings)
    for key, value in keys.items():
        if isinstance(value, ast.Constant):
            assert settings[key] == value.value, key
    assert settings["trigger"] == "on_observation"  # lockstep and latency modes
