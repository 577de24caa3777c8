"""The lifecycle node under a real rclpy (skipped where ROS 2 is absent).

Run on a ROS 2 machine from the colcon install, so that the generated ``molmoact2_ros.msg``
is importable: ``source install/setup.bash && pytest src/molmoact2_ros/tests``.
"""

from __future__ import annotations

import array
import threading
import time
import uuid

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
pytest.importorskip("molmoact2_ros.msg", reason="build with colcon and source install/setup.bash")

from launch_helpers import wait_for  # noqa: E402
from lifecycle_msgs.srv import GetState  # noqa: E402
from molmoact2_ros.msg import ActionChunk  # noqa: E402
from rcl_interfaces.srv import GetParameters, SetParameters  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.lifecycle import TransitionCallbackReturn  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data  # noqa: E402
from sensor_msgs.msg import Image, JointState  # noqa: E402
from trajectory_msgs.msg import JointTrajectory  # noqa: E402

from molmoact2_ros.bundle.golden import load_npz  # noqa: E402
from molmoact2_ros.control.params import PARAMS_BY_NAME  # noqa: E402
from molmoact2_ros.ros.policy_node import PolicyNode  # noqa: E402

SUCCESS = TransitionCallbackReturn.SUCCESS


@pytest.fixture(scope="module")
def rig(tiny_root):
    rclpy.init()
    ns = "t" + uuid.uuid4().hex[:8]
    trace = load_npz(tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz")
    overrides = [Parameter(f"bundle.{v}", value=str(tiny_root / v))
                 for v in ("grid_sampler", "lp_vtp_sd", "fused")]
    overrides += [Parameter("backend", value="onnx"),
                  Parameter("instruction", value=str(trace["instruction"])),
                  Parameter("max_observation_age_s", value=5.0),
                  # the tiny model on a loaded CPU can take longer than a 0.5 s chunk, which
                  # execution.start=observation would not publish; one test covers that mode
                  Parameter("execution.start", value="receipt")]
    node = PolicyNode(namespace=ns, parameter_overrides=overrides)
    tester = rclpy.create_node("tester", namespace=ns)
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    executor.add_node(tester)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    got = {"chunks": [], "trajs": []}
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    tester.create_subscription(ActionChunk, f"/{ns}/molmoact2_policy/action_chunk",
                               got["chunks"].append, reliable)
    tester.create_subscription(JointTrajectory, f"/{ns}/molmoact2_policy/trajectory",
                               got["trajs"].append, reliable)
    pubs = [tester.create_publisher(Image, t, qos_profile_sensor_data)
            for t in ("camera/agentview/image", "camera/wrist/image")]
    pubs.append(tester.create_publisher(JointState, "joint_states", qos_profile_sensor_data))

    def publish_observation():
        stamp = tester.get_clock().now().to_msg()
        for pub, img in zip(pubs[:2], (trace["image_primary"], trace["image_wrist"])):
            msg = Image(height=img.shape[0], width=img.shape[1], encoding="rgb8",
                        step=img.shape[1] * 3, data=array.array("B", img.tobytes()))
            msg.header.stamp = stamp
            pub.publish(msg)
        js = JointState(name=list(PARAMS_BY_NAME["state.joint_names"].default),
                        position=[float(x) for x in trace["state"]])
        js.header.stamp = stamp
        pubs[2].publish(js)

    def call(srv_type, name, request, timeout=10.0):
        client = tester.create_client(srv_type, f"/{ns}/molmoact2_policy/{name}")
        assert client.wait_for_service(timeout_sec=10.0)
        future = client.call_async(request)
        assert wait_for(future.done, timeout)
        tester.destroy_client(client)
        return future.result()

    def set_params(**values):
        req = SetParameters.Request(parameters=[Parameter(k.replace("__", "."), value=v)
                                                .to_parameter_msg() for k, v in values.items()])
        return call(SetParameters, "set_parameters", req).results

    yield node, got, publish_observation, call, set_params
    node.release()
    executor.shutdown()
    node.destroy_node()
    tester.destroy_node()
    rclpy.try_shutdown()


def _publish_until_chunk(rig, n_before, timeout=60.0):
    node, got, publish, *_ = rig
    deadline = time.time() + timeout
    while time.time() < deadline and len(got["chunks"]) <= n_before:
        publish()
        wait_for(lambda: len(got["chunks"]) > n_before, 2.0)
    return len(got["chunks"]) > n_before


def test_configure_activate_and_publish_both_outputs(rig, tiny_root):
    node, got, publish, call, _ = rig
    state = load_npz(tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz")["state"]
    assert node.trigger_configure() == SUCCESS
    assert node.trigger_activate() == SUCCESS
    assert _publish_until_chunk(rig, 0)
    assert wait_for(lambda: got["trajs"], 10)
    chunk, traj = got["chunks"][0], got["trajs"][0]
    assert chunk.variant == "grid_sampler" and chunk.horizon == 10 and chunk.action_dim == 7
    actions = np.asarray(chunk.actions, np.float32).reshape(10, 7)
    assert np.all(np.isfinite(actions)) and chunk.flow_steps == 10
    assert list(chunk.action_names) == list(PARAMS_BY_NAME["action_names"].default)
    assert len(traj.points) == 10 and list(traj.joint_names) == list(chunk.action_names)
    times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in traj.points]
    assert np.allclose(np.diff(times), 0.05) and times[0] == pytest.approx(0.05)
    # the tiny bundles are LIBERO-like (delta rows): the trajectory carries the end-effector
    # targets integrated from the observed state, 0.05 m per unit; the gripper as commanded
    assert chunk.action_type == "delta"
    positions = np.array([p.positions for p in traj.points])
    state = np.asarray(state, np.float32).astype(np.float64)
    unit_m = PARAMS_BY_NAME["execution.delta_scale"].default[0]  # metres per unit and step
    np.testing.assert_allclose(positions[:, :3], state[:3] + unit_m * np.cumsum(
        actions[:, :3].astype(np.float64), axis=0), atol=1e-5)
    np.testing.assert_allclose(positions[:, 6], actions[:, 6], atol=1e-6)
    # execution.start=receipt: zero header stamp (start when first sampled), nothing due yet
    assert (traj.header.stamp.sec, traj.header.stamp.nanosec) == (0, 0)
    start_ns = chunk.start_stamp.sec * 10**9 + chunk.start_stamp.nanosec
    assert start_ns > chunk.header.stamp.sec * 10**9 + chunk.header.stamp.nanosec
    assert chunk.first_future_index == 0


def test_observation_start_stamps_the_trajectory_with_the_observation(rig):
    """execution.start=observation: header stamp = observation stamp = start_stamp; a chunk of
    10 x 2 s outlasts any latency here, so it is published with its first future index."""
    node, got, publish, call, set_params = rig
    assert all(r.successful for r in set_params(execution__start="observation",
                                                    control_period_s=2.0))
    try:
        n_chunks, n_trajs = len(got["chunks"]), len(got["trajs"])
        assert _publish_until_chunk(rig, n_chunks)
        assert wait_for(lambda: len(got["trajs"]) > n_trajs, 10)
        chunk, traj = got["chunks"][-1], got["trajs"][-1]
        start = (chunk.start_stamp.sec, chunk.start_stamp.nanosec)
        assert (traj.header.stamp.sec, traj.header.stamp.nanosec) == start
        assert start == (chunk.header.stamp.sec, chunk.header.stamp.nanosec)
        assert 0 <= chunk.first_future_index < 10
        times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in traj.points]
        assert times[0] == pytest.approx(2.0) and np.allclose(np.diff(times), 2.0)
    finally:
        assert all(r.successful for r in set_params(execution__start="receipt",
                                                        control_period_s=0.05))


def test_parameters_good_and_bad(rig):
    node, got, publish, call, set_params = rig
    ok = set_params(flow_steps=4)[0]
    assert ok.successful and node.controller.policy.flow_steps == 4
    for values, fragment in (
        ({"variant": "huge"}, "unknown variant"),
        ({"flow_steps": 500}, "out of range"),  # rclpy enforces the declared range
        ({"instruction": "pick up the black bowl " * 12}, "shorten it"),
        ({"context_suffix__llm": "_w4a16"}, "quantised sets ship as HTP contexts only"),
        ({"backend": "gpu"}, "unknown backend"),
    ):
        result = set_params(**values)[0]
        assert not result.successful and fragment in result.reason, (values, result.reason)
    assert node.get_parameter("variant").value == "grid_sampler"
    assert set_params(flow_steps=0)[0].successful


def test_services_answer_while_inference_runs(rig):
    node, got, publish, call, set_params = rig
    assert set_params(flow_steps=100)[0].successful  # a slow chunk
    lock = node.controller._policy_lock
    n = len(got["chunks"])
    publish()
    if not wait_for(lock.locked, 10):
        pytest.skip("inference finished before the services could be called")
    state = call(GetState, "get_state", GetState.Request())
    params = call(GetParameters, "get_parameters", GetParameters.Request(names=["variant"]))
    changed = set_params(rate_hz=3.0)[0]
    busy = lock.locked()
    assert changed.successful
    assert state.current_state.label == "active" and params.values[0].string_value == "grid_sampler"
    assert busy, "services answered only after the chunk finished"
    assert wait_for(lambda: len(got["chunks"]) > n, 60)
    assert got["chunks"][-1].first_future_index == 0  # receipt: every action still ahead
    assert set_params(flow_steps=0)[0].successful


def test_switch_variant_live(rig):
    node, got, publish, call, set_params = rig
    assert set_params(variant="lp_vtp_sd")[0].successful
    assert wait_for(lambda: node.controller.settings["variant"] == "lp_vtp_sd"
                    and node.controller.policy is not None, 60)
    node.controller.wait_for_swap(60)
    n = len(got["chunks"])
    assert _publish_until_chunk(rig, n)
    assert got["chunks"][-1].variant == "lp_vtp_sd" and got["chunks"][-1].flow_steps == 2


def test_deactivate_and_cleanup_release_the_runtime(rig):
    node, got, publish, call, _ = rig
    assert node.trigger_deactivate() == SUCCESS
    n = len(got["chunks"])
    ns = node.get_namespace()  # inactive: the inputs are unsubscribed, so nothing can arrive
    inputs = [f"{ns}/camera/agentview/image", f"{ns}/camera/wrist/image", f"{ns}/joint_states"]
    assert wait_for(lambda: all(node.count_subscribers(t) == 0 for t in inputs), 30)
    publish()
    assert len(got["chunks"]) == n  # and nothing is published
    assert node.trigger_cleanup() == SUCCESS
    assert node.controller.policy is None
    assert call(GetState, "get_state", GetState.Request()).current_state.label == "unconfigured"


def test_configure_failure_is_reported_not_raised(rig):
    node, *_, set_params = rig
    assert set_params(variant="fused")[0].successful
    node.set_parameters([Parameter("bundle.fused", value=str(node.controller.settings
                                                               .bundle_path("grid_sampler")))])
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert node.controller.policy is None


def test_htp_backend_cleanup_leaves_no_worker(rig, tiny_root, monkeypatch):
    """With the HTP backend (the fake qai_appbuilder underneath) the six workers exist while
    configured and are gone after cleanup."""
    from htp_helpers import Snapshot, ensure_contexts, fake_env

    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    before = Snapshot.take()
    overrides = [Parameter("bundle.grid_sampler", value=str(tiny_root / "grid_sampler")),
                 Parameter("backend", value="htp"),
                 Parameter("instruction", value="put the bowl on the plate")]
    node = PolicyNode(namespace="htp" + uuid.uuid4().hex[:6], parameter_overrides=overrides)
    try:
        assert node.trigger_configure() == SUCCESS
        assert len(Snapshot.take().children - before.children) == 6
        assert node.trigger_activate() == SUCCESS
        assert node.trigger_deactivate() == SUCCESS
        assert node.trigger_cleanup() == SUCCESS
        assert Snapshot.take().leaks_since(before) == []
    finally:
        node.release()
        node.destroy_node()


def _fresh_node(tiny_root, **params):
    overrides = [Parameter(f"bundle.{v}", value=str(tiny_root / v))
                 for v in ("grid_sampler", "lp_vtp_sd", "fused")]
    overrides += [Parameter("backend", value="onnx"),
                  Parameter("instruction", value="put the bowl on the plate"),
                  Parameter("max_observation_age_s", value=5.0),
                  # the tiny model on a loaded CPU can take longer than a 0.5 s chunk, which
                  # execution.start=observation would not publish; one test covers that mode
                  Parameter("execution.start", value="receipt")]
    overrides += [Parameter(k.replace("__", "."), value=v) for k, v in params.items()]
    return PolicyNode(namespace="n" + uuid.uuid4().hex[:8], parameter_overrides=overrides)


def test_state_from_tf(rig, tiny_root):
    """state.source=tf: end-effector pose from TF plus the two finger joints."""
    from geometry_msgs.msg import TransformStamped
    from tf2_ros.static_transform_broadcaster import StaticTransformBroadcaster

    trace = load_npz(tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz")
    node = _fresh_node(tiny_root, state__source="tf")
    helper = rclpy.create_node("tf_helper", namespace=node.get_namespace())
    executor = MultiThreadedExecutor(num_threads=3)
    executor.add_node(node)
    executor.add_node(helper)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        tf = TransformStamped()
        tf.header.frame_id, tf.child_frame_id = "base_link", "ee_link"
        tf.transform.translation.x, tf.transform.translation.z = 0.1, 0.9
        tf.transform.rotation.w = 1.0
        StaticTransformBroadcaster(helper).sendTransform(tf)
        assert node.trigger_configure() == SUCCESS and node.trigger_activate() == SUCCESS
        pubs = [helper.create_publisher(Image, t, qos_profile_sensor_data)
                for t in ("camera/agentview/image", "camera/wrist/image")]
        joints = helper.create_publisher(JointState, "joint_states", qos_profile_sensor_data)

        def publish():
            stamp = helper.get_clock().now().to_msg()
            for pub, img in zip(pubs, (trace["image_primary"], trace["image_wrist"])):
                msg = Image(height=256, width=256, encoding="rgb8", step=768,
                            data=array.array("B", img.tobytes()))
                msg.header.stamp = stamp
                pub.publish(msg)
            js = JointState(name=["finger_left", "finger_right"], position=[0.03, -0.03])
            js.header.stamp = stamp
            joints.publish(js)

        def published():
            return node.controller.counts["published"] > 0

        deadline = time.time() + 30
        while not published() and time.time() < deadline:
            publish()
            wait_for(published, 1.0)
        assert published(), dict(node.controller.drops)
    finally:
        node.release()
        executor.shutdown()
        node.destroy_node()
        helper.destroy_node()


def test_cv_bridge_and_core_decoder_give_the_same_pixels():
    cv_bridge = pytest.importorskip("cv_bridge")
    from molmoact2_ros.host.images import decode_image

    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (7, 5, 3), dtype=np.uint8)
    bridge = cv_bridge.CvBridge()
    for encoding, data in (("rgb8", img), ("bgr8", img[..., ::-1])):
        msg = Image(height=7, width=5, encoding=encoding, step=15,
                    data=array.array("B", np.ascontiguousarray(data).tobytes()))
        ours = decode_image(msg.encoding, msg.height, msg.width, msg.step, msg.data)
        np.testing.assert_array_equal(np.asarray(bridge.imgmsg_to_cv2(msg, "rgb8")), ours)
        np.testing.assert_array_equal(ours, img)


def test_failed_swap_rolls_back_and_resets_the_parameter(rig, tiny_root, tmp_path):
    """A variant whose graphs pass the file checks but do not load: the node goes back to the
    running variant and sets the parameter back."""
    import shutil

    broken = tmp_path / "fused"
    shutil.copytree(tiny_root / "fused", broken, ignore=shutil.ignore_patterns("ctx"))
    graph = broken / "onnx" / "action_step_fused" / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:512])  # truncated, not empty
    node = _fresh_node(tiny_root, bundle__fused=str(broken))
    try:
        assert node.trigger_configure() == SUCCESS
        result = node.set_parameters([Parameter("variant", value="fused")])[0]
        assert result.successful  # the cheap checks pass; the load fails in the background
        node.controller.wait_for_swap(60)
        assert wait_for(lambda: node.get_parameter("variant").value == "grid_sampler", 10)
        assert node.controller.settings["variant"] == "grid_sampler"
        assert node.controller.policy is not None
        assert node.controller.counts["swap_failures"] == 1
        assert "rolled back" in node.controller.diagnostics()["message"]
    finally:
        node.release()
        node.destroy_node()


def test_a_long_instruction_is_refused_at_param_set_with_both_counts(rig, tiny_root, tmp_path):
    """ros2 param set of a 16-token instruction on a bundle with a 9-token budget."""
    from budget_helpers import cut_budget_bundle

    node = _fresh_node(cut_budget_bundle(tiny_root, tmp_path / "cut"))
    try:
        sixteen = "pick up the black bowl next to the ramekin and place it on the wooden plate"
        result = node.set_parameters([Parameter("instruction", value=sixteen)])[0]
        assert not result.successful, result.reason
        assert "is 16 tokens" in result.reason and "leaves 9 for the task" in result.reason
        assert node.get_parameter("instruction").value == "put the bowl on the plate"
    finally:
        node.release()
        node.destroy_node()
