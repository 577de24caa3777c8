"""Evaluate the policy node in closed loop on LIBERO: the sim node and the policy node.

    ros2 launch molmoact2_ros libero.launch.py suite:=libero_spatial tasks:=0,1 episodes:=2 \
        bundle_root:=/data/molmoact2 variant:=grid_sampler backend:=onnx time_mode:=lockstep

Starts the policy node (use_sim_time; trigger on_observation in lockstep and latency modes, in
which the sim asks for each chunk; chunk_consumed in realtime), configures and activates it,
and the ``libero_sim`` node, which sets the instruction per task, runs the episodes and writes
``out``. The launch ends when the sim node does, with its status (0: every episode done).
Leave out the policy node (``policy:=false``) when it runs elsewhere, e.g. on the board.
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
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration

import launch

VARIANTS = ("grid_sampler", "lp_vtp_sd", "fused")
NODE_NAME = "molmoact2_policy"
TRUE = ("true", "1", "yes", "on")


def _arguments():
    share = get_package_share_directory("molmoact2_ros")
    return [
        DeclareLaunchArgument("suite", default_value="libero_spatial",
                              description="libero_spatial | libero_object | libero_goal | "
                              "libero_10 | libero_90"),
        DeclareLaunchArgument("protocol", default_value="published",
                              description="published (LeRobot's evaluation: every row of a "
                              "chunk, the suite's steps, 360 px, per-episode seeds) | node (the "
                              "node's execution.overlap_s)"),
        DeclareLaunchArgument("render_size", default_value="0",
                              description="camera renders in px (0: 360, LeRobot's)"),
        DeclareLaunchArgument("tasks", default_value="", description="e.g. 0,3 (empty: all)"),
        DeclareLaunchArgument("episodes", default_value="50",
                              description="episodes per task, one per init state"),
        DeclareLaunchArgument("first_init", default_value="0"),
        DeclareLaunchArgument("max_steps", default_value="0",
                              description="policy steps per episode (0: the suite's)"),
        DeclareLaunchArgument("settle_steps", default_value="50",
                              description="zero-action steps first (LeRobot 50, OpenVLA 10)"),
        DeclareLaunchArgument("time_mode", default_value="lockstep",
                              description="lockstep | latency | realtime"),
        DeclareLaunchArgument("latency_ms", default_value="0.0",
                              description="latency mode: fixed chunk latency (0: measured)"),
        DeclareLaunchArgument("image_rotation", default_value="180",
                              description="180 (as the training data) | vflip | none"),
        DeclareLaunchArgument("out", default_value="libero_results",
                              description="results folder (an existing ledger resumes)"),
        DeclareLaunchArgument("video", default_value="all", description="all | failures | none"),
        DeclareLaunchArgument("seed", default_value="1000",
                              description="run seed: each episode's env and noise seeds "
                              "derive from (suite, task, init, seed)"),
        DeclareLaunchArgument("policy", default_value="true",
                              description="start the policy node here (false: it runs "
                              "elsewhere, e.g. on the board over DDS)"),
        DeclareLaunchArgument("bundle_root", default_value="",
                              description="folder with one folder per variant"),
        DeclareLaunchArgument("variant", default_value="grid_sampler"),
        DeclareLaunchArgument("backend", default_value="onnx", description="htp | onnx"),
        DeclareLaunchArgument("base_params_file",
                              default_value=os.path.join(share, "config", "policy.yaml")),
        DeclareLaunchArgument("active_timeout_s", default_value="300.0",
                              description="the sim gives up when the policy node is not "
                              "active by then"),
        DeclareLaunchArgument("chunk_timeout_s", default_value="120.0",
                              description="how long the sim waits for an observation's chunk "
                              "before it counts a chunk_timeout drop"),
        DeclareLaunchArgument("republish_s", default_value="10.0",
                              description="the sim publishes the images again after this long "
                              "without their chunk (sensor-data QoS may lose one)"),
        DeclareLaunchArgument("policy_node", default_value=NODE_NAME,
                              description="the policy node's name, with its namespace if any "
                              "(e.g. robot/molmoact2_policy when it runs elsewhere)"),
        DeclareLaunchArgument("compressed_images", default_value="false",
                              description="cameras as sensor_msgs/CompressedImage on "
                              "<topic>/compressed (both nodes)"),
        DeclareLaunchArgument("compressed_format", default_value="jpeg",
                              description="jpeg | png (compressed_images:=true)"),
        DeclareLaunchArgument("diagnostics_period_s", default_value="0.25",
                              description="the policy node's /diagnostics period in sim time; "
                              "the sim keeps the worst status per episode"),
    ]


def _launch(context):
    def arg(name):
        return LaunchConfiguration(name).perform(context)

    mode = arg("time_mode")
    compressed = arg("compressed_images").lower() in TRUE
    policy_node = arg("policy_node").strip("/") or NODE_NAME
    sim = launch_ros.actions.Node(
        package="molmoact2_ros", executable="libero_sim", name="molmoact2_libero_sim",
        parameters=[{
            "suite": arg("suite"), "tasks": arg("tasks"), "episodes": int(arg("episodes")),
            "first_init": int(arg("first_init")), "max_steps": int(arg("max_steps")),
            "settle_steps": int(arg("settle_steps")), "time_mode": mode,
            "latency_ms": float(arg("latency_ms")), "image_rotation": arg("image_rotation"),
            "out": os.path.abspath(arg("out")) if arg("out").strip() else "",
            "video": arg("video"), "seed": int(arg("seed")),
            "protocol": arg("protocol"), "render_size": int(arg("render_size")),
            "variant": arg("variant"), "bundle_root": arg("bundle_root"),
            "policy_node": policy_node, "active_timeout_s": float(arg("active_timeout_s")),
            "chunk_timeout_s": float(arg("chunk_timeout_s")),
            "republish_s": float(arg("republish_s")),
            "compressed_images": compressed, "compressed_format": arg("compressed_format"),
        }],
        output="screen", emulate_tty=True)

    def on_sim_exit(event, context):
        if event.returncode != 0:
            raise RuntimeError(f"LIBERO evaluation failed (sim exit status {event.returncode})")
        return [LogInfo(msg="LIBERO evaluation complete"),
                EmitEvent(event=Shutdown(reason="LIBERO evaluation complete"))]

    actions = [sim, RegisterEventHandler(OnProcessExit(target_action=sim, on_exit=on_sim_exit))]
    if arg("policy").lower() not in TRUE:
        return actions
    overrides = {"use_sim_time": True, "backend": arg("backend"), "variant": arg("variant"),
                 "trigger": "chunk_consumed" if mode == "realtime" else "on_observation",
                 "seed": 7, "compressed_images": compressed,
                 "diagnostic_updater.period": float(arg("diagnostics_period_s"))}
    root = arg("bundle_root")
    for v in VARIANTS:
        if root and os.path.isdir(os.path.join(root, v)):
            overrides[f"bundle.{v}"] = os.path.join(root, v)
    if root and os.path.isfile(os.path.join(root, "bundle.json")):
        overrides[f"bundle.{arg('variant')}"] = root
    namespace, _, name = policy_node.rpartition("/")
    node = launch_ros.actions.LifecycleNode(
        package="molmoact2_ros", executable="policy_node", name=name, namespace=namespace,
        parameters=[arg("base_params_file"), overrides], output="screen", emulate_tty=True)

    def change(transition):
        return EmitEvent(event=launch_ros.events.lifecycle.ChangeState(
            lifecycle_node_matcher=launch.events.matches_action(node), transition_id=transition))

    T = lifecycle_msgs.msg.Transition
    return [
        node,
        RegisterEventHandler(launch_ros.event_handlers.OnStateTransition(
            target_lifecycle_node=node, start_state="configuring", goal_state="inactive",
            entities=[change(T.TRANSITION_ACTIVATE)])),
        change(T.TRANSITION_CONFIGURE),
        *actions,
    ]


def generate_launch_description():
    return launch.LaunchDescription([*_arguments(), OpaqueFunction(function=_launch)])
