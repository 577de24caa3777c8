"""Live settings that must reach the policy: seed, mixed batches, an instruction checked
against the variant a reload will load, a reload after a failed rollback, and exceptions of
a check that must become a refusal (the node's parameter callback has no try)."""

from __future__ import annotations

import pytest

from molmoact2_ros.control.controller import ACTIVE

pytestmark = pytest.mark.usefixtures("no_leaks")
LONG = " ".join(["pick up the black bowl between the plate and the ramekin"] * 4)



def test_seed_change_reaches_the_running_policy(rig):
    ctl = rig.start()
    assert ctl.request({"seed": 5}) == (True, "", "live")
    assert ctl.policy.seeds[-1] == 5
    assert ctl.request({"seed": -1}) == (True, "", "live")
    assert ctl.policy.seeds[-1] is None  # -1: random


def test_mixed_batch_applies_live_values_now_and_configure_values_later(rig):
    ctl = rig.start()
    ok, reason, how = ctl.request({"flow_steps": 3, "seed": 9, "sync.slop_s": 0.02})
    assert ok and how == "live+configure", (reason, how)
    assert ctl.policy.flow_steps == 3 and ctl.policy.seeds[-1] == 9
    assert ctl.settings["flow_steps"] == 3 and ctl.settings["sync.slop_s"] != 0.02
    assert ctl.pending_configure == {"sync.slop_s": 0.02}


def test_mixed_reload_and_configure_batch_swaps_now(rig):
    ctl = rig.start()
    ok, reason, how = ctl.request({"variant": "lp_vtp_sd", "sync.queue_size": 3})
    assert ok and how == "reload+configure", (reason, how)
    ctl.wait_for_swap(30)
    assert ctl.policy.variant == "lp_vtp_sd" and ctl.pending_configure == {"sync.queue_size": 3}


def test_instruction_is_checked_against_the_target_variant(rig):
    """Before: passed validation, then the load and the rollback (same instruction) failed."""
    ctl = rig.start()
    rig.failing.add("fused")
    ok, reason = ctl.validate({"variant": "fused", "instruction": LONG})
    assert not ok and "for fused" in reason and "shorten it" in reason, reason
    assert ctl.request({"variant": "fused", "instruction": LONG})[0] is False
    assert ctl.policy is not None and ctl.policy.variant == "grid_sampler"
    assert not rig.swaps


def test_same_variant_after_a_double_load_failure_reloads(rig):
    ctl = rig.start()
    rig.failing |= {"fused", "grid_sampler"}
    ctl.apply({"variant": "fused"})
    ctl.wait_for_swap(30)
    assert ctl.policy is None and ctl.settings["variant"] == "grid_sampler"
    assert "set 'variant' to load one" in ctl.diagnostics()["message"]
    rig.failing.clear()
    assert ctl.request({"variant": "grid_sampler"}) == (True, "", "reload")
    ctl.wait_for_swap(30)
    assert ctl.policy is not None and ctl.policy.variant == "grid_sampler"
    assert ctl.state == ACTIVE and ctl.diagnostics()["level"] == "ok"
    rig.observe()
    assert ctl.process_pending() is not None


def test_exception_from_the_policy_during_a_check_is_a_refusal(rig):
    ctl = rig.start()

    def broken(instruction):
        raise TypeError("argument 'sequence': 'str' object cannot be converted")

    ctl.policy.plan = broken  # a tokenizer bug: not one of our error types
    ok, reason, how = ctl.request({"instruction": "put the bowl away"})
    assert not ok and how == "" and "TypeError" in reason and "cannot be converted" in reason
    assert ctl.settings["instruction"] == "pick up the bowl"
    ok, reason = ctl.validate({"instruction": "put it away"})
    assert not ok and "TypeError" in reason
