"""The observation synchroniser of the node and replay: a state is never older than the images
it goes with, and the observation carries its images' stamp, whatever order the three messages
of a step are handled in (the executor takes ready subscriptions in no fixed order)."""

from __future__ import annotations

import itertools

import pytest

from molmoact2_ros.control.sync import (
    IMAGE_STREAMS,
    STATE_STREAM,
    ApproxTimeSync,
    observation_stamp_ns,
    observation_sync,
)

STEP = 50_000_000  # LIBERO's control step, equal to the default sync.slop_s
T = 7 * 10**9


def _sync():
    sets = []
    return observation_sync(0.05, 10, sets.append), sets


def _stamps(items) -> tuple[int, int, int]:
    return tuple(i.stamp_ns for i in items)


def test_images_handled_before_their_state_wait_for_it_not_for_the_previous_one():
    sync, sets = _sync()
    sync.add(STATE_STREAM, T - STEP, "state of the step before")
    sync.add(0, T, "primary")
    sync.add(1, T, "wrist")
    assert sets == []  # the state one step older lies within the slop, yet is not taken
    sync.add(STATE_STREAM, T, "state")
    (items,) = sets
    assert _stamps(items) == (T, T, T)
    assert [i.msg for i in items] == ["primary", "wrist", "state"]
    assert observation_stamp_ns(items) == T


@pytest.mark.parametrize("order", list(itertools.permutations((0, 1, STATE_STREAM))),
                         ids=lambda o: "-".join(map(str, o)))
def test_every_arrival_order_of_a_step_gives_one_set_at_its_stamp(order):
    sync, sets = _sync()
    for k in range(1, 4):  # the sim publishes a state every step, images when it asks
        sync.add(STATE_STREAM, T - k * STEP, k)
    for stream in order:
        sync.add(stream, T, stream)
    (items,) = sets
    assert _stamps(items) == (T, T, T) and observation_stamp_ns(items) == T


def test_a_state_older_than_the_images_is_never_paired_at_any_offset_within_the_slop():
    for offset_ms in (1, 10, 25, 49, 50):
        sync, sets = _sync()
        sync.add(0, T, "primary")
        sync.add(1, T + 3_000_000, "wrist")
        sync.add(STATE_STREAM, T - offset_ms * 1_000_000, "old state")
        assert sets == [], offset_ms


def test_a_state_newer_than_the_images_pairs_and_the_stamp_is_the_earliest_image():
    sync, sets = _sync()  # a recorded bag's layout: wrist 3 ms and state 1 ms after primary
    sync.add(0, T, "primary")
    sync.add(STATE_STREAM, T + 1_000_000, "state")
    sync.add(1, T + 3_000_000, "wrist")
    (items,) = sets
    assert _stamps(items) == (T, T + 3_000_000, T + 1_000_000)
    assert observation_stamp_ns(items) == T


def test_a_state_newer_than_the_slop_does_not_pair():
    sync, sets = _sync()
    sync.add(0, T, "primary")
    sync.add(1, T, "wrist")
    sync.add(STATE_STREAM, T + STEP + 1, "state too late")
    assert sets == []


def test_a_long_run_of_steps_pairs_each_observation_with_its_own_state():
    """States every step, both images every 8th step and handled before that step's state."""
    sync, sets = _sync()
    for k in range(200):
        now = T + k * STEP
        if k % 8 == 0:
            sync.add(1, now, k)
            sync.add(0, now, k)
        sync.add(STATE_STREAM, now, k)
    assert len(sets) == 25
    for n, items in enumerate(sets):
        assert [i.msg for i in items] == [8 * n] * 3
        assert observation_stamp_ns(items) == T + 8 * n * STEP


def test_images_are_the_observation_streams():
    assert IMAGE_STREAMS == (0, 1) and STATE_STREAM == 2


def test_without_not_older_the_closest_state_is_taken_even_if_older():
    """The plain synchroniser (no ``not_older``) keeps message_filters' closest-in-time rule."""
    sets = []
    sync = ApproxTimeSync(3, STEP, 10, sets.append)
    sync.add(2, T - STEP, "old")
    sync.add(0, T, "a")
    sync.add(1, T, "b")
    (items,) = sets
    assert _stamps(items) == (T, T, T - STEP)


@pytest.mark.parametrize("not_older", [(3,), (-1,), (0, 1, 2)])
def test_not_older_must_name_some_but_not_all_streams(not_older):
    with pytest.raises(ValueError, match="not_older"):
        ApproxTimeSync(3, STEP, 10, lambda items: None, not_older=not_older)
