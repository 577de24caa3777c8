"""Controller-level faults: inference errors, failed swaps and rollbacks, clock jumps, param
storms during swaps. Each asserts the message, the published count and (fixture) no leaks."""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest

from molmoact2_ros.control.controller import ACTIVE, INACTIVE, UNCONFIGURED
from molmoact2_ros.control.sync import ApproxTimeSync

pytestmark = pytest.mark.usefixtures("no_leaks")
SECOND = 1_000_000_000



# -- group 1: the inference thread cannot die silently ---------------------------------------
def test_unexpected_exception_in_predict_is_counted_and_the_thread_keeps_running(rig, caplog):
    ctl = rig.start(worker=True)
    ctl.policy.fail = ValueError("operands could not be broadcast")
    rig.observe()
    deadline = time.monotonic() + 60
    while not ctl.drops["inference_error"] and time.monotonic() < deadline:
        time.sleep(0.005)
    d = ctl.diagnostics()
    assert d["level"] == "error" and "ValueError: operands could not be broadcast" in d["message"]
    assert not rig.published and ctl.thread_alive()
    ctl.policy.fail = None
    rig.clock.now += 1
    rig.observe()
    assert rig.wait_published(1) and ctl.diagnostics()["level"] == "ok"


def test_publisher_error_is_caught_in_the_loop(rig, caplog):
    calls = []

    def flaky(out):
        calls.append(out)
        if len(calls) == 1:
            raise RuntimeError("publisher's context is invalid")
        rig.published.append(out)

    rig.ctl._publish = flaky
    ctl = rig.start(worker=True)
    rig.observe()
    deadline = time.monotonic() + 60
    while not ctl.counts["inference_errors"] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert "publisher's context is invalid" in ctl.diagnostics()["message"]
    rig.clock.now += 1
    rig.observe()
    assert rig.wait_published(1) and ctl.thread_alive() and len(calls) == 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_inference_thread_that_ends_anyway_is_reported_and_restarted(rig, caplog):
    ctl = rig.start(worker=True)
    ctl.policy.fail = SystemExit("thread killed")  # not an Exception: ends the thread
    with caplog.at_level(logging.ERROR, "molmoact2_ros"):
        rig.observe()
        ctl._thread.join(5)
    assert not ctl.thread_alive()
    d = ctl.diagnostics()
    assert d["level"] == "error" and "inference thread" in d["message"]
    assert "inference thread ended unexpectedly" in caplog.text
    ctl.policy.fail = None
    ctl.tick()  # the node's timer: restarts the thread
    assert ctl.thread_alive() and ctl.counts["inference_thread_restarts"] == 1
    rig.clock.now += 1
    rig.observe()
    assert rig.wait_published(1) and len(rig.published) == 1


def test_live_instruction_that_fails_to_apply_keeps_the_previous_one(rig, caplog):
    ctl = rig.start()
    long = "one two three four five six seven eight nine ten " * 3
    ctl.settings = ctl.settings.with_changes({"instruction": long})
    ctl._pending_live["instruction"] = long
    rig.observe()
    with caplog.at_level(logging.ERROR, "molmoact2_ros"):
        out = ctl.process_pending()
    assert out is not None and out.chunk.instruction == "pick up the bowl"
    assert "instruction not applied, the previous one stays" in caplog.text
    assert ctl.settings["instruction"] == "pick up the bowl"  # settings say what runs
    assert ctl.diagnostics()["values"]["count.refused_live_changes"] == 1


# -- group 3: failed swap and failed rollback ---------------------------------------------------
def test_failed_swap_rolls_back_and_keeps_publishing(rig):
    ctl = rig.start()
    rig.failing.add("fused")
    assert ctl.request({"variant": "fused"}) == (True, "", "reload")
    ctl.wait_for_swap(60)
    ok, reason, variant = rig.swaps[-1]
    assert not ok and "loading fused failed (cannot load fused); rolled back" in reason
    assert variant == "grid_sampler" == ctl.settings["variant"] == ctl.policy.variant
    assert ctl.diagnostics()["level"] == "warn" and ctl.counts["swap_failures"] == 1
    rig.observe()
    assert ctl.process_pending().chunk.variant == "grid_sampler" and len(rig.published) == 1


def test_failed_rollback_leaves_a_defined_state(rig):
    ctl = rig.start()
    rig.failing |= {"fused", "grid_sampler"}
    ctl.apply({"variant": "fused"})
    ctl.wait_for_swap(60)
    assert ctl.policy is None and ctl.state == ACTIVE
    d = ctl.diagnostics()
    assert d["level"] == "error" and "no runtime is loaded" in d["message"]
    assert d["values"]["runtime_loaded"] is False
    rig.observe()
    assert ctl.process_pending() is None and ctl.drops["no_runtime"] == 1
    assert not rig.published
    ctl.deactivate()
    assert ctl.state == INACTIVE
    with pytest.raises(Exception, match="no runtime is loaded"):
        ctl.activate()
    ctl.cleanup()
    assert ctl.state == UNCONFIGURED


def test_after_a_failed_rollback_a_new_variant_loads(rig):
    ctl = rig.start()
    rig.failing |= {"fused", "grid_sampler"}
    ctl.apply({"variant": "fused"})
    ctl.wait_for_swap(60)
    assert ctl.policy is None
    ok, reason = ctl.validate({"variant": "lp_vtp_sd"})
    assert ok, reason
    assert ctl.apply({"variant": "lp_vtp_sd"}) == "reload"
    ctl.wait_for_swap(60)
    assert ctl.policy.variant == "lp_vtp_sd" == ctl.settings["variant"]
    assert ctl.diagnostics()["level"] == "ok"
    rig.observe()
    assert ctl.process_pending().chunk.variant == "lp_vtp_sd" and len(rig.published) == 1


def test_cleanup_racing_a_swap_leaves_nothing_loaded(rig):
    ctl = rig.start()
    rig.load_delay_s = 0.2
    ctl.apply({"variant": "lp_vtp_sd"})
    ctl.deactivate()
    ctl.cleanup()
    ctl.wait_for_swap(60)
    assert ctl.state == UNCONFIGURED and ctl.policy is None
    loads = [e for e in rig.events if e[0] == "load"]
    closes = [e for e in rig.events if e[0] == "close"]
    assert len(loads) == len(closes) and not rig.published


# -- group 4: live changes during a swap ---------------------------------------------------------
def test_flow_steps_changed_during_a_swap_reach_the_new_sessions(rig):
    ctl = rig.start()
    rig.load_delay_s = 0.3
    ctl.apply({"variant": "lp_vtp_sd"})
    time.sleep(0.05)
    assert ctl.swapping
    assert ctl.request({"flow_steps": 4}) == (True, "", "live")
    ctl.wait_for_swap(60)
    assert ctl.settings["flow_steps"] == 4 and ctl.policy.flow_steps == 4
    rig.observe()
    assert ctl.process_pending().chunk.flow_steps == 4 and len(rig.published) == 1


def test_instruction_and_variant_during_a_swap_are_refused_with_a_reason(rig):
    ctl = rig.start()
    rig.load_delay_s = 0.3
    ctl.apply({"variant": "fused"})
    time.sleep(0.05)
    ok, reason, how = ctl.request({"instruction": "a b c d e f g h i j"})  # too long for fused
    assert not ok and "swap to fused is in progress" in reason and "instruction" in reason
    ok, reason, _ = ctl.request({"variant": "lp_vtp_sd"})
    assert not ok and "swap to fused is in progress" in reason
    ctl.wait_for_swap(60)
    assert ctl.settings["instruction"] == "pick up the bowl" == ctl.policy.instruction
    ok, reason = ctl.validate({"instruction": "a b c d e f g h i j"})
    assert not ok and "too long for variant fused" in reason
    assert ctl.settings["variant"] == ctl.policy.variant == "fused"


def test_revert_after_failed_swap_is_a_no_op(rig):
    ctl = rig.start()
    rig.failing.add("fused")
    ctl.apply({"variant": "fused"})
    ctl.wait_for_swap(60)
    loads = len(rig.events)
    # what the node sets back after the failure: the running values, accepted without effect
    assert ctl.request({"variant": "grid_sampler", "backend": "onnx"}) == (True, "", "live")
    assert len(rig.events) == loads and not ctl.swapping


def test_param_storm_during_swaps_never_splits_settings(rig):
    ctl = rig.start(worker=True)
    rig.load_delay_s = 0.02
    stop = threading.Event()
    refused = []

    def storm(seed):
        rnd = random.Random(seed)
        while not stop.is_set():
            change = rnd.choice([
                {"variant": rnd.choice(["grid_sampler", "lp_vtp_sd", "fused"])},
                {"flow_steps": rnd.randint(1, 12)},
                {"instruction": rnd.choice(["pick up the bowl", "open the drawer"])},
                {"context_suffix.llm": rnd.choice(["", "_w4a16"])},
            ])
            ok, reason, _ = ctl.request(change)
            if not ok:
                refused.append(reason)

    threads = [threading.Thread(target=storm, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for _ in range(40):
        rig.clock.now += SECOND // 100
        rig.observe()
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(5)
    ctl.wait_for_swap(60)
    time.sleep(0.05)
    ctl.process_pending()  # apply anything still queued
    assert ctl.policy.variant == ctl.settings["variant"]
    assert ctl.policy.flow_steps == ctl.settings["flow_steps"]
    assert ctl.policy.instruction == ctl.settings["instruction"]
    # refused only for the two documented reasons: a swap running, no onnx graph for _w4a16
    unexpected = [r for r in refused if "in progress" not in r and "is incomplete" not in r]
    assert not unexpected and any("in progress" in r for r in refused)
    assert rig.published
    assert ctl.thread_alive()


# -- group 2: time --------------------------------------------------------------------------------
def test_one_future_stamp_does_not_stop_output(rig):
    ctl = rig.start()
    rig.observe(offset_ns=3600 * SECOND)
    assert ctl.drops["future_stamp"] == 1
    for _ in range(20):
        rig.clock.now += SECOND // 10
        rig.observe()
        ctl.process_pending()
    assert len(rig.published) == 20 and ctl.diagnostics()["values"]["drop.future_stamp"] == 1


def test_out_of_order_observation_is_never_published(rig):
    ctl = rig.start()
    rig.observe()
    assert ctl.process_pending() is not None
    rig.observe(offset_ns=-SECOND // 10)
    assert ctl.process_pending() is None and ctl.drops["out_of_order"] == 1
    assert len(rig.published) == 1


def test_clock_jump_back_resets_sync_slot_and_triggers(rig):
    ctl = rig.start()
    emitted = []
    sync = ApproxTimeSync(3, SECOND // 20, 10, emitted.append)
    ctl.attach_sync(sync)
    for s in range(3):
        sync.add(s, rig.clock.now, None)
    rig.observe()
    ctl.process_pending()
    ctl.tick()
    rig.clock.now -= 990 * SECOND  # sim-time reset
    ctl.tick()
    assert ctl.counts["clock_resets"] == 1 and "clock jumped back 990.000 s" in (
        ctl.diagnostics()["values"]["last_clock_event"])
    for _ in range(20):
        rig.clock.now += SECOND // 10
        for s in range(3):
            sync.add(s, rig.clock.now, None)
        rig.observe()
        ctl.process_pending()
    assert len(emitted) == 21 and len(rig.published) == 21
    assert "drop.sync_out_of_order" not in ctl.diagnostics()["values"]


def test_rate_and_chunk_consumed_triggers_fire_after_a_jump_back(rig):
    ctl = rig.start()
    for trigger in ("rate", "chunk_consumed"):
        ctl.apply({"trigger": trigger})
        rig.observe()
        ctl.process_pending()
        ctl.tick()
        ctl._wake.clear()
        rig.clock.now -= 500 * SECOND
        ctl.on_time_jump(-500 * SECOND)  # what the node's rclpy jump callback calls
        ctl.tick()
        assert ctl._wake.is_set(), trigger
    assert ctl.counts["clock_resets"] == 2


def test_clock_jump_forward_recovers_by_itself(rig):
    ctl = rig.start(worker=False)
    ctl.apply({"trigger": "rate"})
    rig.observe()
    ctl.tick()
    rig.clock.now += 60 * SECOND
    ctl.tick()
    assert ctl.counts["clock_jumps_forward"] == 1 and ctl._wake.is_set()
    assert ctl.process_pending() is None and ctl.drops["stale"] == 1  # taken before the jump
    rig.observe()
    assert ctl.process_pending() is not None and len(rig.published) == 1
    assert ctl.counts.get("clock_resets", 0) == 0


def test_sync_out_of_order_count_reaches_diagnostics(rig):
    ctl = rig.start()
    sync = ApproxTimeSync(3, SECOND // 20, 10, lambda m: None)
    ctl.attach_sync(sync)
    for s in range(3):
        sync.add(s, rig.clock.now, None)
    sync.add(0, rig.clock.now - SECOND, None)
    assert ctl.diagnostics()["values"]["drop.sync_out_of_order"] == 1
    ctl.attach_sync(None)  # deactivate: the count is kept
    assert ctl.diagnostics()["values"]["drop.sync_out_of_order"] == 1
