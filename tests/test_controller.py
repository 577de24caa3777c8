"""The ROS-free node logic: transitions, parameters, staleness, triggers, swap and rollback."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from molmoact2_ros.control.controller import ACTIVE, FINALIZED, INACTIVE, UNCONFIGURED, Controller
from molmoact2_ros.control.params import PARAMS, Settings, apply_kind, validate_changes
from molmoact2_ros.errors import MolmoActError, ObservationError, RuntimeBackendError
from molmoact2_ros.policy import ActionChunk


class FakeRuntime:
    """Stands in for a loaded Policy: records lifecycle events, returns a fixed chunk."""

    def __init__(self, settings, events, fail_predict=None, value=0.1):
        self.name = settings["variant"] + settings["context_suffix.llm"]
        self.events = events
        self.flow_steps = settings.flow_steps() or 10
        self.fail_predict = fail_predict
        self.value = value
        self.closed = False
        self.predicted = []
        self.gate = None
        self.fail_recover = False
        events.append(("load", self.name))

    def predict(self, obs):
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail_predict:
            raise self.fail_predict
        self.predicted.append(obs.stamp_ns)
        actions = np.full((10, 7), self.value, np.float32)
        return ActionChunk(actions, actions, self.name, self.flow_steps, obs.stamp_ns, "task",
                           {"total": 1.0})

    def plan(self, instruction):
        if len(instruction.split()) > 20:
            raise MolmoActError(f"instruction {instruction!r} makes a prompt too long for seq 128")

    def set_instruction(self, instruction):
        self.events.append(("instruction", instruction))

    def set_flow_steps(self, steps):
        self.flow_steps = steps

    def reseed(self, seed):
        pass

    def recover(self):
        self.events.append(("recover", self.name))
        if self.fail_recover:
            raise RuntimeBackendError("respawn failed")
        self.fail_predict = None

    def close(self):
        assert not self.closed, "closed twice"
        self.closed = True
        self.events.append(("close", self.name))


class Clock:
    def __init__(self):
        self.now = 10_000_000_000

    def __call__(self):
        return self.now


@pytest.fixture
def rig(tmp_path):
    for v in ("grid_sampler", "lp_vtp_sd", "fused"):
        (tmp_path / v).mkdir()
    settings = Settings().with_changes(
        {f"bundle.{v}": str(tmp_path / v) for v in ("grid_sampler", "lp_vtp_sd", "fused")}
        | {"backend": "onnx", "instruction": "pick up the bowl"}
    )
    events, published, clock = [], [], Clock()
    failing = set()

    def factory(s):
        if s["variant"] in failing:
            events.append(("load_failed", s["variant"]))
            raise RuntimeBackendError(f"cannot load {s['variant']}")
        return FakeRuntime(s, events)

    ctl = Controller(settings, publish=published.append, policy_factory=factory, clock_ns=clock)
    yield ctl, events, published, clock, failing
    ctl.shutdown()


IMAGES = (np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 3), np.uint8))


def test_transitions(rig):
    ctl, events, published, clock, _ = rig
    assert ctl.state == UNCONFIGURED
    with pytest.raises(MolmoActError, match="cannot activate from state unconfigured"):
        ctl.activate()
    ctl.configure()
    assert ctl.state == INACTIVE and events == [("load", "grid_sampler")]
    ctl.activate()
    assert ctl.state == ACTIVE
    ctl.deactivate()
    assert ctl.state == INACTIVE
    ctl.cleanup()
    assert ctl.state == UNCONFIGURED and events[-1] == ("close", "grid_sampler")
    ctl.configure()
    ctl.shutdown()
    ctl.shutdown()  # idempotent, as SIGINT after on_shutdown may call it twice
    assert ctl.state == FINALIZED and events[-1] == ("close", "grid_sampler")


def test_configure_warms_up_and_fails_on_a_runtime_that_cannot_run(rig):
    ctl, events, *_ = rig
    ctl.configure()
    assert ctl.policy.predicted == [0]
    assert ctl.diagnostics()["values"]["latency_ms.warmup.total"] == 1.0
    ctl.cleanup()
    original = ctl._factory

    def broken(settings):
        runtime = original(settings)
        runtime.fail_predict = RuntimeBackendError("graph vision returned no outputs")
        return runtime

    ctl._factory = broken
    with pytest.raises(RuntimeBackendError, match="no outputs"):
        ctl.configure()
    assert ctl.state == UNCONFIGURED and ctl.policy is None and events[-1][0] == "close"


def test_configure_refuses_invalid_settings(rig):
    ctl, *_ = rig
    ctl.settings = ctl.settings.with_changes({"variant": "nope"})
    with pytest.raises(MolmoActError, match="unknown variant 'nope'"):
        ctl.configure()
    assert ctl.state == UNCONFIGURED and ctl.policy is None


def test_inactive_observations_are_dropped(rig):
    ctl, _, published, clock, _ = rig
    ctl.configure()
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is None and ctl.drops["inactive"] == 1 and not published


def _active(ctl, trigger="on_observation"):
    ctl.settings = ctl.settings.with_changes({"trigger": trigger})
    ctl.configure()
    ctl.activate(worker=False)  # drive process_pending by hand: deterministic


def test_stale_observation_never_acted_on(rig):
    ctl, _, published, clock, _ = rig
    _active(ctl)
    ctl.on_observation(IMAGES, np.zeros(8), clock.now - int(2e9))  # 2 s old, max 0.5 s
    assert ctl.process_pending() is None
    assert ctl.drops["stale"] == 1 and not published and ctl.policy.predicted == [0]  # warm-up
    ctl.on_observation(IMAGES, np.zeros(8), clock.now - int(0.1e9))
    assert ctl.process_pending() is not None and len(published) == 1


def test_newest_only(rig):
    ctl, _, published, clock, _ = rig
    _active(ctl)
    for i in range(3):
        ctl.on_observation(IMAGES, np.zeros(8), clock.now - 1000 + i)
    ctl.process_pending()
    assert ctl.policy.predicted == [0, clock.now - 998] and ctl.drops["superseded"] == 2
    assert ctl.process_pending() is None


def test_non_finite_chunk_is_never_published(rig):
    ctl, _, published, clock, _ = rig
    _active(ctl)
    ctl.policy.value = float("nan")
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is None and not published
    assert ctl.drops["non_finite"] == 1 and ctl.diagnostics()["level"] == "error"


def test_invalid_observation_counted_and_node_survives(rig):
    ctl, _, published, clock, _ = rig
    _active(ctl)
    ctl.policy.fail_predict = ObservationError("state has NaN/inf at index [3]")
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is None and ctl.drops["ObservationError"] == 1
    ctl.policy.fail_predict = None
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is not None


def test_limits_and_step_delta_clamp(rig):
    ctl, _, published, clock, _ = rig
    ctl.settings = ctl.settings.with_changes(
        {"action_max": [0.05] * 7, "action_min": [-1.0] * 7, "max_step_delta": [0.5] * 7}
    )
    _active(ctl)
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    out = ctl.process_pending()
    assert np.all(out.actions == np.float32(0.05)) and out.safety.clamped_to_limits == 70
    assert ctl.counts["clamped_chunks"] == 1


def test_trigger_on_observation_runs_in_the_worker_thread(rig):
    ctl, _, published, clock, _ = rig
    ctl.configure()
    ctl.activate()
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    deadline = time.time() + 5
    while not published and time.time() < deadline:
        time.sleep(0.01)
    assert len(published) == 1 and published[0].sequence == 1


def test_rate_trigger(rig):
    ctl, _, published, clock, _ = rig
    _active(ctl, "rate")
    ctl.settings = ctl.settings.with_changes({"rate_hz": 2.0})
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert not ctl._wake.is_set()  # rate mode: observations alone do not trigger
    ctl.tick()
    assert ctl._wake.is_set()
    ctl._wake.clear()
    clock.now += int(0.2e9)
    ctl.tick()
    assert not ctl._wake.is_set()  # 0.2 s < 0.5 s period
    clock.now += int(0.4e9)
    ctl.tick()
    assert ctl._wake.is_set()


def test_chunk_consumed_trigger(rig):
    ctl, _, published, clock, _ = rig
    _active(ctl, "chunk_consumed")
    ctl.tick()
    assert ctl._wake.is_set()  # nothing running yet: infer now
    ctl._wake.clear()
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    ctl.process_pending()
    ctl.latency_estimate_s = 0.2  # measured inference latency (+ execution.overlap_s 0.1)
    clock.now += int(0.15e9)  # 10 x 0.05 s chunk: 0.35 s left > 0.3 s
    ctl.tick()
    assert not ctl._wake.is_set()
    clock.now += int(0.06e9)  # 0.29 s left <= 0.3 s: start the next inference
    ctl.tick()
    assert ctl._wake.is_set()


def test_live_parameters_apply_without_reload(rig):
    ctl, events, *_ = rig
    _active(ctl)
    ok, reason = ctl.validate({"flow_steps": 4})
    assert ok, reason
    assert ctl.apply({"flow_steps": 4}) == "live" and ctl.policy.flow_steps == 4
    ok, reason = ctl.validate({"instruction": "word " * 30})
    assert not ok and "too long" in reason
    assert ctl.apply({"instruction": "open the drawer"}) == "live"
    assert events[-1] == ("instruction", "open the drawer") and len(
        [e for e in events if e[0] == "load"]) == 1


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"variant": "huge"}, "unknown variant 'huge'"),
        ({"flow_steps": 500}, "out of range"),
        ({"backend": "gpu"}, "unknown backend"),
        ({"context_suffix.llm": "w4a16"}, "must be '' or start with '_'"),
        ({"trigger": "sometimes"}, "choose one of on_observation"),
        ({"action_names": ["a"] * 7}, "7 distinct"),
        ({"action_min": [1.0] * 7, "action_max": [0.0] * 7 }, "action_min must be <="),
        ({"bundle.fused": "/does/not/exist"}, "does not exist"),
    ],
)
def test_bad_values_rejected_with_reason(rig, changes, fragment):
    ctl, *_ = rig
    ok, reason = validate_changes(changes, ctl.settings)
    assert not ok and fragment in reason


def test_unknown_parameters_are_never_rejected(rig):
    ctl, *_ = rig
    assert ctl.validate({"use_sim_time": True}) == (True, "")


def test_swap_releases_old_before_loading_new(rig):
    ctl, events, published, clock, _ = rig
    _active(ctl)
    assert apply_kind({"variant": "lp_vtp_sd"}) == "reload"
    assert ctl.apply({"variant": "lp_vtp_sd"}) == "reload"
    ctl.wait_for_swap(60)
    assert events == [("load", "grid_sampler"), ("close", "grid_sampler"), ("load", "lp_vtp_sd")]
    assert ctl.settings["variant"] == "lp_vtp_sd" and ctl.diagnostics()["level"] == "ok"
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending().chunk.variant == "lp_vtp_sd"


def test_swap_failure_rolls_back(rig):
    ctl, events, published, clock, failing = rig
    done = []
    ctl._on_swap_done = lambda ok, reason, s: done.append((ok, reason, s["variant"]))
    _active(ctl)
    failing.add("fused")
    ctl.apply({"variant": "fused"})
    ctl.wait_for_swap(60)
    assert events == [("load", "grid_sampler"), ("close", "grid_sampler"),
                      ("load_failed", "fused"), ("load", "grid_sampler")]
    assert done and not done[0][0] and "rolled back" in done[0][1] and done[0][2] == "grid_sampler"
    assert ctl.settings["variant"] == "grid_sampler" and ctl.diagnostics()["level"] == "warn"
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is not None


def _start_gated_chunk(ctl, clock):
    """Start a chunk in a thread that blocks inside predict until the gate opens."""
    gate = threading.Event()
    ctl.policy.gate = gate
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    worker = threading.Thread(target=ctl.process_pending)
    worker.start()
    time.sleep(0.05)
    return gate, worker


def test_inference_pauses_during_swap(rig):
    ctl, events, published, clock, _ = rig
    _active(ctl)
    gate, worker = _start_gated_chunk(ctl, clock)
    ctl.apply({"context_suffix.llm": "_w4a16"})
    time.sleep(0.05)
    assert ("close", "grid_sampler") not in events  # a running chunk is never cut off
    gate.set()
    worker.join(5)
    ctl.wait_for_swap(60)
    assert events[-2:] == [("close", "grid_sampler"), ("load", "grid_sampler_w4a16")]
    assert len(published) == 1


def test_configure_kind_changes_wait_for_configure(rig):
    ctl, *_ = rig
    _active(ctl)
    assert ctl.apply({"sync.slop_s": 0.1}) == "configure"
    assert ctl.settings["sync.slop_s"] == 0.05
    ctl.deactivate()
    ctl.cleanup()
    ctl.configure()
    assert ctl.settings["sync.slop_s"] == 0.1


def test_diagnostics_values(rig):
    ctl, _, published, clock, _ = rig
    _active(ctl)
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    ctl.process_pending()
    d = ctl.diagnostics()
    assert d["values"]["count.published"] == 1 and d["values"]["variant"] == "grid_sampler"
    assert d["values"]["latency_ms.total"] == 1.0 and d["level"] == "ok"


def test_param_table_is_consistent():
    names = [p.name for p in PARAMS]
    assert len(names) == len(set(names))
    ok, reason = validate_changes({}, Settings())
    assert ok, reason


def test_worker_failure_restarts_the_runtime(rig):
    from molmoact2_ros.errors import WorkerFailed

    ctl, events, published, clock, _ = rig
    _active(ctl)
    ctl.policy.fail_predict = WorkerFailed("worker llm_split2 died (SIGKILL)", worker="llm_split2")
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is None and not published
    assert events[-1] == ("recover", "grid_sampler") and ctl.counts["runtime_restarts"] == 1
    d = ctl.diagnostics()
    assert d["level"] == "warn" and "llm_split2" in d["message"]
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is not None and ctl.diagnostics()["level"] == "ok"


def test_failed_restart_is_an_error(rig):
    from molmoact2_ros.errors import WorkerFailed

    ctl, events, published, clock, _ = rig
    _active(ctl)
    ctl.policy.fail_predict = WorkerFailed("worker vision hung", worker="vision")
    ctl.policy.fail_recover = True
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    assert ctl.process_pending() is None
    d = ctl.diagnostics()
    assert d["level"] == "error" and "restart failed" in d["message"]


def test_missing_instruction_is_a_diagnostics_warning(rig):
    ctl, *_ = rig
    ctl.settings = ctl.settings.with_changes({"instruction": ""})
    d = ctl.diagnostics()
    assert d["level"] == "warn" and "no instruction" in d["message"]


def test_live_change_does_not_wait_for_a_running_chunk(rig):
    ctl, events, published, clock, _ = rig
    _active(ctl)
    gate, worker = _start_gated_chunk(ctl, clock)
    start = time.monotonic()
    assert ctl.apply({"flow_steps": 3}) == "live"
    assert time.monotonic() - start < 0.5  # answered while the chunk still runs
    assert ctl.policy.flow_steps == 10  # not yet: the running chunk keeps its settings
    gate.set()
    worker.join(5)
    ctl.on_observation(IMAGES, np.zeros(8), clock.now)
    ctl.process_pending()
    assert ctl.policy.flow_steps == 3 and published[-1].chunk.flow_steps == 3
