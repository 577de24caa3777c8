"""Progress of ``molmoact2 libero`` on stderr, so a person sees that it moves and where.

On a terminal: a bar over the episodes with the running success rate, and below it a status
line of the running episode (its phase, or step, chunk, sim steps/s and elapsed time). On a
pipe or a log: a line for each phase (loading, building the env, reset, settle, running), one
every ``EVERY_STEPS`` steps, and one at least every ``HEARTBEAT_S`` seconds whatever the run is
waiting for (an env build, a slow chunk), so a quiet minute never looks like a hang.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

#: a status line on a pipe every this many steps of an episode
EVERY_STEPS = 50
#: ... and at least this often (s), whatever the run waits for
HEARTBEAT_S = 20.0
#: the terminal's status line is redrawn at most this often (s)
REDRAW_S = 0.2
PHASES = {"build": "building the env", "reset": "resetting to the init state",
          "settle": "settling", "run": "running", "video": "writing the video"}


def _tqdm():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class EpisodeProgress:
    """Phase, step and episode reports from the loop (any thread) turned into output."""

    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None,
                 every_steps: int = EVERY_STEPS, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.every_steps = every_steps
        self.heartbeat_s = heartbeat_s
        self.tty = enabled and self.stream.isatty() and _tqdm() is not None
        self._lock = threading.RLock()
        self.t0 = time.monotonic()
        self._last_line = self.t0
        self._last_draw = 0.0
        self.total = self.done = 0
        self.index = 0
        self.key = ""
        self.text = "starting"
        self._phase_t0 = self.t0
        self._run_t0 = self.t0
        self._bar = self._status = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if enabled and not self.tty:
            self._beat = threading.Thread(target=self._heartbeat, name="libero-progress",
                                          daemon=True)
            self._beat.start()

    # -- what the loop reports ----------------------------------------------------------------
    def phase(self, text: str) -> None:
        """A phase of the whole run (loading, starting the simulator)."""
        with self._lock:
            self.text, self._phase_t0 = text, time.monotonic()
            self._emit(text, force=True)

    def note(self, text: str) -> None:
        """One line that always appears (the plan of the run)."""
        with self._lock:
            self._write(text)

    def start(self, total: int, done: int) -> None:
        """The episode bar: ``total`` episodes, ``done`` of them in the ledger already."""
        with self._lock:
            self.total, self.done = total, done
            if self.tty:
                tqdm = _tqdm()
                self._bar = tqdm(total=total, initial=done, desc="libero", unit="ep",
                                 file=self.stream, leave=False, position=0, dynamic_ncols=True)
                self._status = tqdm(total=0, bar_format="{desc}", file=self.stream,
                                    leave=False, position=1, dynamic_ncols=True)

    def begin(self, spec: Any) -> None:
        with self._lock:
            self.index = self.done + 1
            self.key = spec.key
            self._run_t0 = time.monotonic()

    def episode_phase(self, spec: Any, phase: str) -> None:
        with self._lock:
            self.text, self._phase_t0 = PHASES.get(phase, phase), time.monotonic()
            if phase == "run":
                self._run_t0 = self._phase_t0
            self._emit(self.text, force=True)

    def step(self, spec: Any, obs: Any, rec: Any) -> None:
        with self._lock:
            now = time.monotonic()
            run_s = now - self._run_t0
            rate = obs.step / run_s if run_s > 0 else 0.0
            max_steps = getattr(rec, "max_steps", 0)
            self.text = (f"step {obs.step}/{max_steps}, chunk {getattr(rec, 'chunks', 0)}, "
                         f"{rate:.1f} sim steps/s")
            if self.tty:
                if now - self._last_draw >= REDRAW_S:
                    self._emit(self.text)
            elif obs.step % self.every_steps == 0:
                self._emit(self.text, force=True)

    def finished(self, record: dict, records: list[dict]) -> None:
        """An episode is in the ledger: its outcome, and the success rate so far."""
        with self._lock:
            self.done += 1
            wins = sum(1 for r in records if r["success"])
            rate = f"{wins}/{len(records)} success ({100 * wins / len(records):.0f}%)"
            outcome = "success" if record["success"] else (
                f"refused: {record['reason']}" if record["status"] == "refused" else "failure")
            line = (f"{record['key']}: {outcome} in {record['steps']} steps "
                    f"({record['timing']['wall_s']:.0f} s); {rate}")
            self.text = "done"
            if self._bar is not None:
                self._bar.set_description(f"libero {rate}")
                self._bar.update(1)
            else:
                self._write(line)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for bar in (self._status, self._bar):
                if bar is not None:
                    bar.close()
            self._status = self._bar = None

    # -- output --------------------------------------------------------------------------------
    def _prefix(self) -> str:
        if self.total and self.key:
            return f"libero [{self.index}/{self.total}] {self.key}: "
        return "libero: "

    def _emit(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - (self._run_t0 if self.key else self.t0)
        line = f"{self._prefix()}{text} ({elapsed:.0f} s)"
        if self._status is not None:
            self._status.set_description_str(line, refresh=True)
            self._last_draw = now
        elif force:
            self._write(line)

    def _write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)
        self._last_line = time.monotonic()

    def _heartbeat(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                quiet = time.monotonic() - self._last_line
                if quiet >= self.heartbeat_s:
                    since = time.monotonic() - self._phase_t0
                    self._write(f"{self._prefix()}{self.text} (still; {since:.0f} s in this "
                                f"phase, {time.monotonic() - self.t0:.0f} s in all)")
