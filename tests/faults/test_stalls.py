"""Silent stalls: a future-stamped (glitched or garbage) frame must not stop all later output,
and output that stops while inputs keep arriving must show up in diagnostics (watchdog)."""

from __future__ import annotations

import pytest

from molmoact2_ros.control.controller import STALL_PERIODS
from molmoact2_ros.control.sync import observation_stamp_ns, observation_sync

pytestmark = pytest.mark.usefixtures("no_leaks")
SECOND = 1_000_000_000
GARBAGE_NS = 2**63 - 1



def _synced_rig(rig):
    """The rig's controller fed through a synchroniser, as the node and replay feed it."""
    ctl = rig.start()
    sync = observation_sync(0.05, 10, lambda items: ctl.on_observation(
        [i.msg for i in items[:2]], items[2].msg, observation_stamp_ns(items)))
    ctl.attach_sync(sync)
    return ctl, sync


def _offer_set(rig, ctl, sync, stamp_ns):
    from controller_fakes import IMAGES, STATE

    for stream, msg in enumerate((IMAGES[0], IMAGES[1], STATE)):
        ctl.offer(sync, stream, stamp_ns, msg)


@pytest.mark.parametrize("ahead_ns", [3600 * SECOND, GARBAGE_NS - 10**18],
                         ids=["clock-glitch-1h", "garbage-2^63"])
def test_a_future_set_never_enters_the_synchroniser(rig, ahead_ns):
    ctl, sync = _synced_rig(rig)
    _offer_set(rig, ctl, sync, min(rig.clock.now + ahead_ns, GARBAGE_NS))
    for _ in range(20):
        rig.clock.now += SECOND // 10
        _offer_set(rig, ctl, sync, rig.clock.now)
        ctl.process_pending()
    assert len(rig.published) == 20
    d = ctl.diagnostics()
    assert d["values"]["drop.future_input"] == 3 and "drop.sync_out_of_order" not in d["values"]
    assert d["level"] == "ok", d


def test_replay_keeps_publishing_after_a_glitched_frame(tiny_root, tmp_path):
    pytest.importorskip("rosbags")
    from replay_helpers import trace

    from molmoact2_ros.control.params import Settings
    from molmoact2_ros.replay.replay import replay, write_observation_bag

    tr = trace(tiny_root, "lp_vtp_sd")
    settings = Settings().with_changes({
        "variant": "lp_vtp_sd", "bundle.lp_vtp_sd": str(tiny_root / "lp_vtp_sd"),
        "backend": "onnx", "instruction": str(tr["instruction"]), "seed": 7})
    frames = [(10**9 + i * SECOND // 2, tr["image_primary"], tr["image_wrist"], tr["state"])
              for i in range(6)]
    # frame 2: every sensor stamps the largest time a ROS stamp holds (int32 seconds)
    frames[2] = (*frames[2], (2**31 - 1) * SECOND)
    bag = tmp_path / "obs"
    write_observation_bag(bag, frames, settings)
    result = replay(bag, settings)
    assert result.drops.get("future_input") == 3
    assert len(result.published) == 5, result.drops


def test_watchdog_names_the_largest_drop_counter(rig):
    """Inputs keep arriving, every observation is stale: WARN, then ERROR, then ok again."""
    ctl, sync = _synced_rig(rig)
    period = ctl.expected_period_s()
    step_ns = SECOND // 20
    steps = 0
    levels = []
    while steps * step_ns < 3 * STALL_PERIODS * period * SECOND + SECOND:
        rig.clock.now += step_ns
        _offer_set(rig, ctl, sync, rig.clock.now - 10 * SECOND)  # 10 s old: stale
        ctl.process_pending()
        levels.append(ctl.diagnostics()["level"])
        steps += 1
    d = ctl.diagnostics()
    assert not rig.published and ctl.drops["stale"] > 0
    assert d["level"] == "error" and "nothing published for" in d["message"], d
    assert f"drop.stale={ctl.drops['stale']}" in d["message"]
    assert levels.index("warn") < levels.index("error")
    for _ in range(3):  # fresh observations: published, the watchdog is quiet
        rig.clock.now += step_ns
        _offer_set(rig, ctl, sync, rig.clock.now)
        ctl.process_pending()
    assert rig.published and ctl.diagnostics()["level"] == "ok"


def test_watchdog_is_quiet_when_no_input_arrives(rig):
    ctl, _ = _synced_rig(rig)
    rig.clock.now += 100 * SECOND  # nothing arrives: that is a sensor problem, not a stall
    assert ctl.diagnostics()["level"] != "error"
    assert "nothing published" not in ctl.diagnostics()["message"]


def _publish_once(rig, ctl, sync):
    _offer_set(rig, ctl, sync, rig.clock.now)
    ctl.process_pending()
    assert rig.published, "the rig's controller did not publish a fresh observation"


def test_inputs_that_stop_soon_after_the_last_output_are_not_a_stall(rig):
    """A sim resetting between episodes: one joint state after the last chunk, then only the
    clock runs on for the reset. Nothing arrives any more: quiet, at every point on the way."""
    from controller_fakes import STATE

    ctl, sync = _synced_rig(rig)
    _publish_once(rig, ctl, sync)
    window_ns = int(STALL_PERIODS * ctl.expected_period_s() * SECOND)
    rig.clock.now += window_ns // 10
    ctl.offer(sync, 2, rig.clock.now, STATE)  # the last input, shortly after the output
    for _ in range(30):  # the clock runs on to three windows without any input
        rig.clock.now += window_ns // 10
        d = ctl.diagnostics()
        assert "nothing published" not in d["message"], d


def test_a_reset_after_a_long_episode_is_not_a_stall(rig):
    """Inputs and outputs flowed for many windows, then sim time jumps back to the start of
    the next episode: the old time line's inputs do not make the new one look stalled."""
    ctl, sync = _synced_rig(rig)
    window_ns = int(STALL_PERIODS * ctl.expected_period_s() * SECOND)
    start = rig.clock.now
    while rig.clock.now < start + 5 * window_ns:
        rig.clock.now += SECOND // 20
        _publish_once(rig, ctl, sync)
    rig.clock.now = start  # the sim's reset
    for _ in range(5):
        rig.clock.now += window_ns // 10
        d = ctl.diagnostics()
        assert "nothing published" not in d["message"], d
