"""``molmoact2 bench``: host overhead of the resident runtime vs a naive orchestrator, one run.

Both designs run null sessions (no compute, outputs of the real MolmoAct2 tensor sizes, fp16
like the HTP), so what is timed is everything but the NPU:

(a) resident: the real worker code (``runtime/worker.py``) with the null session loader, the
    shared-memory arena and 9-byte control frames; the Euler loop runs in the action worker.
(b) naive: one process per session group too, but every call pickles its float32 feeds
    through a pipe, the worker converts them to fp16 and its outputs back to float32, and the
    orchestrator makes a round trip per Euler step (k_ctx/v_ctx go out every step).

Host stages both designs share (two 256×256 frames through ``host.images.preprocess``, the
prompt embedding into the fp16 arena) are timed separately. Each stage runs in its own loop:
interleaving them (as the policy does) adds cache and scheduling effects of this machine to
whichever stage follows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .host.conventions import Conventions
from .host.flow import euler_update, timesteps
from .runtime.null_backend import REAL_GEOMETRY, null_sessions
from .runtime.session import NUMPY_DTYPES
from .variants import ACTION_CONTEXT, ACTION_STEP, VARIANTS, VISION, VariantSpec

#: Per-chunk runtime-overhead targets on the 2-core x86 dev box (issue "HTP resident runtime").
TARGET_MS = {"lp_vtp_sd": 5.0, "grid_sampler": 10.0, "fused": 25.0}
TARGET_RATIO = 10.0
#: Host stages do not depend on the runtime design: a long run does not need more samples.
HOST_REPEATS = 200


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
        from .runtime.htp_backend import worker_groups

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
def _host_stages(variant: VariantSpec, hidden: int, out_pixels: np.ndarray,
                 out_hidden: np.ndarray) -> dict[str, Callable[[], object]]:
    """Callables for the host work every design does: preprocess, prompt embedding."""
    stages: dict[str, Callable[[], object]] = {}
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(2)]
    from .host.images import preprocess
    from .host.prompt import PromptPlan

    stages["preprocess"] = lambda: preprocess(
        frames, size=variant.image_size, patch=variant.patch_size, out=out_pixels
    )
    seq, img = variant.seq_len, variant.image_tokens
    plan = PromptPlan(  # a plan of the real sizes; its contents do not matter for timing
        instruction="bench",
        input_ids=np.zeros(seq, np.int64),
        valid=np.ones(seq, bool),
        is_image=np.zeros(seq, bool),
        state_positions=np.arange(img + 2, img + 2 + variant.state_dim),
        patch_positions=np.arange(1, img + 1),
        base_embeddings=rng.standard_normal((seq, hidden)).astype(np.float32),
        attention_bias=np.zeros((1, 1, seq, seq), np.float32),
        encoder_mask=np.ones((1, seq), np.float32),
        state_base_id=0,
        num_valid=seq,
        add_image_to_patch_embedding=True,
        state_rows=rng.standard_normal((256, hidden)).astype(np.float32),
    )
    bins = np.arange(variant.state_dim)
    feats = np.zeros((img, hidden), np.float16)
    stages["embed"] = lambda: plan.embed(bins, feats, out=out_hidden)
    return stages


# -- the run ----------------------------------------------------------------------------------
def bench_variant(
    variant: VariantSpec, chunks: int, naive_chunks: int, steps: int | None = None
) -> dict:
    """Time host stages, design (a) and design (b) for one variant; returns the JSON record."""
    from .runtime.htp_backend import ResidentPipeline

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
        host = _host_stages(variant, hidden.shape[-1], pixels, hidden)
        repeats = min(chunks, HOST_REPEATS)
        record["host"] = {name: _stats(_timed(fn, repeats)) for name, fn in host.items()}
        # preallocated: growing Python lists would show up as RSS growth in long runs
        stamps = np.zeros((chunks, 3), np.float64)
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
        rss["parent_end"] = rss_mb()
        rss["workers_end"] = sum(rss_mb(p) for p in resident.worker_pids().values())
        record["rss_mb"] = rss
    finally:
        resident.close()
    ms = np.diff(stamps, axis=1) * 1e3
    record["resident"] = {
        "vision": _stats(ms[:, 0]), "llm+action": _stats(ms[:, 1]), "total": _stats(ms.sum(1))
    }

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
    target = TARGET_MS.get(variant.name)
    record["target_ms"] = target
    record["meets_target"] = bool(
        target is not None
        and record["resident"]["total"]["median"] <= target
        and record["ratio"] >= TARGET_RATIO
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
                         ("naive", "(b) naive pipes")):
        for stage, s in r[group].items():
            lines.append(f"{title + ' ' + stage:<32} {s['median']:>10.2f} {s['p95']:>10.2f}")
    target = r.get("target_ms")
    verdict = "meets" if r["meets_target"] else "misses"
    lines.append(
        f"(b)/(a) overhead ratio: {r['ratio']:.1f}x; (a) per chunk "
        f"{r['resident']['total']['median']:.2f} ms (target <= {target} ms and >= "
        f"{TARGET_RATIO:.0f}x: {verdict})"
    )
    rss = r["rss_mb"]
    for who, title in (("parent", "orchestrator"), ("workers", "6 workers")):
        start, mid, end = (rss[f"{who}_{k}"] for k in ("start", "mid", "end"))
        lines.append(
            f"RSS (a) {title}: {start:.1f} -> {end:.1f} MiB over {r['chunks']} chunks "
            f"({end - start:+.2f}; {end - mid:+.2f} over the second half)"
        )
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    if getattr(args, "closed_loop", False):
        from .closed_loop import cmd_closed_loop

        return cmd_closed_loop(args)
    records = []
    print(f"molmoact2 bench on {platform.machine()} ({os.cpu_count()} CPUs), "
          f"python {platform.python_version()}, numpy {np.__version__}")
    for name in args.variants or list(VARIANTS):
        record = bench_variant(VARIANTS[name], args.chunks, args.naive_chunks, args.steps)
        records.append(record)
        print(format_record(record), flush=True)
    if args.json:
        payload = {
            "machine": {"arch": platform.machine(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "numpy": np.__version__},
            "variants": records,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


def register(subparsers) -> None:
    """Add ``molmoact2 bench`` to the CLI."""
    p = subparsers.add_parser(
        "bench", help="host overhead: resident shared-memory runtime vs naive pipes (null sessions)"
    )
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS))
    p.add_argument("--chunks", type=int, default=50, help="chunks through design (a); "
                   "use e.g. 10000 to watch RSS over a long run")
    p.add_argument("--naive-chunks", type=int, default=3, help="chunks through design (b)")
    p.add_argument("--steps", type=int, help="flow steps (default: the variant's)")
    p.add_argument("--json", help="write the results to this JSON file")
    from .closed_loop import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_bench)
