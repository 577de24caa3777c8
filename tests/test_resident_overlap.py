"""The resident runtime's own copies: hand-off before the K/V copy, the protocol around it, and
no fresh pages per call in the workers (real worker processes, null sessions)."""

from __future__ import annotations

import multiprocessing
import os
import platform
import signal
import struct

import numpy as np
import pytest

from molmoact2_ros.bundle.conventions import Conventions
from molmoact2_ros.bundle.variants import COMPONENTS, VARIANTS
from molmoact2_ros.errors import WorkerFailed
from molmoact2_ros.runtime.arena import Arena
from molmoact2_ros.runtime.htp_backend import ResidentPipeline, _Declared
from molmoact2_ros.runtime.layout import plan_arena
from molmoact2_ros.runtime.null_backend import null_sessions
from molmoact2_ros.runtime.protocol import (
    OP_RUN,
    REQUEST,
    RUN_HANDOFF,
    ST_HANDOFF,
    ST_OK,
    WorkerSpec,
    reply,
)
from molmoact2_ros.runtime.session import NUMPY_DTYPES, bind_contracts
from molmoact2_ros.runtime.supervisor import WorkerHandle
from molmoact2_ros.runtime.worker import BoundSession

SMALL = {"H": 8, "KV": 4, "L0": 1, "L1": 2, "L2": 1, "L3": 2, "L": 6, "AH": 2, "AD": 2}


def _small_arena(name: str = "lp_vtp_sd"):
    variant = VARIANTS[name]
    sessions = null_sessions(variant, geometry=SMALL, dtype="float16")
    declared = {c: (s.inputs, s.outputs) for c, s in sessions.items()}
    geometry = bind_contracts({c: _Declared(c, *declared[c]) for c in COMPONENTS},
                              variant.contracts(euler_in_graph=True), variant)
    layout, bindings = plan_arena(declared, variant, geometry, 6)
    return variant, sessions, Arena.create(layout), bindings


class _FreshOutputs:
    """Stands in for the library: every call returns new arrays, output i filled with
    ``10 * call + i + 1``."""

    def __init__(self, session) -> None:
        self.component, self.inputs, self.outputs = session.name, session.inputs, session.outputs
        self.calls = 0

    def infer(self, arrays):
        self.calls += 1
        return [np.full(o.shape, 10 * self.calls + i + 1, NUMPY_DTYPES[o.dtype])
                for i, o in enumerate(self.outputs)]

    def release(self) -> None:
        pass


def test_layout_hands_on_hidden_state_and_drops_the_unread_last_one():
    variant, _, arena, bindings = _small_arena()
    try:
        splits = variant.llm_splits
        for i, split in enumerate(splits[:-1]):
            assert bindings[split].handoff == ("hidden_out",)
            assert bindings[split].outputs["hidden_out"].region == f"hidden_out{i}"
            assert bindings[splits[i + 1]].inputs["hidden_states"].region == f"hidden_out{i}"
        last = bindings[splits[-1]]
        assert last.handoff == () and set(last.outputs) == {"keys", "values"}
        assert f"hidden_out{len(splits) - 1}" not in arena.layout.names
    finally:
        arena.close()


def test_split_hands_on_its_hidden_state_before_it_copies_its_kv():
    variant, sessions, arena, bindings = _small_arena()
    try:
        split = variant.llm_splits[1]  # layers [1, 3) of the K/V buffers
        stand_in = _FreshOutputs(sessions[split])
        bound = BoundSession(stand_in, bindings[split], arena)
        index = bound.output_index
        seen = {}

        def handoff() -> None:
            seen["hidden"] = np.array(arena.view("hidden_out1"))
            seen["keys"] = np.array(arena.view("keys")[1:3])
            seen["values"] = np.array(arena.view("values")[1:3])

        outs = bound.run(handoff)
        assert (seen["hidden"] == 10 + index["hidden_out"] + 1).all()  # in place at hand-off
        assert (seen["keys"] == 0).all() and (seen["values"] == 0).all()  # not yet
        for name in ("keys", "values"):
            np.testing.assert_array_equal(arena.view(name)[1:3], outs[index[name]])
            assert (arena.view(name)[:1] == 0).all() and (arena.view(name)[3:] == 0).all()
        bound.run()  # without a hand-off every output still lands
        assert (arena.view("hidden_out1") == 20 + index["hidden_out"] + 1).all()
        assert (arena.view("keys")[1:3] == 20 + index["keys"] + 1).all()
    finally:
        arena.close()


def _scripted_worker(conn, script: str) -> None:
    """The other end of the protocol, scripted (spawn target)."""
    first = REQUEST.unpack_from(conn.recv_bytes())
    ms = struct.pack("<d", 1.0)
    if script == "die_after_handoff":
        conn.send_bytes(reply(ST_HANDOFF, first[1], ms))
        os.kill(os.getpid(), signal.SIGKILL)
    if script == "late_answers":
        second = REQUEST.unpack_from(conn.recv_bytes())
        for seq in (first[1], second[1]):  # the first request's answers arrive late
            conn.send_bytes(reply(ST_HANDOFF, seq, struct.pack("<d", 10.0 * seq)))
            conn.send_bytes(reply(ST_OK, seq, struct.pack("<d", 100.0 * seq)))
        conn.recv_bytes()  # until the test is done


@pytest.fixture
def scripted():
    """A WorkerHandle whose process runs ``_scripted_worker`` instead of the real worker."""
    mp = multiprocessing.get_context("spawn")
    handles = []

    def start(script: str) -> WorkerHandle:
        spec = WorkerSpec("llm_split0", (), "lp_vtp_sd", Conventions(), loader="null")
        handle = WorkerHandle(spec, 0)
        parent, child = mp.Pipe()
        handle.process = mp.Process(target=_scripted_worker, args=(child, script), daemon=True)
        handle.process.start()
        child.close()
        handle.conn = parent
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.kill()
        handle.finish(0.0)


def test_a_split_dying_after_its_handoff_fails_the_wait_for_its_kv(scripted):
    handle = scripted("die_after_handoff")
    seq = handle.send(OP_RUN, RUN_HANDOFF)
    status, payload = handle.receive(seq, OP_RUN, timeout=30.0, handoff=True)
    assert status == ST_HANDOFF and struct.unpack("<d", payload) == (1.0,)
    with pytest.raises(WorkerFailed, match="SIGKILL") as err:
        handle.receive(seq, OP_RUN, timeout=30.0)
    assert err.value.worker == "llm_split0" and not handle.healthy


def test_late_answers_of_an_interrupted_run_are_skipped(scripted):
    handle = scripted("late_answers")
    handle.send(OP_RUN, RUN_HANDOFF)  # interrupted: never waited for
    seq = handle.send(OP_RUN, RUN_HANDOFF)
    status, payload = handle.receive(seq, OP_RUN, timeout=30.0, handoff=True)
    assert status == ST_HANDOFF and struct.unpack("<d", payload) == (10.0 * seq,)
    status, payload = handle.receive(seq, OP_RUN, timeout=30.0)
    assert status == ST_OK and struct.unpack("<d", payload) == (100.0 * seq,)
    handle.conn.send_bytes(b"done")


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
