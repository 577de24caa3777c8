"""The results ledger of an evaluation: ``episodes.jsonl``, one finished episode per line.

A line is written (and fsynced) only when its episode has finished, so an interrupted run
resumes from the ledger without losing or repeating an episode: the interrupted episode has
no line and runs again. A torn last line (the process was killed while writing) is cut off on
open. ``run.json`` beside it holds the settings the episodes were run with; resuming with other
settings is refused, so one ledger never mixes two configurations.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import MolmoActError

LEDGER = "episodes.jsonl"
RUN = "run.json"


class LedgerError(MolmoActError):
    """The output folder holds results that cannot be continued."""


class Ledger:
    """Append-only episode records in ``folder/episodes.jsonl`` (plain JSON dicts)."""

    def __init__(self, folder: Path | str, run: dict[str, Any] | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / LEDGER
        self.records: list[dict[str, Any]] = []
        if run is not None:
            self._check_run(run)
        self._load()

    def _check_run(self, run: dict[str, Any]) -> None:
        path = self.folder / RUN
        if path.exists():
            old = json.loads(path.read_text(encoding="utf-8"))
            diff = sorted(k for k in set(old) | set(run) if old.get(k) != run.get(k))
            if diff and self.path.exists() and self.path.stat().st_size:
                shown = ", ".join(f"{k}: {old.get(k)!r} -> {run.get(k)!r}" for k in diff[:4])
                raise LedgerError(
                    f"{self.folder} holds episodes run with other settings ({shown}); "
                    "resume with the same settings or choose a new --out folder")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good = data.rfind(b"\n") + 1
        if good < len(data):  # a torn last line: the episode it belonged to runs again
            with open(self.path, "r+b") as f:
                f.truncate(good)
        for n, line in enumerate(data[:good].splitlines(), 1):
            if not line.strip():
                continue
            try:
                self.records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise LedgerError(f"{self.path}:{n} is not a JSON record ({exc}); fix or "
                                  "remove that line, or choose a new --out folder") from None

    def done(self) -> set[str]:
        """Keys of the episodes already recorded."""
        return {r["key"] for r in self.records}

    def append(self, record: dict[str, Any]) -> None:
        """Record one finished episode (durable when this returns)."""
        if record["key"] in self.done():
            raise LedgerError(f"episode {record['key']} is in the ledger already")
        line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)

    def pending(self, keys: Iterable[str]) -> list[str]:
        """``keys`` without those already recorded, in order."""
        done = self.done()
        return [k for k in keys if k not in done]
