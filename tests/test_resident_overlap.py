"""The resident runtime's own copies: no fresh pages per call in the workers (real worker
processes, null sessions)."""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest

from molmoact2_ros.runtime.htp_backend import ResidentPipeline
from molmoact2_ros.runtime.null_backend import null_sessions
from molmoact2_ros.variants import VARIANTS


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/stat"),
                    reason="the warm heap is a glibc setting, faults are read from /proc")
def test_workers_reuse_their_pages_across_chunks():
    """The library allocates every output per call; the workers' heap keeps those pages, so a
    chunk after the first ones makes (almost) no page faults. Without it each LLM split took
    one fault per 4 KiB of its 5.2 MiB of outputs on every call."""
    variant = VARIANTS["lp_vtp_sd"]
    with ResidentPipeline.open_null(variant, call_timeout_s=120.0) as pipe:
        assert all(s["heap_warm"] for s in pipe.load_stats().values())
        x0 = np.zeros((1, variant.horizon, variant.max_action_dim), np.float32)
        for _ in range(3):
            pipe.run_vision()
            pipe.run_action(x0, 2)
        pids = pipe.worker_pids()
        before = {w: _minor_faults(pid) for w, pid in pids.items()}
        chunks = 5
        for _ in range(chunks):
            pipe.run_vision()
            pipe.run_action(x0, 2)
        faults = {w: _minor_faults(pid) - before[w] for w, pid in pids.items()}
        sessions = null_sessions(variant, dtype="float16")
        for split in variant.llm_splits:
            pages = sum(int(np.prod(o.shape)) * 2 for o in sessions[split].outputs) // 4096
            assert faults[split] < 0.01 * pages * chunks, faults
