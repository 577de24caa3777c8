"""What diagnostics say: the status level and message, the watchdog that notices a stall
while inputs arrive, and the numbers /diagnostics carries.

A mixin of ``Controller`` (``controller.py``), sharing its state.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .swap import ACTIVE

#: Watchdog: nothing published for this many expected periods while inputs arrive is a WARN,
#: three times as many an ERROR (diagnostics name the largest drop counter).
STALL_PERIODS = 10
#: How the watchdog's status message begins (readers count stalls by it).
STALL_MESSAGE = "nothing published for"
#: chunks in a row without an overlap (blend set) before diagnostics warn
NO_OVERLAP_WARN_CHUNKS = 5


class HealthReport:
    """Mixin of ``Controller``: diagnostics data and the stall watchdog."""

    def diagnostics(self) -> dict[str, Any]:
        """Plain data for /diagnostics: status level, message and key values."""
        s = self.settings
        values: dict[str, Any] = {
            "lifecycle_state": self.state,
            "variant": s["variant"],
            "backend": s["backend"],
            **{f"context_suffix.{g}": v or '""' for g, v in s.suffixes().items()},
            "flow_steps": getattr(self.policy, "flow_steps", s.flow_steps()),
            "trigger": s["trigger"],
            "runtime_loaded": self.policy is not None,
            "observation_age_s": round(self.last_observation_age_s, 4),
            "latency_estimate_s": round(self.latency_estimate_s, 4),
            "latency_max_s": round(self._latency.maximum(), 4),
            "execution.start": s["execution.start"],
            "execution.blend": s["execution.blend"],
            "execution.action_type": s["execution.action_type"],
            **{f"last_switch.{k}": round(v, 6) if isinstance(v, float) else v
               for k, v in self.last_switch.items()},
        }
        if self.last_clock_event:
            values["last_clock_event"] = self.last_clock_event
        drops = Counter(self.drops)
        sync_drops = self._sync_drops_before + (
            self._sync.dropped_out_of_order if self._sync is not None else 0)
        if sync_drops:
            drops["sync_out_of_order"] = sync_drops
        values.update({f"count.{k}": v for k, v in sorted(self.counts.items())})
        values.update({f"drop.{k}": v for k, v in sorted(drops.items())})
        values.update({f"latency_ms.{k}": round(v, 3) for k, v in self.last_latency_ms.items()})
        load_stats = getattr(getattr(self.policy, "pipeline", None), "load_stats", None)
        for worker, st in (load_stats() if callable(load_stats) else {}).items():
            values[f"load_s.{worker}"] = round(float(st.get("load_s", 0.0)), 3)
            values[f"peak_rss_mib.{worker}"] = round(float(st.get("peak_rss_mib", 0.0)), 1)
        level, message = self.health
        stall = self._stall(drops)
        if stall is not None and level != "error":
            level, message = stall
        elif not self.thread_alive():
            level = "error"
            message = "inference thread is not running; restarting it on the next tick"
        elif level == "ok" and not s["instruction"]:
            level, message = "warn", "no instruction: set the 'instruction' parameter"
        elif level == "ok" and self._in_past:
            level, message = "warn", (
                f"the last chunk was entirely due when ready (latency > chunk duration; "
                f"{self.drops['chunk_in_past']} so far): set execution.start=auto or "
                "execution.start=receipt")
        elif level == "ok" and self._no_overlap >= NO_OVERLAP_WARN_CHUNKS \
                and s["execution.blend"] != "none":
            level, message = "warn", (
                f"execution.blend={s['execution.blend']} but the last {self._no_overlap} chunks "
                "met no executing rows to blend with: raise execution.overlap_s or use "
                "trigger=chunk_consumed")
        elif level == "ok" and self.drops.get("stale"):
            message = f"{self.drops['stale']} stale observations skipped"
        return {"level": level, "message": message or "running", "values": values}

    def _stall(self, drops: Counter) -> tuple[str, str] | None:
        """Watchdog: inputs kept arriving for ``STALL_PERIODS`` expected periods after the last
        publish and still arrive (WARN; three times as long: ERROR), naming the largest drop
        counter. Inputs that stopped soon after the last publish (a sim reset between episodes,
        a sensor going away) are not a stall, however long the clock runs on."""
        if self.state != ACTIVE or self._swapping or self._last_output_ns is None \
                or self._last_input_ns is None:
            return None
        now = self._clock()
        period_ns = self.expected_period_s() * 1e9
        silent_ns = now - self._last_output_ns
        if silent_ns < 0:  # the clock went back: the new time line is the baseline
            self._last_output_ns = now
            self._last_input_ns = min(self._last_input_ns, now)
            return None
        arriving_ns = self._last_input_ns - self._last_output_ns
        if arriving_ns < STALL_PERIODS * period_ns or \
                now - self._last_input_ns > STALL_PERIODS * period_ns:
            return None
        worst = max(drops.items(), key=lambda kv: kv[1], default=None)
        why = (f"largest drop counter: drop.{worst[0]}={worst[1]}" if worst else
               "no drops counted; check the trigger and the input topics")
        level = "error" if arriving_ns >= 3 * STALL_PERIODS * period_ns else "warn"
        return level, (f"{STALL_MESSAGE} {silent_ns / 1e9:.1f} s "
                       f"({silent_ns / period_ns:.0f} expected periods) while inputs arrive; "
                       + why)
