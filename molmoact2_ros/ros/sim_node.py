"""The LIBERO simulator as a ROS 2 node: the policy node closes the loop over topics.

    ros2 launch molmoact2_ros libero.launch.py suite:=libero_spatial tasks:=0,1 episodes:=2 \
        bundle_root:=/data/molmoact2 variant:=grid_sampler backend:=onnx time_mode:=lockstep

It publishes both cameras (``sensor_msgs/Image``, rotated as ``image_rotation`` says),
``/joint_states`` with the policy's state names and ``/clock`` (the policy runs with
``use_sim_time``), executes the policy node's ``ActionChunk`` rows by their stamps
(``sim/executor.py``), sets the policy's ``instruction`` per task through its parameter service
(as ``ros2 param set`` does), resets between episodes (sim time jumps back, which the policy
node rides through) and writes the same ledger, summary and videos as ``molmoact2 libero``.

Time modes (``time_mode``):

- ``lockstep``: when the running chunk has ended (``protocol`` published: every row runs; node:
  ``overlap_s`` 0.1 s before) the sim publishes an observation and waits for its chunk (the
  policy node with ``trigger=on_observation``); sim time stands still;
- ``latency``: the same exchange, but the chunk becomes executable ``latency_ms`` (or the
  measured round trip when 0) of sim time after its observation, while the sim goes on with
  the previous chunk or a zero command;
- ``realtime``: the sim steps on the wall clock at 20 Hz and publishes every step; chunks run
  when they arrive (needs rendering faster than 50 ms a step, e.g. a GPU workstation; the
  policy node may run on the board across DDS).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import rclpy
import rclpy.node
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.srv import GetState
from rcl_interfaces.srv import SetParameters
from rclpy.executors import ExternalShutdownException
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CompressedImage, Image, JointState

from ..control.chunk_io import Published
from ..control.params import PARAMS_BY_NAME
from ..control.topics import image_topic
from ..errors import MolmoActError
from ..sim.evaluation import check_out, finish_run, parse_tasks, plan, synthetic_bundle
from ..sim.executor import ChunkExecutor
from ..sim.ledger import Ledger
from ..sim.libero_env import DEFAULT_SETTLE_STEPS, LiberoSim, suite_tasks
from ..sim.policy_status import WorstStatus
from ..sim.protocol import EXECUTION, PROTOCOLS, RENDER_PX, RUN_SEED, deviations, episode_seeds
from ..sim.runner import EPISODE_T0_NS, MIN_EPISODE_NS, EpisodeRecord, EpisodeSpec
from .common import NODE_NAME, new_executor

SIM_NODE_NAME = "molmoact2_libero_sim"
TIME_MODES = ("lockstep", "latency", "realtime")
#: CompressedImage formats the sim can publish (the policy node decodes both)
COMPRESSED_FORMATS = {"jpeg": ".jpg", "png": ".png"}


def _time(ns: int) -> Time:
    sec, nanosec = divmod(int(ns), 1_000_000_000)
    return Time(sec=sec, nanosec=nanosec)


class LiberoSimNode(rclpy.node.Node):
    """LIBERO on topics: cameras, joint states and clock out, action chunks in."""

    def __init__(self) -> None:
        super().__init__(SIM_NODE_NAME)
        defaults = (
            ("suite", "libero_spatial"), ("tasks", ""), ("episodes", 1), ("first_init", 0),
            ("max_steps", 0), ("settle_steps", DEFAULT_SETTLE_STEPS), ("image_rotation", "180"),
            ("time_mode", "lockstep"), ("latency_ms", 0.0), ("out", "libero_results"),
            ("video", "all"), ("seed", RUN_SEED), ("policy_node", NODE_NAME),
            ("protocol", "published"), ("render_size", 0), ("variant", "grid_sampler"),
            ("bundle_root", ""),
            ("active_timeout_s", 300.0), ("chunk_timeout_s", 120.0), ("republish_s", 10.0),
            ("overlap_s", -1.0), ("frame_id", "libero"),
            ("compressed_images", False), ("compressed_format", "jpeg"),
            ("topics.image_primary", PARAMS_BY_NAME["topics.image_primary"].default),
            ("topics.image_wrist", PARAMS_BY_NAME["topics.image_wrist"].default),
            ("topics.joint_states", PARAMS_BY_NAME["topics.joint_states"].default),
            ("state.joint_names", PARAMS_BY_NAME["state.joint_names"].default),
        )
        self.p = {name: self.declare_parameter(name, default).value for name, default in defaults}
        if self.p["time_mode"] not in TIME_MODES:
            raise MolmoActError(f"time_mode={self.p['time_mode']!r}; choose one of "
                                f"{', '.join(TIME_MODES)}")
        if self.p["protocol"] not in PROTOCOLS:
            raise MolmoActError(f"protocol={self.p['protocol']!r}; choose one of "
                                f"{', '.join(PROTOCOLS)}")
        if self.p["overlap_s"] < 0:  # the protocol's: every row (published), the node's 0.1 s
            self.p["overlap_s"] = float(EXECUTION[self.p["protocol"]].get(
                "execution.overlap_s", PARAMS_BY_NAME["execution.overlap_s"].default))
        if self.p["compressed_format"] not in COMPRESSED_FORMATS:
            raise MolmoActError(f"compressed_format={self.p['compressed_format']!r}; choose "
                                f"{' or '.join(COMPRESSED_FORMATS)}")
        self.period_ns = 50_000_000
        policy = "/" + self.p["policy_node"].strip("/")
        # the topics the policy node subscribes to with the same compressed_images setting
        compressed = bool(self.p["compressed_images"])
        image_type = CompressedImage if compressed else Image
        self._pub_primary = self.create_publisher(
            image_type, image_topic(self.p["topics.image_primary"], compressed),
            qos_profile_sensor_data)
        self._pub_wrist = self.create_publisher(
            image_type, image_topic(self.p["topics.image_wrist"], compressed),
            qos_profile_sensor_data)
        self._pub_joints = self.create_publisher(JointState, self.p["topics.joint_states"],
                                                 qos_profile_sensor_data)
        self._pub_clock = self.create_publisher(Clock, "/clock", QoSProfile(depth=10))
        from ..msg import ActionChunk

        self._chunks: queue.Queue = queue.Queue()
        self.create_subscription(ActionChunk, f"{policy}/action_chunk", self._on_chunk,
                                 QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        # the policy node's diagnostic_updater names its status "<node name>: policy"
        self._status_prefix = policy.rsplit("/", 1)[-1] + ":"
        self._policy_status: WorstStatus | None = None  # the running episode's, else None
        self.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics,
                                 QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
        self._set_params = self.create_client(SetParameters, f"{policy}/set_parameters")
        self._get_state = self.create_client(GetState, f"{policy}/get_state")
        self.policy_name = policy
        self.now_ns = 0
        self._asked: set[int] = set()  # the stamps of the running episode's observations
        self.status = 0
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._evaluate, name="libero-evaluation",
                                        daemon=True)
        self._thread.start()

    # -- ROS side ------------------------------------------------------------------------------
    def _on_chunk(self, msg) -> None:
        stamp = int(msg.header.stamp.sec) * 10**9 + int(msg.header.stamp.nanosec)
        start = int(msg.start_stamp.sec) * 10**9 + int(msg.start_stamp.nanosec)
        actions = np.asarray(msg.actions, np.float32).reshape(msg.horizon, msg.action_dim)
        latency = int(msg.inference_latency.sec) * 10**9 + int(msg.inference_latency.nanosec)
        kind = getattr(msg, "action_type", "") or "delta"  # LIBERO rows are deltas
        self._chunks.put((stamp, start, int(msg.sequence), actions, latency, time.monotonic(),
                          kind))

    def _on_diagnostics(self, msg) -> None:
        """Keep the worst status of the policy node during the running episode."""
        window = self._policy_status
        if window is None:
            return
        for st in msg.status:
            if st.name.startswith(self._status_prefix):
                try:
                    window.add(st.level, st.message)
                except ValueError as exc:
                    self.get_logger().warn(f"{st.name}: {exc}", throttle_duration_sec=10.0)

    def _call(self, client, request, timeout_s: float):
        """A service call from the evaluation thread (the executor spins elsewhere)."""
        if not client.wait_for_service(timeout_sec=min(timeout_s, 5.0)):
            return None
        future = client.call_async(request)
        deadline = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.01)
        return future.result() if future.done() else None

    def _wait_active(self) -> None:
        """Until the policy node reports ``active``; else one line with its last state."""
        timeout_s = self.p["active_timeout_s"]
        deadline = time.monotonic() + timeout_s
        label = ""
        while time.monotonic() < deadline and not self._stop.is_set():
            left = max(0.1, min(5.0, deadline - time.monotonic()))
            result = self._call(self._get_state, GetState.Request(), left)
            if result is not None:
                label = result.current_state.label
                if label == "active":
                    return
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        if self._stop.is_set():
            raise MolmoActError(f"stopped while waiting for policy node {self.policy_name}")
        if not label:
            raise MolmoActError(
                f"policy node {self.policy_name} did not answer within {timeout_s} s "
                f"(active_timeout_s): start it with use_sim_time:=true on this ROS_DOMAIN_ID "
                f"(ros2 launch molmoact2_ros policy.launch.py ...), or set policy_node to its name")
        raise MolmoActError(
            f"policy node {self.policy_name} is {label}, not active, after {timeout_s} s "
            f"(active_timeout_s): see its log for the failed transition (bundle path, backend), "
            f"or activate it: ros2 lifecycle set {self.policy_name} activate")

    def _set_instruction(self, text: str, seed: int) -> tuple[bool, str]:
        """The task's instruction and the episode's noise seed on the policy node."""
        request = SetParameters.Request()
        request.parameters = [
            Parameter("instruction", Parameter.Type.STRING, text).to_parameter_msg(),
            Parameter("seed", Parameter.Type.INTEGER, int(seed)).to_parameter_msg()]
        result = self._call(self._set_params, request, 30.0)
        if result is None:
            return False, f"{self.policy_name}/set_parameters did not answer within 30 s"
        for r in result.results:
            if not r.successful:
                return False, r.reason
        return True, ""

    def _publish_clock(self, ns: int) -> None:
        self.now_ns = int(ns)
        self._pub_clock.publish(Clock(clock=_time(ns)))

    def _publish_joints(self, obs, ns: int) -> None:
        msg = JointState()
        msg.header.stamp = _time(ns)
        msg.header.frame_id = self.p["frame_id"]
        msg.name = list(self.p["state.joint_names"])
        msg.position = [float(v) for v in obs.state]
        self._pub_joints.publish(msg)

    def _publish_images(self, obs, ns: int) -> None:
        for pub, img in ((self._pub_primary, obs.images[0]), (self._pub_wrist, obs.images[1])):
            if self.p["compressed_images"]:
                pub.publish(self._compressed(img, ns))
                continue
            msg = Image()
            msg.header.stamp = _time(ns)
            msg.header.frame_id = self.p["frame_id"]
            msg.height, msg.width = int(img.shape[0]), int(img.shape[1])
            msg.encoding, msg.is_bigendian, msg.step = "rgb8", 0, int(img.shape[1]) * 3
            msg.data = np.ascontiguousarray(img).tobytes()
            pub.publish(msg)

    def _compressed(self, img: np.ndarray, ns: int) -> CompressedImage:
        """An RGB frame as image_transport's compressed plugin sends it (cv2 comes with
        LIBERO)."""
        import cv2

        fmt = self.p["compressed_format"]
        ok, data = cv2.imencode(COMPRESSED_FORMATS[fmt], np.ascontiguousarray(img[:, :, ::-1]))
        if not ok:
            raise MolmoActError(f"cv2 could not encode a {img.shape} frame as {fmt}")
        msg = CompressedImage()
        msg.header.stamp = _time(ns)
        msg.header.frame_id = self.p["frame_id"]
        msg.format = f"rgb8; {fmt} compressed bgr8"
        msg.data = data.tobytes()
        return msg

    # -- the evaluation (its own thread) -------------------------------------------------------
    def _evaluate(self) -> None:
        try:
            self.status = self._run()
        except MolmoActError as exc:
            self.get_logger().error(str(exc))
            print(f"error: {exc}", file=sys.stderr)
            self.status = 2
        except Exception as exc:  # a bug: one line, the node ends
            self.get_logger().error(f"evaluation failed: {type(exc).__name__}: {exc}")
            self.status = 1
        finally:
            self.done.set()

    def _run(self) -> int:
        p = self.p
        out = check_out(p["out"], {"the bundle": p["bundle_root"]}, option="out")
        infos = suite_tasks(p["suite"])
        tasks = parse_tasks(p["tasks"] or None, len(infos), p["suite"], option="tasks")
        specs = plan(p["suite"], tasks, int(p["episodes"]), int(p["first_init"]), infos)
        steps = infos[0].max_steps
        run = {"suite": p["suite"], "protocol": p["protocol"], "time_mode": p["time_mode"],
               "latency_ms": p["latency_ms"], "max_steps": int(p["max_steps"]) or steps,
               "render_px": int(p["render_size"]) or RENDER_PX,
               "settle_steps": p["settle_steps"], "image_rotation": p["image_rotation"],
               "seed": p["seed"], "variant": p["variant"], "via": "ros",
               # the policy node's bundle, when this launch knows it (else: not known here)
               "synthetic_bundle": bool(p["bundle_root"]) and synthetic_bundle(
                   p["bundle_root"], p["variant"])}
        published = EXECUTION["published"]["execution.overlap_s"]
        run["deviations"] = deviations(run, steps, {} if p["overlap_s"] == published else
                                       {"execution.overlap_s": p["overlap_s"]})
        ledger = Ledger(out, run)
        todo = [s for s in specs if s.key not in ledger.done()]
        self.get_logger().info(f"{len(todo)} of {len(specs)} episodes to run; waiting for "
                               f"{self.policy_name} to be active")
        self._publish_clock(EPISODE_T0_NS)
        self._wait_active()
        sim = LiberoSim(image_rotation=p["image_rotation"], settle_steps=int(p["settle_steps"]),
                        camera_size=run["render_px"])
        try:
            for spec in todo:
                if self._stop.is_set():
                    break
                rec = self._episode(sim, spec, out)
                if rec is None:
                    break
                ledger.append(rec.to_json())
                wins = sum(1 for r in ledger.records if r["success"])
                self.get_logger().info(f"{spec.key}: {'success' if rec.success else rec.status}"
                                       f" in {rec.steps} steps; {wins}/{len(ledger.records)}")
        finally:
            sim.close()
        records = finish_run(ledger, specs, run, out)
        sys.stdout.flush()
        return 0 if len(records) == len(specs) else 130

    def _episode(self, sim: LiberoSim, spec: EpisodeSpec, out: Path) -> EpisodeRecord | None:
        p = self.p
        wall0 = time.perf_counter()
        info = sim.task(spec.suite, spec.task_id)
        max_steps = int(p["max_steps"]) or info.max_steps
        rec = EpisodeRecord(spec.key, spec.suite, spec.task_id, spec.init_index, info.language,
                            max_steps=max_steps, settle_steps=sim.settle_steps,
                            time_mode=p["time_mode"], latency_ms=float(p["latency_ms"]))
        seeds = episode_seeds(spec.suite, spec.task_id, spec.init_index, int(p["seed"]))
        rec.env_seed, rec.noise_seed = seeds["env_seed"], seeds["noise_seed"]
        stem = f"{spec.suite}_task{spec.task_id:02d}_init{spec.init_index:02d}"
        ok, reason = self._set_instruction(info.language, rec.noise_seed)
        if not ok:
            rec.status, rec.reason = "refused", reason
            self.get_logger().warn(f"{spec.key}: instruction refused: {reason}")
            if p["video"] == "all":
                from ..sim.video import EpisodeVideo

                video = EpisodeVideo(out / "videos", stem, info.language, size=sim.camera_size)
                rec.video = str(video.finish("refused", reason).relative_to(out))
            return rec
        # from here to the episode's last step, across the reset: the policy node's statuses
        status = self._policy_status = WorstStatus()
        t0 = EPISODE_T0_NS + sim.settle_steps * self.period_ns
        # run the clock far enough that the jump back to t0 is a reset for the policy node
        self._publish_clock(max(self.now_ns, t0 + MIN_EPISODE_NS))
        obs = sim.reset(spec.suite, spec.task_id, spec.init_index, seed=rec.env_seed)
        rec.timing.reset_s = sim.timing.get("reset_s", 0.0)
        rec.timing.build_s = sim.timing.pop("build_s", 0.0)
        self._publish_clock(t0)
        while not self._chunks.empty():  # chunks of the last episode
            self._chunks.get_nowait()
        executor = ChunkExecutor(self.period_ns, keep_log=False)
        video = None
        if p["video"] != "none":
            from ..sim.video import EpisodeVideo

            video = EpisodeVideo(out / "videos", stem, info.language, size=sim.camera_size)
            video.add(obs.raw_images, 0, obs.success)
        mode = p["time_mode"]
        latency_est_ns = 0
        waiting_for: int | None = None  # stamp of the observation a chunk is awaited for
        self._asked = set()
        env_s = 0.0
        wall_start = time.monotonic()
        loop0 = time.perf_counter()
        try:
            for k in range(max_steps):
                now = t0 + k * self.period_ns
                if mode == "realtime":
                    lag = wall_start + k * self.period_ns / 1e9 - time.monotonic()
                    if lag > 0:
                        time.sleep(lag)
                self._publish_clock(now)
                wants = (mode == "realtime" or waiting_for is None and
                         executor.busy_until_ns() - now <= latency_est_ns
                         + int(p["overlap_s"] * 1e9))
                if wants:  # the images before their state: the order that finds a policy
                    # node pairing them with the state of the step before
                    self._asked.add(now)
                    self._publish_images(obs, now)
                    waiting_for = now if mode != "realtime" else None
                self._publish_joints(obs, now)
                if waiting_for is not None:  # sim (and policy) time stand still meanwhile
                    got = self._await_chunk(waiting_for, executor, rec,
                                            lambda o=obs, t=now: self._publish_images(o, t))
                    if got is None:
                        rec.drops["chunk_timeout"] = rec.drops.get("chunk_timeout", 0) + 1
                    else:
                        latency_est_ns = got
                    waiting_for = None
                self._take_chunks(executor, now, rec)
                action = executor.command(now)
                obs = sim.step(action)
                env_s += sim.last_env_step_s
                if video is not None:
                    video.add(obs.raw_images, obs.step, obs.success)
                rec.steps = obs.step
                if obs.success or self._stop.is_set():
                    break
            if video is not None and (obs.success or not self._stop.is_set()):
                video.finish("success" if obs.success else "failure")
        finally:
            self._policy_status = None
            if video is not None:
                video.close()
        if self._stop.is_set() and not obs.success:
            return None
        rec.policy_diagnostics = status.to_json()
        loop_s = time.perf_counter() - loop0
        rec.success = bool(obs.success)
        rec.sim_time_s = round((sim.settle_steps + rec.steps) * self.period_ns / 1e9, 6)
        rec.rows_executed, rec.rows_skipped = executor.rows_executed, executor.rows_skipped
        rec.idle_steps = executor.idle_steps
        rec.largest_command_change = round(executor.largest_command_change, 6)
        rec.clipped_steps, rec.clipped_values = sim.clipped_steps, sim.clipped_values
        rec.timing.env_step_ms = round(env_s / max(rec.steps, 1) * 1e3, 3)
        rec.timing.sim_steps_per_s = round(rec.steps / loop_s, 3) if loop_s > 0 else 0.0
        rec.timing.wall_s = round(time.perf_counter() - wall0, 3)
        if video is not None:
            if p["video"] == "failures" and rec.success:
                video.path.unlink(missing_ok=True)
            else:
                rec.video = str(video.path.relative_to(out))
        return rec

    def _await_chunk(self, stamp: int, executor: ChunkExecutor, rec: EpisodeRecord,
                     republish) -> int | None:
        """Wait (wall clock) for the chunk of the observation stamped ``stamp``; returns its
        latency in sim time (``latency_ms``, or the measured round trip when 0). The images go
        out again every ``republish_s`` (sensor-data QoS is best effort: one may be lost)."""
        sent = last = time.monotonic()
        deadline = sent + self.p["chunk_timeout_s"]
        while time.monotonic() < deadline and not self._stop.is_set():
            if time.monotonic() - last > self.p["republish_s"]:
                republish()
                last = time.monotonic()
            try:
                item = self._chunks.get(timeout=0.05)
            except queue.Empty:
                continue
            obs_stamp, start, seq, actions, _, received, kind = item
            if obs_stamp != stamp:  # a late chunk of an older observation, or a wrong stamp
                self._count_wrong_stamp(obs_stamp, rec)
                continue
            wall_ns = int((received - sent) * 1e9)
            latency = 0
            if self.p["time_mode"] == "latency":
                latency = int(self.p["latency_ms"] * 1e6) or wall_ns
            executor.accept(Published(None, actions, seq, None, None, stamp, stamp + latency,
                                      start, start, 0, action_type=kind), stamp + latency)
            rec.chunks += 1
            rec.chunk_latency_ms.append(latency / 1e6)
            rec.timing.inference_ms.append(round(wall_ns / 1e6, 3))
            return latency
        return None

    def _count_wrong_stamp(self, obs_stamp: int, rec: EpisodeRecord) -> None:
        """A chunk stamped with no observation this episode sent: the policy node paired the
        images with another state, or stamped them wrongly (a ``chunk_wrong_stamp`` drop)."""
        if obs_stamp not in self._asked:
            rec.drops["chunk_wrong_stamp"] = rec.drops.get("chunk_wrong_stamp", 0) + 1
            self.get_logger().warn(f"a chunk stamped {obs_stamp} ns answers no observation "
                                   "this episode sent", throttle_duration_sec=5.0)

    def _take_chunks(self, executor: ChunkExecutor, now: int, rec: EpisodeRecord) -> None:
        """realtime: chunks that arrived meanwhile run from now on."""
        if self.p["time_mode"] != "realtime":
            return
        while not self._chunks.empty():
            obs_stamp, start, seq, actions, latency, _, kind = self._chunks.get_nowait()
            self._count_wrong_stamp(obs_stamp, rec)
            executor.accept(Published(None, actions, seq, None, None, obs_stamp, now, start,
                                      start, 0, action_type=kind), now)
            rec.chunks += 1
            rec.chunk_latency_ms.append((now - obs_stamp) / 1e6)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30.0)


def main(args: list[str] | None = None) -> int:
    """Spin until the evaluation ends; exit 0 when every episode is in the ledger, 2 on bad
    input or a policy node that never became active, 130 when interrupted."""
    rclpy.init(args=args)
    try:
        node = LiberoSimNode()
    except MolmoActError as exc:
        print(f"error: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    executor = new_executor()
    executor.add_node(node)
    status = 130
    try:
        while rclpy.ok() and not node.done.is_set():
            executor.spin_once(timeout_sec=0.1)
        status = node.status
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.stop()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return status
