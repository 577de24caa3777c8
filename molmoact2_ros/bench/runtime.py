"""``molmoact2 bench``: the host's critical path, measured side by side in one run.

Runtime rows (per variant) run null sessions (no compute, outputs of the real MolmoAct2 tensor
sizes, fp16 like the HTP), so what is timed is everything but the NPU:

(a) resident: the real worker code (``runtime/worker.py``) with the null session loader, the
    shared-memory arena and 9-byte control frames; the Euler loop runs in the action worker.
(b) naive: one process per session group too, but every call pickles its float32 feeds
    through a pipe, the worker converts them to fp16 and its outputs back to float32, and the
    orchestrator makes a round trip per Euler step (k_ctx/v_ctx go out every step).
(floor) a plain copy of every byte the runtime must move per chunk: each session call's input
    copy and output copy in the library plus the copy into the arena of every output another
    process reads (``floor_bytes``), timed in turns with (a)'s chunks.

Host rows (``bench_host``): preprocessing against a peer OpenCV pipeline on the same frames,
the prompt embedding per variant, the controller's own overhead, replay throughput, the rclpy
node's own overhead with its rclpy floor (under ROS 2 only) and the peak RSS of a process
running the controller on the resident runtime. Each comparison runs in the same loop, in
turns; a verdict per target closes the report.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..bundle.conventions import Conventions
from ..bundle.variants import ACTION_CONTEXT, ACTION_STEP, VARIANTS, VISION, VariantSpec
from ..host import fp16
from ..host.flow import euler_update, timesteps
from ..runtime.null_backend import REAL_GEOMETRY, null_sessions
from ..runtime.session import NUMPY_DTYPES

#: Host stages do not depend on the runtime design: a long run does not need more samples.
HOST_REPEATS = 200
#: at most this many floor copies, in turns with (a)'s chunks and spread over the run
FLOOR_SAMPLES = 50


def rss_mb(pid: int | None = None) -> float:
    """Resident set size of a process in MiB (Linux ``/proc``; 0 where unavailable)."""
    try:
        status = Path(f"/proc/{pid or 'self'}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def _timed(fn: Callable[[], object], repeats: int, warmup: int = 2) -> list[float]:
    out = []
    for i in range(repeats + warmup):
        start = time.perf_counter()
        fn()
        if i >= warmup:
            out.append((time.perf_counter() - start) * 1e3)
    return out


def _stats(values: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(arr)), "p95": float(np.percentile(arr, 95)), "n": len(arr)}


# -- (b) the naive orchestrator ---------------------------------------------------------------
def _naive_worker(conn, variant: str, euler_in_graph: bool) -> None:
    """Spawn target of design (b): float32 in, fp16 "native" session, float32 out, pickled."""
    sessions = null_sessions(VARIANTS[variant], euler_in_graph=euler_in_graph, dtype="float16")
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        component, feeds = message
        session = sessions[component]
        native = {
            i.name: np.asarray(feeds[i.name]).astype(NUMPY_DTYPES[i.dtype]) for i in session.inputs
        }
        conn.send({k: v.astype(np.float32) for k, v in session.run(native).items()})


class NaivePipeline:
    """Design (b): arrays through the parent, float32 on the wire, a round trip per step."""

    def __init__(self, variant: VariantSpec, conventions: Conventions) -> None:
        from ..runtime.htp_backend import worker_groups

        self.variant = variant
        self.conventions = conventions
        mp = multiprocessing.get_context("spawn")
        self._conns, self._procs = {}, []
        for _, members in worker_groups(variant):
            parent, child = mp.Pipe()
            proc = mp.Process(
                target=_naive_worker,
                args=(child, variant.name, conventions.euler_in_graph),
                daemon=True,
            )
            proc.start()
            child.close()
            self._procs.append((proc, parent))
            for component in members:
                self._conns[component] = parent

    def call(self, component: str, feeds: dict) -> dict:
        conn = self._conns[component]
        conn.send((component, feeds))
        return conn.recv()

    def run_vision(self, pixel_values: np.ndarray) -> np.ndarray:
        return self.call(VISION, {"pixel_values": pixel_values})["image_embeds"]

    def run_action(self, inputs: dict, x0: np.ndarray, steps: int) -> np.ndarray:
        hidden, keys, values = inputs["hidden_states"], [], []
        for split in self.variant.llm_splits:
            out = self.call(split, {"hidden_states": hidden, "attention_bias": inputs["bias"]})
            hidden = out["hidden_out"]
            keys.append(out["keys"])
            values.append(out["values"])
        ctx = self.call(
            ACTION_CONTEXT, {"keys": np.concatenate(keys), "values": np.concatenate(values)}
        )
        pad = inputs["pad"]
        keep = (np.float32(1.0) - pad.reshape(1, 1, -1)).astype(np.float32)
        name = "next_trajectory" if self.conventions.euler_in_graph else "velocity"
        x = x0
        for t in timesteps(steps):
            feeds = {
                "trajectory": x,
                "timestep": np.full((1,), t, np.float32),
                "k_ctx": ctx["k_ctx"],
                "v_ctx": ctx["v_ctx"],
                "encoder_attention_mask": inputs["mask"],
                "action_dim_is_pad": pad,
            }
            x = euler_update(x, self.call(ACTION_STEP, feeds)[name], keep, steps, self.conventions)
        return x

    def pids(self) -> list[int]:
        return [p.pid for p, _ in self._procs if p.pid is not None]

    def close(self) -> None:
        for _, conn in self._procs:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc, conn in self._procs:
            proc.join(10)
            if proc.exitcode is None:
                proc.kill()
                proc.join(5)
            conn.close()
            proc.close()
        self._procs = []


# -- host stages ------------------------------------------------------------------------------
def _embed_stage(variant: VariantSpec, hidden: int, out_hidden: np.ndarray) -> Callable[[], object]:
    """The prompt embedding of one chunk into the arena's hidden_states (fp16)."""
    from ..host.prompt import PromptPlan

    rng = np.random.default_rng(0)
    seq, img = variant.seq_len, variant.image_tokens
    per_cam = img // variant.num_cameras
    # two <im_patch> runs as in the real prompt (<im_start> patches <im_end>, twice)
    patches = np.concatenate([np.arange(1, 1 + per_cam), np.arange(3 + per_cam, 3 + 2 * per_cam)])
    plan = PromptPlan(  # a plan of the real sizes; its contents do not matter for timing
        instruction="bench",
        input_ids=np.zeros(seq, np.int64),
        valid=np.ones(seq, bool),
        is_image=np.zeros(seq, bool),
        state_positions=np.arange(img + 5, img + 5 + variant.state_dim),
        patch_positions=patches,
        base_embeddings=rng.standard_normal((seq, hidden)).astype(np.float16).astype(np.float32),
        attention_bias=np.zeros((1, 1, seq, seq), np.float32),
        encoder_mask=np.ones((1, seq), np.float32),
        state_base_id=0,
        num_valid=seq,
        add_image_to_patch_embedding=True,
        state_rows=rng.standard_normal((256, hidden)).astype(np.float16).astype(np.float32),
    )
    bins = np.arange(variant.state_dim)
    feats = rng.standard_normal((img, hidden)).astype(np.float16)
    return lambda: plan.embed(bins, feats, out=out_hidden)


def _read_elsewhere(variant: VariantSpec, component: str, output: str) -> bool:
    """Whether a process other than the session's own worker reads this output."""
    if component == VISION:
        return True  # image_embeds: the host builds hidden_states from it
    splits = variant.llm_splits
    if component in splits:  # K/V: the action worker; hidden_out: the next split, if any
        return output != "hidden_out" or component != splits[-1]
    return False  # k_ctx/v_ctx feed action_step, its output the Euler loop: same worker


def floor_bytes(variant: VariantSpec, steps: int, euler_in_graph: bool = True) -> dict:
    """Bytes the resident runtime must move per chunk: per session call the library's input
    copy and its output copy, plus one copy into the arena of every output that another
    process reads (image_embeds, hidden_out of splits 0..2, every split's K/V layers).

    Outputs read in the process that produced them need no arena copy: action_context's
    k_ctx/v_ctx go straight into action_step in the action worker, action_step's output into
    the Euler loop there, and the last split's hidden_out is read by nobody. (Counting an arena
    copy of every output, as this floor first did, added 14.3 / 14.1 / 53.9 MiB a chunk for
    lp_vtp_sd / grid_sampler / fused at their default flow steps: bytes no correct design
    moves, which made the floor easier to meet.)
    """
    sessions = null_sessions(variant, euler_in_graph=euler_in_graph, dtype="float16")
    calls = {c: 1 for c in sessions}
    calls[ACTION_STEP] = steps
    total = {"inputs": 0, "outputs": 0, "arena": 0}

    def nbytes(info) -> int:
        return int(np.prod(info.shape)) * np.dtype(NUMPY_DTYPES[info.dtype]).itemsize

    for component, session in sessions.items():
        total["inputs"] += sum(nbytes(i) for i in session.inputs) * calls[component]
        total["outputs"] += sum(nbytes(o) for o in session.outputs) * calls[component]
        total["arena"] += sum(
            nbytes(o) for o in session.outputs if _read_elsewhere(variant, component, o.name)
        ) * calls[component]
    total["total"] = total["inputs"] + total["outputs"] + total["arena"]
    return total


def _copy_timer(nbytes: int) -> Callable[[], object]:
    """A plain numpy copy of ``nbytes`` (through 32 MiB buffers, beyond the caches)."""
    block = min(nbytes, 32 << 20)
    src = np.ones(block, np.uint8)
    dst = np.zeros(block, np.uint8)
    full, rest = divmod(nbytes, block)

    def copy() -> None:
        for _ in range(full):
            np.copyto(dst, src)
        if rest:
            np.copyto(dst[:rest], src[:rest])

    return copy


# -- the run ----------------------------------------------------------------------------------
def bench_variant(
    variant: VariantSpec, chunks: int, naive_chunks: int, steps: int | None = None
) -> dict:
    """Time host stages, design (a) and design (b) for one variant; returns the JSON record."""
    from ..runtime.htp_backend import ResidentPipeline

    steps = steps or variant.default_flow_steps
    conventions = Conventions()
    record: dict = {"variant": variant.name, "flow_steps": steps, "geometry": dict(REAL_GEOMETRY),
                    "seq_len": variant.seq_len, "chunks": chunks, "naive_chunks": naive_chunks}
    shape = (1, variant.horizon, variant.max_action_dim)
    x0 = np.random.default_rng(0).standard_normal(shape).astype(np.float32)

    resident = ResidentPipeline.open_null(variant, conventions, call_timeout_s=120.0)
    try:
        pixels = resident.input_buffer("pixel_values")
        hidden = resident.input_buffer("hidden_states")
        embed = _embed_stage(variant, hidden.shape[-1], hidden)
        repeats = min(chunks, HOST_REPEATS)
        record["host"] = {"embed": {**_stats(_timed(embed, repeats)),
                                    "kernel": fp16.kernel()}}
        # the floor copy runs in turns with (a)'s chunks, so a change of load during the run
        # hits both sides of the ratio (hundreds of MB a copy: spread samples suffice)
        record["floor_bytes"] = floor_bytes(variant, steps, conventions.euler_in_graph)
        copy = _copy_timer(record["floor_bytes"]["total"])
        copy()  # first touch of its buffers
        stride = -(-chunks // FLOOR_SAMPLES)
        # preallocated: growing Python lists would show up as RSS growth in long runs
        stamps = np.zeros((chunks, 3), np.float64)
        floor_ms = np.zeros(-(-chunks // stride), np.float64)
        warmup = min(3, chunks)
        rss: dict[str, float] = {}
        for i in range(chunks + warmup):
            if i in (warmup, warmup + chunks // 2):
                key = "start" if i == warmup else "mid"
                rss[f"parent_{key}"] = rss_mb()
                rss[f"workers_{key}"] = sum(rss_mb(p) for p in resident.worker_pids().values())
            t0 = time.perf_counter()
            resident.run_vision()
            t1 = time.perf_counter()
            resident.run_action(x0, steps)
            t2 = time.perf_counter()
            if i >= warmup:
                stamps[i - warmup] = (t0, t1, t2)
                if (i - warmup) % stride == 0:
                    t3 = time.perf_counter()
                    copy()
                    floor_ms[(i - warmup) // stride] = (time.perf_counter() - t3) * 1e3
        rss["parent_end"] = rss_mb()
        rss["workers_end"] = sum(rss_mb(p) for p in resident.worker_pids().values())
        record["rss_mb"] = rss
    finally:
        resident.close()
    ms = np.diff(stamps, axis=1) * 1e3
    record["resident"] = {
        "vision": _stats(ms[:, 0]), "llm+action": _stats(ms[:, 1]), "total": _stats(ms.sum(1))
    }
    record["floor"] = {"plain copy": _stats(floor_ms)}
    record["floor_ratio"] = record["resident"]["total"]["median"] / max(
        record["floor"]["plain copy"]["median"], 1e-9)

    naive = NaivePipeline(variant, conventions)
    try:
        geometry = {**variant.expected_dims(), **REAL_GEOMETRY}
        seq, width = geometry["S"], geometry["H"]
        inputs = {
            "hidden_states": np.zeros((1, seq, width), np.float32),
            "bias": np.zeros((1, 1, seq, seq), np.float32),
            "mask": np.ones((1, seq), np.float32),
            "pad": np.zeros((1, variant.max_action_dim), np.float32),
        }
        pixel_f32 = np.zeros(pixels.shape, np.float32)
        naive_times: dict[str, list[float]] = {"vision": [], "llm+action": [], "total": []}
        for i in range(naive_chunks + 1):
            t0 = time.perf_counter()
            naive.run_vision(pixel_f32)
            t1 = time.perf_counter()
            naive.run_action(inputs, x0, steps)
            t2 = time.perf_counter()
            if i:
                naive_times["vision"].append((t1 - t0) * 1e3)
                naive_times["llm+action"].append((t2 - t1) * 1e3)
                naive_times["total"].append((t2 - t0) * 1e3)
    finally:
        naive.close()
    record["naive"] = {k: _stats(v) for k, v in naive_times.items()}
    record["ratio"] = record["naive"]["total"]["median"] / max(
        record["resident"]["total"]["median"], 1e-9
    )
    return record


def format_record(r: dict) -> str:
    lines = [
        f"== {r['variant']}: S={r['seq_len']}, H={r['geometry']['H']}, "
        f"KV {r['geometry']['L']}x{r['seq_len']}x{r['geometry']['KV']} fp16, "
        f"{r['flow_steps']} flow steps; {r['chunks']} chunks (a), {r['naive_chunks']} chunks (b)",
        f"{'stage':<32} {'median ms':>10} {'p95 ms':>10}",
    ]
    for group, title in (("host", "host"), ("resident", "(a) resident shm"),
                         ("naive", "(b) naive pipes"), ("floor", "floor")):
        for stage, s in r[group].items():
            lines.append(f"{title + ' ' + stage:<32} {s['median']:>10.2f} {s['p95']:>10.2f}")
    fb = r["floor_bytes"]
    lines.append(
        f"floor: {fb['total'] / 2**20:.1f} MiB per chunk (library: inputs "
        f"{fb['inputs'] / 2**20:.1f} MiB + outputs {fb['outputs'] / 2**20:.1f} MiB; into the "
        f"arena {fb['arena'] / 2**20:.1f} MiB); (a)/floor {r['floor_ratio']:.2f}x"
    )
    lines.append(
        f"(b)/(a) overhead ratio: {r['ratio']:.1f}x; (a) per chunk "
        f"{r['resident']['total']['median']:.2f} ms (judged against its memory floor above, "
        "not an absolute target)"
    )
    rss = r["rss_mb"]
    for who, title in (("parent", "orchestrator"), ("workers", "6 workers")):
        start, mid, end = (rss[f"{who}_{k}"] for k in ("start", "mid", "end"))
        lines.append(
            f"RSS (a) {title}: {start:.1f} -> {end:.1f} MiB over {r['chunks']} chunks "
            f"({end - start:+.2f}; {end - mid:+.2f} over the second half)"
        )
    return "\n".join(lines)
