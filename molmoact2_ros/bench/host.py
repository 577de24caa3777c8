"""Host rows of ``molmoact2 bench``: preprocessing vs a peer pipeline, controller, replay, the
rclpy node (under ROS 2), RSS.

Everything runs on null sessions (real tensor sizes, no compute) behind the real host glue:
a host-only bundle (the synthetic tokenizer and prompt, a random float16 embedding table of
the real hidden size, no graphs) is written to a temporary folder for the policy rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..host import resample_jit
from ..host.images import preprocess
from ..host.resample import patch_view
from ..runtime.null_backend import REAL_GEOMETRY

FRAME_SIZES = {"256x256": (256, 256), "640x480": (480, 640)}


def stats(values: Sequence[float]) -> dict[str, float]:
    """Median, 95th percentile and count of a list of milliseconds."""
    arr = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(arr)), "p95": float(np.percentile(arr, 95)), "n": len(arr)}


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 3) -> dict:
    """Time several callables in turns (alternating order), so load changes hit them alike.

    Besides wall time, the CPU time of the whole process (all threads) per call: on a shared
    machine it shows the work apart from the waiting for a core.
    """
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats + warmup):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
                cpu[name].append((time.process_time() - start_cpu) * 1e3)
    return {n: {**stats(times[n]), "cpu_median": float(np.median(cpu[n]))} for n in names}


# -- preprocessing ----------------------------------------------------------------------------
def peer_preprocess(frames: Sequence[np.ndarray], out: np.ndarray, size: int = 378,
                    patch: int = 14) -> None:
    """The usual tools: OpenCV ``resize`` INTER_LINEAR, numpy normalise, patchify, one copy."""
    import cv2

    grid = size // patch
    for cam, frame in enumerate(frames):
        resized = cv2.resize(frame, (size, size), interpolation=cv2.INTER_LINEAR)
        unit = resized.astype(np.float32) / np.float32(255.0) * np.float32(2.0) - np.float32(1.0)
        out[0, cam] = patch_view(unit, patch).reshape(grid * grid, patch * patch * 3)


def bench_preprocess(repeats: int) -> dict:
    """Two frames into a float16 pixel_values buffer, same frames, in turns: ours (the compiled
    kernel where numba is installed), our numpy path when that is not what ours ran, and the
    peer's."""
    rows: dict = {}
    rng = np.random.default_rng(0)
    try:
        import cv2  # noqa: F401
        peer_ok = True
    except ImportError:
        peer_ok = False
    kernel = resample_jit.kernel()
    for label, (h, w) in FRAME_SIZES.items():
        frames = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(2)]
        ours = np.zeros((1, 2, 729, 588), np.float16)
        numpy_path = np.zeros_like(ours)
        peer = np.zeros_like(ours)
        fns: dict[str, Callable[[], object]] = {
            f"preprocess {label}": lambda f=frames, o=ours: preprocess(f, out=o)
        }
        if kernel != "numpy":
            fns[f"numpy path {label}"] = lambda f=frames, o=numpy_path: _numpy_path(f, o)
        if peer_ok:
            fns[f"peer {label}"] = lambda f=frames, o=peer: peer_preprocess(f, o)
        rows.update(interleaved(fns, repeats))
        rows[f"preprocess {label}"]["kernel"] = kernel
        if kernel != "numpy":  # both designs must give the same bits
            rows[f"numpy path {label}"]["same_values"] = bool(
                np.array_equal(ours.view(np.uint16), numpy_path.view(np.uint16)))
        if peer_ok:  # how far the usual tools are from the processor's pixels
            levels = np.abs(ours.astype(np.float32) - peer.astype(np.float32)) * 127.5
            rows[f"peer {label}"]["pixels_off_by_1_or_more"] = float(np.mean(levels > 0.5))
        else:
            rows[f"peer {label}"] = {"skipped": "opencv-python-headless not installed"}
    return rows


def _numpy_path(frames: Sequence[np.ndarray], out: np.ndarray) -> None:
    with resample_jit.using("numpy"):
        preprocess(frames, out=out)


# -- a host-only bundle and null-session policies ---------------------------------------------
def host_bundle(root: Path, variant: str) -> Path:
    """The synthetic bundle's host files with a random float16 table of the real hidden size."""
    from ..bundle.conventions import Conventions
    from ..synth import assets

    folder = Path(root) / variant
    host = folder / "host"
    host.mkdir(parents=True, exist_ok=True)
    (folder / "bundle.json").write_text(json.dumps({"variant": variant, "synthetic": True}))
    (folder / "norm_stats.json").write_text(json.dumps(assets.norm_stats()))
    vocab = assets.vocabulary()
    (host / "tokenizer.json").write_text(assets.tokenizer_json(vocab))
    (host / "prompt.json").write_text(json.dumps(assets.prompt_config()))
    (host / "conventions.json").write_text(Conventions(**assets.CONVENTIONS[variant]).to_json())
    rng = np.random.default_rng(1)
    table = rng.standard_normal((len(vocab), REAL_GEOMETRY["H"])).astype(np.float16)
    np.save(host / "embeddings.npy", table)
    return folder


class NullPipeline:
    """No sessions at all: fp16 input buffers of the real sizes (like the HTP arena), zero
    image features, and the flow state handed back. What is left is the host's own work."""

    def __init__(self, variant, conventions) -> None:
        from ..bundle.variants import VISION
        from ..runtime.null_backend import null_sessions
        from ..runtime.session import SessionSet

        sessions = null_sessions(variant, euler_in_graph=conventions.euler_in_graph,
                                 dtype="float16")
        self.conventions = conventions
        self.geometry = SessionSet(sessions, variant,
                                   euler_in_graph=conventions.euler_in_graph).geometry
        g = self.geometry
        self._buffers = {
            "pixel_values": np.zeros(
                (1, variant.num_cameras, variant.patches_per_image, variant.patch_dim),
                np.float16),
            "hidden_states": np.zeros((1, g.seq_len, g.hidden), np.float16),
            "attention_bias": np.zeros((1, 1, g.seq_len, g.seq_len), np.float16),
            "encoder_attention_mask": np.zeros((1, g.seq_len), np.float16),
            "action_dim_is_pad": np.zeros((1, variant.max_action_dim), np.float16),
        }
        shape = next(o.shape for o in sessions[VISION].outputs if o.name == "image_embeds")
        self._image_embeds = np.zeros(shape, np.float16)
        self.last_timings_ms: dict[str, float] = {}

    def input_buffer(self, name: str) -> np.ndarray:
        return self._buffers[name]

    def run_vision(self) -> np.ndarray:
        return self._image_embeds

    def run_action(self, x0: np.ndarray, num_steps: int) -> np.ndarray:
        return x0

    failed = None

    def restart(self) -> None:
        pass

    def close(self) -> None:
        pass


def null_policy(folder: Path, *, resident: bool = False, instruction: str = "pick up the bowl"):
    """A Policy on the null pipeline (host work only), or on the resident null workers."""
    from ..bundle.bundle import Bundle
    from ..policy import Policy

    bundle = Bundle.open(folder)
    conventions = bundle.conventions()
    if resident:
        from ..runtime.htp_backend import ResidentPipeline

        pipeline = ResidentPipeline.open_null(bundle.variant, conventions, call_timeout_s=120.0)
    else:
        pipeline = NullPipeline(bundle.variant, conventions)
    try:
        return Policy(bundle, pipeline, backend="null", instruction=instruction, seed=0)
    except Exception:
        pipeline.close()
        raise


def _parameters(folder: Path, variant: str) -> dict:
    """The node parameters of the controller, replay and node rows (the rest at defaults)."""
    return {"variant": variant, f"bundle.{variant}": str(folder), "backend": "onnx",
            "instruction": "pick up the bowl", "max_observation_age_s": 3600.0}


def _settings(folder: Path, variant: str):
    from ..control.params import Settings

    return Settings().with_changes(_parameters(folder, variant))


class _TimedPolicy:
    """Wraps a policy to time ``predict`` (the pipeline), so the controller's own part remains;
    the last time, and each by the observation's stamp."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.predict_ms = 0.0
        self.by_stamp: dict[int, float] = {}

    def predict(self, obs, **kwargs):
        start = time.perf_counter()
        chunk = self.policy.predict(obs, **kwargs)
        self.predict_ms = (time.perf_counter() - start) * 1e3
        self.by_stamp[obs.stamp_ns] = self.predict_ms
        return chunk

    def __getattr__(self, name: str):
        return getattr(self.policy, name)


def bench_controller(folder: Path, variant: str, chunks: int) -> dict:
    """Observation handed in -> message fields built for publish, minus ``predict``."""
    from ..control.controller import Controller, chunk_message_fields

    policy = _TimedPolicy(null_policy(folder))
    built: list = [None]
    controller = Controller(_settings(folder, variant),
                            publish=lambda p: built.__setitem__(0, chunk_message_fields(p)),
                            policy_factory=lambda s: policy)
    rng = np.random.default_rng(2)
    frames = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(2)]
    state = np.zeros(8, np.float32)
    overhead, pipeline = [], []
    controller.configure()
    controller.activate(worker=False)
    try:
        for i in range(chunks + 3):
            start = time.perf_counter()
            controller.on_observation(frames, state, time.time_ns())
            out = controller.process_pending()
            total = (time.perf_counter() - start) * 1e3
            if out is None or built[0] is None:
                raise RuntimeError(f"controller published nothing: drops {dict(controller.drops)}")
            if i >= 3:
                overhead.append(total - policy.predict_ms)
                pipeline.append(policy.predict_ms)
    finally:
        controller.shutdown()
    return {"controller overhead": stats(overhead), "policy predict (null)": stats(pipeline)}


#: Observations in the replay row's bag: the target is about long bags, where opening and
#: checking the bag (about 0.1 s) must not dominate.
REPLAY_MIN_CHUNKS = 300


def bench_replay(folder: Path, variant: str, chunks: int, tmp: Path) -> dict:
    """``replay`` of an rgb8 bag on null sessions: chunks per second through the whole tool
    (checking and opening the bag included), over at least ``REPLAY_MIN_CHUNKS``."""
    from ..replay.replay import replay, write_observation_bag

    chunks = max(chunks, REPLAY_MIN_CHUNKS)
    settings = _settings(folder, variant)
    rng = np.random.default_rng(3)
    frames = [
        (1_000_000_000 + i * 100_000_000, rng.integers(0, 256, (256, 256, 3), dtype=np.uint8),
         rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), np.zeros(8))
        for i in range(chunks)
    ]
    bag = tmp / f"replay-{variant}"
    write_observation_bag(bag, frames, settings)
    start = time.perf_counter()
    result = replay(bag, settings, policy_factory=lambda s: null_policy(folder))
    seconds = time.perf_counter() - start
    n = len(result.published)
    return {"replay": {"chunks": n, "seconds": seconds, "chunks_per_s": n / seconds,
                       "drops": result.drops}}


#: The node row: warm-up observations (discovery, first allocations), the pace of observations
#: (a 20 Hz camera), the wait for one observation's outputs and for the node to come up.
NODE_WARMUP = 5
NODE_PERIOD_S = 0.05
NODE_TIMEOUT_S = 2.0
NODE_READY_S = 60.0


def _node_child(folder: str, variant: str, namespace: str, kind: str) -> None:
    """Child process of the node row until stdin closes: ``node``, the rclpy node on the timed
    null policy, or ``relay``, its floor; prints predict's time per observation stamp and the
    node's counts as JSON."""
    from ..ros.bench_nodes import serve_for_bench, serve_relay_for_bench

    if kind == "relay":
        predict: dict[int, float] = {}
        result = serve_relay_for_bench(_settings(Path(folder), variant), namespace,
                                       until=sys.stdin.read)
    else:
        policy = _TimedPolicy(null_policy(Path(folder)))
        predict = policy.by_stamp
        result = serve_for_bench(lambda settings: policy, _parameters(Path(folder), variant),
                                 namespace, until=sys.stdin.read)
    print(json.dumps({"predict_ms": {str(k): v for k, v in predict.items()}, **result}),
          flush=True)


def _drive_node_child(folder: Path, variant: str, observations: int, kind: str) -> tuple:
    """Start ``_node_child`` of ``kind`` in a fresh process and drive it from this one
    (``node.drive_for_bench``). :return: the per-observation timings and the child's report.
    :raises RuntimeError: the child failed (the message ends with its last log line)."""
    import secrets

    from ..ros.bench_nodes import drive_for_bench

    rng = np.random.default_rng(5)
    frames = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(2)]
    namespace = f"molmoact2_bench_{secrets.token_hex(4)}"  # no cross-talk with other runs
    code = ("import sys; from molmoact2_ros.bench.host import _node_child; "
            "_node_child(*sys.argv[1:5])")
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(  # noqa: S603 (fixed argv: this interpreter, our child)
            [sys.executable, "-c", code, str(folder), variant, namespace, kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        problem = ""
        try:
            timings = drive_for_bench(
                namespace, _settings(folder, variant), frames, np.zeros(8, np.float32),
                observations=observations, warmup=NODE_WARMUP, period_s=NODE_PERIOD_S,
                timeout_s=NODE_TIMEOUT_S, ready_timeout_s=NODE_READY_S,
                alive=lambda: child.poll() is None)
            out, _ = child.communicate(input="", timeout=60)  # stdin closes: the node stops
            if child.returncode != 0:
                problem = f"{kind} process exit status {child.returncode}"
            else:
                report = json.loads(out.strip().splitlines()[-1])
        except Exception as exc:
            child.kill()
            child.communicate()
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            log.seek(0)
            tail = (log.read().strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"{problem}; {kind} process: {tail}")
    return timings, report


def bench_node(folder: Path, variant: str, observations: int) -> dict:
    """The rclpy node's own overhead per observation, under ROS 2 (else one skip line).

    The node (``node.PolicyNode`` on the null pipeline, configured and activated, spun by the
    executor ``main`` uses) runs in a fresh process, as ``ros2 run`` starts it; this process
    publishes the observations and takes the outputs (``node.drive_for_bench``), so the
    messages cross processes over DDS loopback as on the robot, and the driver's Python does
    not share the node's interpreter lock. Per observation: from just before the last input
    message (the JointState, after the two Images) is published until the serialized
    ActionChunk and JointTrajectory of its stamp have both arrived, minus ``predict``'s time
    in the node process. That leaves DDS delivery both ways (serialization, loopback, the
    inputs' deserialisation), executor scheduling, image conversion (cv_bridge or the core
    decoder), state, synchronisation, the hand-over to the inference thread, the controller,
    building and publishing both messages, and the driver's executor taking them.

    The floor: the same run against ``node.BenchRelay`` (same topics, QoS, callback group and
    executor; prebuilt outputs published from the callback), i.e. rclpy and DDS alone.
    """
    import importlib.util

    # found, not imported: only node.py imports rclpy
    if importlib.util.find_spec("rclpy") is None:
        return {"node": {"skipped": "rclpy not available"}}
    if importlib.util.find_spec("molmoact2_ros.msg") is None:
        return {"node": {"skipped": "molmoact2_ros.msg not built (colcon build the package "
                                    "and source install/setup.bash)"}}
    try:
        timings, report = _drive_node_child(folder, variant, observations, "node")
        floor, _ = _drive_node_child(folder, variant, observations, "relay")
    except RuntimeError as exc:
        return {"node": {"skipped": str(exc)}}
    predict = {int(k): v for k, v in report["predict_ms"].items()}
    done = [t for t in timings if t["chunk"] is not None and t["trajectory"] is not None
            and t["stamp_ns"] in predict]
    row = {"observations": observations, "received": len(done),
           "lost": observations - len(done), "invalid": sum(not t["valid"] for t in done),
           "published": report["counts"].get("published", 0), "drops": report["drops"],
           "warmup": NODE_WARMUP, "period_s": NODE_PERIOD_S}
    floor_ms = [(max(t["chunk"], t["trajectory"]) - t["sent"]) * 1e3 for t in floor
                if t["chunk"] is not None and t["trajectory"] is not None]
    if not done or not floor_ms:
        return {"node": {"skipped": f"no observation gave both outputs "
                                    f"({row}; floor: {len(floor_ms)} of {observations})"}}
    e2e = [(max(t["chunk"], t["trajectory"]) - t["sent"]) * 1e3 for t in done]
    pipeline = [predict[t["stamp_ns"]] for t in done]
    overhead = [e - p for e, p in zip(e2e, pipeline)]
    return {"node": {**stats(overhead), "end_to_end": stats(e2e),
                     "predict (null)": stats(pipeline), "rclpy floor": stats(floor_ms),
                     **row}}


def _rss_child(folder: str, chunks: int) -> None:
    """Child process: controller + resident runtime over ``chunks`` chunks; prints peak RSS."""
    import resource

    from ..control.controller import Controller, chunk_message_fields
    from ..host import resample_jit

    variant = json.loads((Path(folder) / "bundle.json").read_text())["variant"]
    policy = null_policy(Path(folder), resident=True)
    controller = Controller(_settings(Path(folder), variant),
                            publish=chunk_message_fields, policy_factory=lambda s: policy)
    rng = np.random.default_rng(4)
    frames = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(2)]
    controller.configure()
    controller.activate(worker=False)
    try:
        for _ in range(chunks):
            controller.on_observation(frames, np.zeros(8, np.float32), time.time_ns())
            controller.process_pending()
        workers = list(policy.pipeline.worker_pids().values())
    finally:
        controller.shutdown()
    # VmHWM, the high-water mark of this process's own memory map: ru_maxrss would carry the
    # launching process's RSS across fork + exec. RssAnon/RssFile split the final RSS into
    # the process's own memory and mapped files (shared libraries, shared with other processes).
    status = dict(line.split(":", 1) for line in
                  Path("/proc/self/status").read_text().splitlines() if ":" in line)

    def mib(key: str) -> float | None:
        value = status.get(key, "").split()
        return int(value[0]) / 1024.0 if value else None

    peak_mib = mib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"peak_rss_mib": peak_mib, "anon_mib": mib("RssAnon"),
                      "file_mib": mib("RssFile"), "kernel": resample_jit.kernel(),
                      "workers": len(workers), "published": controller.counts["published"]}))


def bench_rss(folder: Path, chunks: int) -> dict:
    """Peak RSS of a fresh process running the controller on the resident runtime; where the
    compiled preprocessing kernel is in use, also of one pinned to the numpy path (numba's
    LLVM is a large part of the process)."""
    rows = {"node process RSS": _rss_run(folder, chunks, {})}
    if rows["node process RSS"].get("kernel", "numpy") != "numpy":
        from ..host.jit import ENV

        rows["node process RSS, numpy path"] = _rss_run(folder, chunks, {ENV: "0"})
    return rows


def _rss_run(folder: Path, chunks: int, env: dict) -> dict:
    code = ("import sys; from molmoact2_ros.bench.host import _rss_child; "
            "_rss_child(sys.argv[1], int(sys.argv[2]))")
    proc = subprocess.run(  # noqa: S603 (fixed argv: this interpreter, our child)
        [sys.executable, "-c", code, str(folder), str(chunks)],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"child failed: {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_host(variant: str, repeats: int, chunks: int, progress=None) -> dict:
    """All host rows; ``progress(label)`` is called before each."""
    step = progress or (lambda label: None)
    rows: dict = {}
    step("preprocess")
    rows.update(bench_preprocess(repeats))
    with tempfile.TemporaryDirectory(prefix="molmoact2-bench-") as tmp:
        folder = host_bundle(Path(tmp), variant)
        step("controller")
        rows.update(bench_controller(folder, variant, repeats))
        step("replay")
        try:
            rows.update(bench_replay(folder, variant, chunks, Path(tmp)))
        except Exception as exc:  # e.g. rosbags missing: report, keep the other rows
            rows["replay"] = {"skipped": f"{type(exc).__name__}: {exc}"}
        step("node")
        rows.update(bench_node(folder, variant, repeats))
        step("rss")
        rows.update(bench_rss(folder, chunks))
    return rows


def format_host(rows: dict) -> str:
    """The host rows as a table: timings with median/p95, the rest as one line each."""
    lines = ["== host (null sessions)",
             f"{'stage':<32} {'median ms':>10} {'p95 ms':>10} {'CPU ms':>10}"]
    for key, row in rows.items():
        name = {"node": "rclpy node overhead"}.get(key, key)
        if "median" in row:
            cpu = f" {row['cpu_median']:>10.2f}" if "cpu_median" in row else ""
            lines.append(f"{name:<32} {row['median']:>10.2f} {row['p95']:>10.2f}{cpu}")
            if "end_to_end" in row:
                lines.append(
                    f"  = last input published -> both outputs received "
                    f"{row['end_to_end']['median']:.2f} ms minus predict "
                    f"{row['predict (null)']['median']:.2f} ms (medians); {row['received']} of "
                    f"{row['observations']} observations, {row['invalid']} invalid")
                floor = row["rclpy floor"]
                lines.append(f"{'  rclpy floor (relay, no work)':<32} {floor['median']:>10.2f} "
                             f"{floor['p95']:>10.2f}")
        elif "skipped" in row:
            lines.append(f"{name:<32} skipped: {row['skipped']}")
        elif "chunks_per_s" in row:
            lines.append(f"{name:<32} {row['chunks_per_s']:.0f} chunks/s ({row['chunks']} chunks "
                         f"in {row['seconds']:.2f} s, drops {row['drops']})")
        elif "peak_rss_mib" in row:
            split = ""
            if row.get("anon_mib") is not None and row.get("file_mib") is not None:
                split = (f"; at the end {row['anon_mib']:.1f} anonymous + {row['file_mib']:.1f} "
                         "mapped files")
            lines.append(f"{name:<32} peak {row['peak_rss_mib']:.1f} MiB over "
                         f"{row['published']} chunks, {row.get('kernel', 'numpy')} "
                         f"preprocessing{split} ({row['workers']} workers not counted)")
    return "\n".join(lines)
