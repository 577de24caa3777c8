"""When the next chunk is inferred: the rate and chunk_consumed triggers, the latency estimate
they (and ``execution.start=auto``) plan with, and the period the watchdog expects.

A mixin of ``Controller`` (``controller.py``), sharing its state.
"""

from __future__ import annotations

from .execution import LatencyTracker

#: The shortest expected period the watchdog assumes (on_observation has no period of its own).
MIN_EXPECTED_PERIOD_S = 0.1


class TriggerControl:
    """Mixin of ``Controller``: the trigger decisions and the latency they plan with."""

    _latency: LatencyTracker
    latency_estimate_s: float

    def tick(self) -> None:
        """Timer hook (node timer or replay clock) for the rate and chunk_consumed triggers;
        it also restarts the inference thread if it ended and watches the clock."""
        now = self._watch_clock()
        self._ensure_thread()
        trigger = self.settings["trigger"]
        if trigger == "rate":
            if now - self._last_tick_ns >= 1e9 / self.settings["rate_hz"]:
                self._last_tick_ns = now
                self._wake.set()
        elif trigger == "chunk_consumed":
            if self._chunk_started_ns is None:
                self._wake.set()
                return
            horizon_s = self._chunk_rows * self.settings["control_period_s"]
            remaining = horizon_s - (now - self._chunk_started_ns) / 1e9
            if remaining <= self.latency_estimate_s + self.settings["execution.overlap_s"]:
                self._wake.set()

    def inference_requested(self) -> bool:
        """Whether ``tick`` or ``on_observation`` asked for a chunk since the last call (and
        clear it): drivers without the inference thread (the simulator) poll this."""
        requested = self._wake.is_set()
        self._wake.clear()
        return requested

    def _record_latency(self, monotonic_s: float, clock_ns: int, jumps_before: int,
                        cap_s: float) -> None:
        """One latency sample on the monotonic clock; dropped when the node's clock jumped
        (or went back) during the inference; the estimate is the window's p95 in [0, cap]."""
        jumped = self.counts["clock_resets"] + self.counts["clock_jumps_forward"] != jumps_before
        # the node clock disagreeing with the monotonic one by more than a sim-time rate
        # could explain is a jump seen first here (one inference apart)
        jumped = jumped or clock_ns < 0 or abs(clock_ns / 1e9 - monotonic_s) > max(
            1.0, monotonic_s)
        if jumped or not self._latency.add(monotonic_s):
            self.counts["latency_samples_dropped"] += 1
        else:
            self.latency_estimate_s = self._latency.estimate(cap_s)

    def expected_period_s(self) -> float:
        """How often a chunk should come out with the current trigger (watchdog's unit)."""
        s = self.settings
        if s["trigger"] == "rate":
            period = 1.0 / s["rate_hz"]
        elif s["trigger"] == "chunk_consumed":
            period = max(self._chunk_rows, 1) * s["control_period_s"]
        else:
            period = 0.0
        return max(period, self.latency_estimate_s, MIN_EXPECTED_PERIOD_S)
