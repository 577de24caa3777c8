"""Replay a bag through the policy node under ROS and check every chunk against a golden.

    ros2 launch molmoact2_ros replay.launch.py bag:=obs_bag golden:=golden_bag \
        bundle_root:=/data/molmoact2 backend:=htp

Runs the policy node (use_sim_time, on_observation trigger; variant, instruction, seed, flow
steps and compressed_images from the golden unless given), starts ``ros2 bag play --clock``
once the node is active, and a checker node that matches ~/action_chunk with the golden by
stamp. The launch ends when the checker does and exits non-zero when the check fails.
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
    ExecuteProcess,
    LogInfo,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration

import launch

VARIANTS = ("grid_sampler", "lp_vtp_sd", "fused")
NODE_NAME = "molmoact2_policy"


def _arguments():
    share = get_package_share_directory("molmoact2_ros")
    return [
        DeclareLaunchArgument("bag", description="rosbag2 with the camera and joint topics"),
        DeclareLaunchArgument("golden", description="chunk bag from `molmoact2 replay --record`"),
        DeclareLaunchArgument("bundle_root", description="folder with one folder per variant"),
        DeclareLaunchArgument("backend", default_value="htp", description="htp | onnx"),
        DeclareLaunchArgument("variant", default_value="", description="default: the golden's"),
        DeclareLaunchArgument("instruction", default_value="",
                              description="default: the golden's"),
        DeclareLaunchArgument("seed", default_value="", description="default: the golden's"),
        DeclareLaunchArgument("flow_steps", default_value="",
                              description="default: the golden's"),
        DeclareLaunchArgument("base_params_file",
                              default_value=os.path.join(share, "config", "policy.yaml")),
        DeclareLaunchArgument("rate", default_value="1.0",
                              description="ros2 bag play --rate (lower it when inference is "
                              "slower than the camera)"),
        DeclareLaunchArgument("min_produced", default_value="0.5",
                              description="fraction of golden chunks live play must produce"),
        DeclareLaunchArgument("idle_timeout_s", default_value="15.0",
                              description="the run is over after this long without a chunk"),
        DeclareLaunchArgument("min_cosine", default_value="-1.0",
                              description="per-chunk tolerance (-1: fp16 for htp, fp32 onnx)"),
    ]


def _launch(context):
    from molmoact2_ros.replay.chunkbag import read_chunk_bag

    def arg(name):
        return LaunchConfiguration(name).perform(context)

    golden = read_chunk_bag(arg("golden")).settings
    backend = arg("backend")
    overrides = {"use_sim_time": True, "trigger": "on_observation", "backend": backend}
    for name, kind in (("variant", str), ("instruction", str), ("seed", int),
                       ("flow_steps", int)):
        value = arg(name)
        if value:
            overrides[name] = kind(value)
        elif name in golden:
            overrides[name] = kind(golden[name])
    if "compressed_images" in golden:
        overrides["compressed_images"] = bool(golden["compressed_images"])
    for v in VARIANTS:
        if os.path.isdir(os.path.join(arg("bundle_root"), v)):
            overrides[f"bundle.{v}"] = os.path.join(arg("bundle_root"), v)
    node = launch_ros.actions.LifecycleNode(
        package="molmoact2_ros", executable="policy_node", name=NODE_NAME, namespace="",
        parameters=[arg("base_params_file"), overrides], output="screen", emulate_tty=True)
    checker = launch_ros.actions.Node(
        package="molmoact2_ros", executable="replay_checker", name="molmoact2_replay_checker",
        parameters=[{"golden": arg("golden"), "backend": backend,
                     "chunk_topic": f"/{NODE_NAME}/action_chunk",
                     "min_produced": float(arg("min_produced")),
                     "idle_timeout_s": float(arg("idle_timeout_s")),
                     "min_cosine": float(arg("min_cosine"))}],
        output="screen", emulate_tty=True)
    play = ExecuteProcess(cmd=["ros2", "bag", "play", arg("bag"), "--rate", arg("rate"),
                               "--clock"], output="screen")

    def change(transition):
        return EmitEvent(event=launch_ros.events.lifecycle.ChangeState(
            lifecycle_node_matcher=launch.events.matches_action(node), transition_id=transition))

    def on_checker_exit(event, context):
        if event.returncode != 0:
            # launch returns non-zero when an event handler raises: the check's verdict
            raise RuntimeError(f"replay check failed (checker exit status {event.returncode})")
        return [LogInfo(msg="replay check passed"), EmitEvent(event=Shutdown(
            reason="replay check passed"))]

    T = lifecycle_msgs.msg.Transition
    return [
        node, checker,
        RegisterEventHandler(launch_ros.event_handlers.OnStateTransition(
            target_lifecycle_node=node, start_state="configuring", goal_state="inactive",
            entities=[change(T.TRANSITION_ACTIVATE)])),
        RegisterEventHandler(launch_ros.event_handlers.OnStateTransition(
            target_lifecycle_node=node, start_state="activating", goal_state="active",
            entities=[LogInfo(msg="policy active; playing the bag"), play])),
        RegisterEventHandler(OnProcessExit(target_action=checker, on_exit=on_checker_exit)),
        change(T.TRANSITION_CONFIGURE),
    ]


def generate_launch_description():
    return launch.LaunchDescription([*_arguments(), OpaqueFunction(function=_launch)])
