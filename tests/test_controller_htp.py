"""The controller over the real resident HTP runtime (fake qai_appbuilder): a killed worker
costs one observation, the runtime restarts and the next chunk is published."""

from __future__ import annotations

import os
import signal

import numpy as np
from htp_helpers import Snapshot, ensure_contexts, fake_env

from molmoact2_ros.bundle.golden import load_npz
from molmoact2_ros.control.controller import Controller
from molmoact2_ros.control.params import Settings


def _reference_chunk(trace, seed) -> np.ndarray:
    from molmoact2_ros.bundle.variants import VARIANTS
    from molmoact2_ros.synth.reference import run_trace
    from molmoact2_ros.synth.writer import reference_for

    model, host = reference_for(VARIANTS["lp_vtp_sd"], 0)
    return run_trace(model, host, primary=trace["image_primary"], wrist=trace["image_wrist"],
                     state=trace["state"], instruction=str(trace["instruction"]), seed=seed,
                     flow_steps=int(trace["flow_steps"]))[0]["chunk"]


def test_killed_worker_is_restarted_by_the_controller(tiny_root, monkeypatch):
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    before = Snapshot.take()
    trace = load_npz(tiny_root / "lp_vtp_sd" / "golden" / "e2e_trace.npz")
    settings = Settings().with_changes({
        "variant": "lp_vtp_sd", "bundle.lp_vtp_sd": str(tiny_root / "lp_vtp_sd"),
        "backend": "htp", "instruction": str(trace["instruction"]), "seed": 7,
    })
    now = {"ns": 10**9}
    published = []
    ctl = Controller(settings, publish=published.append, clock_ns=lambda: now["ns"])
    images = (trace["image_primary"], trace["image_wrist"])
    try:
        ctl.configure()
        ctl.activate(worker=False)
        ctl.on_observation(images, trace["state"], now["ns"])
        first = ctl.process_pending()
        assert first is not None
        values = ctl.diagnostics()["values"]  # per-worker load time and peak RSS
        assert values["load_s.llm_split0"] > 0 and values["peak_rss_mib.action"] > 0
        want = _reference_chunk(trace, seed=[7, now["ns"]])  # noise of (seed, stamp)
        np.testing.assert_allclose(first.actions, want, atol=2e-2)  # fp16 I/O
        pid = ctl.policy.pipeline.worker_pids()["llm_split1"]
        os.kill(pid, signal.SIGKILL)
        ctl.on_observation(images, trace["state"], now["ns"])
        assert ctl.process_pending() is None
        assert ctl.counts["runtime_restarts"] == 1 and ctl.drops["WorkerFailed"] == 1
        assert "llm_split1" in ctl.diagnostics()["message"]
        assert ctl.policy.pipeline.worker_pids()["llm_split1"] != pid
        ctl.on_observation(images, trace["state"], now["ns"])
        assert ctl.process_pending() is not None and len(published) == 2
    finally:
        ctl.shutdown()
    assert Snapshot.take().leaks_since(before) == []
