"""The results ledger of an evaluation: ``episodes.jsonl``, its settings, then one finished
episode per line.

The first line names the format and holds the run's settings, so a ledger carries what it was
run with wherever it goes; resuming with other settings is refused, so one ledger never mixes
two configurations. A line is written (and fsynced) only when its episode has finished, so an
interrupted run resumes without losing or repeating an episode.

Opening checks everything before anything is written: a file this command did not write is
refused and left as it is, every record is checked against its schema (a bad line is refused
with its number), a key seen twice is refused. A torn last line (the process was killed while
writing) is moved to ``episodes.jsonl.partial``, never deleted; a complete last record that
only lacks its newline is kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..bundle.schema import Field, check_fields, check_list
from ..errors import BundleError, MolmoActError
from ..util.outputs import claim_appended

LEDGER = "episodes.jsonl"
#: the first line's ``format``: what makes a file this command's ledger
FORMAT = "molmoact2-libero-ledger/2"
PARTIAL_SUFFIX = ".partial"
STATUSES = ("ok", "refused")

#: every field a record may have, typed; the required ones are what the summary reads
RECORD_FIELDS = (
    Field("key", str, required=True),
    Field("suite", str, required=True),
    Field("task_id", int, required=True, minimum=0),
    Field("init_index", int, required=True, minimum=0),
    Field("instruction", str),
    Field("status", str, required=True, choices=STATUSES),
    Field("reason", str),
    Field("success", bool, required=True),
    Field("env_seed", int),
    Field("noise_seed", int),
    Field("steps", int, required=True, minimum=0),
    Field("max_steps", int, minimum=0),
    Field("settle_steps", int, minimum=0),
    Field("sim_time_s", float, minimum=0),
    Field("time_mode", str),
    Field("latency_ms", float, minimum=0),
    Field("chunks", int, required=True, minimum=0),
    Field("rows_executed", int, required=True, minimum=0),
    Field("rows_skipped", int, required=True, minimum=0),
    Field("idle_steps", int, required=True, minimum=0),
    Field("largest_command_change", float, minimum=0),
    Field("clipped_steps", int, required=True, minimum=0),
    Field("clipped_values", int, required=True, minimum=0),
    Field("chunk_latency_ms", list, required=True),
    Field("drops", dict, required=True),
    Field("video", str),
    Field("policy_diagnostics", dict),
    Field("timing", dict, required=True),
)
TIMING_FIELDS = (
    Field("wall_s", float, minimum=0), Field("reset_s", float, minimum=0),
    Field("build_s", float, minimum=0), Field("settle_s", float, minimum=0),
    Field("env_step_ms", float, minimum=0), Field("overhead_ms", float, minimum=0),
    Field("video_ms", float, minimum=0), Field("inference_ms", list),
    Field("sim_steps_per_s", float, minimum=0),
)


class LedgerError(MolmoActError):
    """The output folder holds results that cannot be continued."""


def check_record(path: Path, number: int, record: Any, run: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """One episode record against its schema; the error names the file and the line."""
    where = f"line {number}: "
    fix = "; fix or remove that line, or choose a new --out folder"
    if not isinstance(record, dict):
        raise LedgerError(f"{path}:{number} is a JSON {type(record).__name__}, not an episode "
                          f"record{fix}")
    try:
        check_fields(path, record, RECORD_FIELDS, where=where)
        check_list(path, record["chunk_latency_ms"], "chunk_latency_ms", float, where=where)
        check_fields(path, record["timing"], TIMING_FIELDS, where=where + "timing.")
        check_list(path, record["timing"].get("inference_ms", []), "timing.inference_ms", float,
                   where=where)
        for name, count in record["drops"].items():
            check_fields(path, {f"drops.{name}": count},
                         (Field(f"drops.{name}", int, minimum=0),), where=where)
    except BundleError as exc:
        raise LedgerError(f"{exc}{fix}") from None
    key = f"{record['suite']}/{record['task_id']}/{record['init_index']}"
    if record["key"] != key:
        raise LedgerError(f"{path}:{number}: key {record['key']!r} is not its suite/task/init "
                          f"{key!r}{fix}")
    if record["success"] and record["status"] != "ok":
        raise LedgerError(f"{path}:{number}: a {record['status']} episode cannot be a "
                          f"success{fix}")
    if run and "time_mode" in record and "time_mode" in run \
            and record["time_mode"] != run["time_mode"]:
        raise LedgerError(f"{path}:{number} ran in time mode {record['time_mode']!r}, the "
                          f"ledger's settings say {run['time_mode']!r}{fix}")
    return record


class Ledger:
    """Append-only episode records in ``folder/episodes.jsonl`` after its settings line."""

    def __init__(self, folder: Path | str, run: dict[str, Any] | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LEDGER
        self.records: list[dict[str, Any]] = []
        self.run: dict[str, Any] = dict(run or {})
        self._keys: set[str] = set()
        self._needs_newline = False
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise LedgerError(f"{self.path} is not a regular file (a link or a folder); this "
                              "command writes its own ledger: choose a new --out folder")
        if self.path.exists():
            self._open_existing(run)
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._create()

    def _create(self) -> None:
        """The settings line, written whole or not at all (a new file, never a replaced one)."""
        tmp = self.folder / f".{LEDGER}.new"
        if tmp.is_symlink():
            raise LedgerError(f"{tmp} is a link; remove it or choose a new --out folder")
        header = json.dumps({"format": FORMAT, "run": self.run}, sort_keys=True,
                            separators=(",", ":")) + "\n"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)  # fails if the ledger appeared meanwhile: never replaced
        except FileExistsError:
            raise LedgerError(f"{self.path} appeared while this run started; is another run "
                              "writing to this --out?") from None
        finally:
            tmp.unlink(missing_ok=True)
        claim_appended(self.path)

    def _open_existing(self, run: dict[str, Any] | None) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        torn = b""
        parsed: list[tuple[int, Any]] = []
        for number, raw in enumerate(lines, 1):
            parsed.append((number, self._parse(raw, number)))
        if tail:
            try:
                parsed.append((len(lines) + 1, json.loads(tail)))
                self._needs_newline = True  # complete: kept, the next write ends its line
            except (ValueError, UnicodeDecodeError):
                torn = tail
        if not parsed:
            raise LedgerError(f"{self.path} is not a ledger of molmoact2 libero (no settings "
                              "line); it is left as it is: choose a new --out folder")
        number, header = parsed[0]
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            old = isinstance(header, dict) and "key" in header
            raise LedgerError(
                f"{self.path} is not a ledger of molmoact2 libero" + (
                    " in this format (written before the ledger carried its settings)"
                    if old else f" (line 1 is not its settings line {{\"format\": \"{FORMAT}\""
                    ", ...})") + "; it is left as it is: choose a new --out folder")
        if not isinstance(header.get("run"), dict):
            raise LedgerError(f"{self.path}:1: run is not an object of settings; choose a new "
                              "--out folder")
        old_run = header["run"]
        for number, record in parsed[1:]:
            rec = check_record(self.path, number, record, old_run)
            if rec["key"] in self._keys:
                first = next(n for n, r in parsed[1:] if r["key"] == rec["key"])
                raise LedgerError(f"{self.path}:{number} repeats episode {rec['key']} of line "
                                  f"{first}; remove one of them or choose a new --out folder")
            self._keys.add(rec["key"])
            self.records.append(rec)
        if run is not None:
            diff = sorted(k for k in set(old_run) | set(run) if old_run.get(k) != run.get(k))
            if diff:
                shown = ", ".join(f"{k}: {old_run.get(k)!r} -> {run.get(k)!r}"
                                  for k in diff[:4])
                raise LedgerError(
                    f"{self.folder} holds episodes run with other settings ({shown}); "
                    "resume with the same settings or choose a new --out folder")
        self.run = old_run
        if torn:
            self._set_aside(torn, len(data) - len(tail))

    def _parse(self, raw: bytes, number: int) -> Any:
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            if number == 1:
                raise LedgerError(f"{self.path} is not a ledger of molmoact2 libero (line 1 is "
                                  "not JSON); it is left as it is: choose a new --out "
                                  "folder") from None
            raise LedgerError(f"{self.path}:{number} is not a JSON record ({exc}); fix or "
                              "remove that line, or choose a new --out folder") from None

    def _set_aside(self, torn: bytes, keep: int) -> None:
        """Move a torn last line to ``episodes.jsonl.partial`` (appended), then cut it off."""
        partial = self.path.with_name(LEDGER + PARTIAL_SUFFIX)
        if partial.is_symlink() or (partial.exists() and not partial.is_file()):
            raise LedgerError(f"{partial} is not a regular file; the torn last line of "
                              f"{self.path} cannot be set aside: move it away and run again")
        with open(partial, "ab") as f:
            f.write(torn + b"\n")
            f.flush()
            os.fsync(f.fileno())
        with open(self.path, "r+b") as f:
            f.truncate(keep)

    def done(self) -> set[str]:
        """Keys of the episodes already recorded."""
        return set(self._keys)

    def append(self, record: dict[str, Any]) -> None:
        """Record one finished episode (checked, then durable when this returns)."""
        check_record(self.path, len(self.records) + 2, record, self.run)
        if record["key"] in self._keys:
            raise LedgerError(f"episode {record['key']} is in the ledger already")
        line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
        if self._needs_newline:
            line = "\n" + line
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._needs_newline = False
        self._keys.add(record["key"])
        self.records.append(record)

    def pending(self, keys: Iterable[str]) -> list[str]:
        """``keys`` without those already recorded, in order."""
        return [k for k in keys if k not in self._keys]
