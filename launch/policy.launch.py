"""Launch the MolmoAct2 policy lifecycle node; optionally configure and activate it.

    ros2 launch molmoact2_ros policy.launch.py bundle_root:=/data/molmoact2 variant:=grid_sampler

Autostart uses lifecycle events (configure on process start, activate on reaching
inactive), which works on Humble and Jazzy alike. With ``respawn:=true`` a node process that
dies is started again after ``respawn_delay`` seconds and, with autostart, configures and
activates itself (the node's ``autostart`` parameter), as Nav2's lifecycle manager brings a
restarted node back up: a ChangeState request from here could reach the dead process's
service, still discovered, and never be answered.
"""

import os

import launch.events
import launch_ros.actions
import launch_ros.event_handlers
import launch_ros.events.lifecycle
import lifecycle_msgs.msg
from ament_index_python.packages import get_package_share_directory
from launch.actions import (
    DeclareLaunchArgument,
    EmitEvent,
    LogInfo,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.event_handlers import OnProcessStart
from launch.substitutions import LaunchConfiguration

import launch

VARIANTS = ("grid_sampler", "lp_vtp_sd", "fused")
TRUE = ("true", "1", "yes", "on")


def _arguments():
    share = get_package_share_directory("molmoact2_ros")
    args = [
        DeclareLaunchArgument("namespace", default_value="", description="node namespace"),
        DeclareLaunchArgument("node_name", default_value="molmoact2_policy"),
        DeclareLaunchArgument("variant", default_value="",
                              description="grid_sampler | lp_vtp_sd | fused (empty: from files)"),
        DeclareLaunchArgument("backend", default_value="",
                              description="htp | onnx (empty: from files, default htp)"),
        DeclareLaunchArgument("bundle_root", default_value="",
                              description="folder with one sub-folder per variant bundle"),
        DeclareLaunchArgument("base_params_file",
                              default_value=os.path.join(share, "config", "policy.yaml"),
                              description="defaults of every parameter (config/policy.yaml)"),
        DeclareLaunchArgument("params_file", default_value="",
                              description="extra parameter file loaded after the base one, "
                              "e.g. config/lp_vtp_sd.yaml or your robot's file"),
        DeclareLaunchArgument("instruction", default_value="",
                              description="task instruction (empty keeps the params file value)"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="configure and activate on launch"),
        DeclareLaunchArgument("respawn", default_value="false",
                              description="start the node process again if it dies"),
        DeclareLaunchArgument("respawn_delay", default_value="3.0",
                              description="seconds before a dead node process is started again"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="true for rosbag replay with --clock"),
        DeclareLaunchArgument("log_level", default_value="info"),
    ]
    for v in VARIANTS:
        args.append(DeclareLaunchArgument(f"bundle_{v}", default_value="",
                                          description=f"folder of the {v} bundle"))
    return args


def _bundle_paths(root):
    """bundle.<variant> for a root of variant folders or one variant's folder, resolved as
    every molmoact2 command does; where that fails, the node's configure says why."""
    fallback = {f"bundle.{v}": os.path.join(root, v) for v in VARIANTS}
    try:
        from molmoact2_ros.bundle.bundle import bundle_parameters
        from molmoact2_ros.errors import MolmoActError
    except ImportError:
        return fallback
    try:
        return bundle_parameters(root)
    except MolmoActError:
        return fallback


def _launch(context):
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    respawn = arg("respawn").lower() in TRUE
    autostart = arg("autostart").lower() in TRUE
    # With respawn the node starts itself: a ChangeState request sent when a respawned
    # process starts can reach the dead process's service, still discovered, and hang.
    overrides = {"use_sim_time": arg("use_sim_time").lower() in TRUE,
                 "autostart": respawn and autostart}
    for name in ("variant", "backend", "instruction"):
        if arg(name):
            overrides[name] = arg(name)
    found = _bundle_paths(arg("bundle_root")) if arg("bundle_root") else {}
    for v in VARIANTS:
        path = arg(f"bundle_{v}") or found.get(f"bundle.{v}", "")
        if path:
            overrides[f"bundle.{v}"] = path
    node = launch_ros.actions.LifecycleNode(
        package="molmoact2_ros",
        executable="policy_node",
        name=arg("node_name"),
        namespace=arg("namespace"),
        parameters=[p for p in (arg("base_params_file"), arg("params_file")) if p] + [overrides],
        arguments=["--ros-args", "--log-level", arg("log_level")],
        output="screen",
        emulate_tty=True,
        respawn=respawn,
        respawn_delay=float(arg("respawn_delay")),
    )
    actions = [node]
    if autostart and not respawn:
        configure = EmitEvent(event=launch_ros.events.lifecycle.ChangeState(
            lifecycle_node_matcher=launch.events.matches_action(node),
            transition_id=lifecycle_msgs.msg.Transition.TRANSITION_CONFIGURE))
        activate = RegisterEventHandler(launch_ros.event_handlers.OnStateTransition(
            target_lifecycle_node=node, start_state="configuring", goal_state="inactive",
            entities=[
                LogInfo(msg="molmoact2 policy configured; activating"),
                EmitEvent(event=launch_ros.events.lifecycle.ChangeState(
                    lifecycle_node_matcher=launch.events.matches_action(node),
                    transition_id=lifecycle_msgs.msg.Transition.TRANSITION_ACTIVATE)),
            ]))
        # When the process starts: configure, then the handler above activates once it
        # reaches inactive.
        on_start = RegisterEventHandler(OnProcessStart(
            target_action=node,
            on_start=[LogInfo(msg="molmoact2 policy process started; configuring"), configure]))
        actions += [activate, on_start]
    return actions


def generate_launch_description():
    return launch.LaunchDescription([*_arguments(), OpaqueFunction(function=_launch)])
