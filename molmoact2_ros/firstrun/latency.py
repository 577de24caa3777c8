"""The device report's latency step: per component over many chunks, and inside the worker
the library's NPU execute time apart from its copies and float conversions and ours."""

from __future__ import annotations

import time

import numpy as np

from .status import PASS


def _stats(values: list[float]) -> dict:
    arr = np.asarray(values, np.float64)
    return {"mean": float(arr.mean()), "p50": float(np.percentile(arr, 50)),
            "p95": float(np.percentile(arr, 95)), "n": int(arr.size)}


def chunk_latency(pipeline, variant, chunks: int) -> dict:
    """Per component over ``chunks`` chunks: the orchestrator's time, and inside the worker
    the library's NPU execute time apart from its copies/conversions and ours."""
    x0 = np.zeros((1, variant.horizon, variant.max_action_dim), np.float32)
    samples: dict[str, list[float]] = {}
    for i in range(chunks + 1):  # the first chunk warms up and is not counted
        if i == 1:
            pipeline.session_timings()  # drop the warm-up's calls
        start = time.perf_counter()
        pipeline.run_vision()
        pipeline.run_action(x0, variant.default_flow_steps)
        wall = (time.perf_counter() - start) * 1e3
        if i:
            for key, value in {**pipeline.last_timings_ms, "chunk": wall}.items():
                samples.setdefault(key, []).append(value)
    calls = {}
    stats = pipeline.load_stats()
    elements = {c: n for s in stats.values() for c, n in s.get("float_elements", {}).items()}
    for component, entries in pipeline.session_timings().items():
        arr = np.asarray(entries, np.float64)
        call, inference, execute = arr[:, 0], arr[:, 1], arr[:, 2] / 1e3
        reported = bool(np.any(execute > 0))
        library = inference - execute if reported else np.full_like(inference, np.nan)
        row = {
            "calls": int(arr.shape[0]),
            "worker_ms": float(np.median(call)),
            "library_ms": float(np.median(inference)),
            "npu_execute_ms": float(np.median(execute)) if reported else None,
            "library_copies_ms": float(np.median(library)) if reported else None,
            "our_copies_ms": float(np.median(call - inference)),
            "execute_constant": bool(reported and arr.shape[0] > 2 and np.ptp(execute) == 0),
            "float_elements": int(elements.get(component, 0)),
        }
        if row["float_elements"] and reported:
            # float I/O: the library's copies include its per-element conversion
            row["float_conversion_ms"] = row["library_copies_ms"]
            row["ns_per_element"] = 1e6 * row["library_copies_ms"] / row["float_elements"]
        calls[component] = row
    return {"status": PASS, "flow_steps": variant.default_flow_steps,
            "ms": {k: _stats(v) for k, v in samples.items()}, "calls": calls}


