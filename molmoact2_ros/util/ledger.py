"""An append-only JSON-lines ledger: one record per finished work item, flushed as it comes,
so an interrupted run resumes from what is on disk without losing or repeating an item."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import MolmoActError
from .outputs import OutputRefused, claim_appended

PARTIAL = ".partial"


def mend_tail(path: Path) -> Path | None:
    """Make ``path`` (JSON lines) end with a whole line before appending to it. A last
    record that lacks only its newline gets it; a torn last line (the process was killed
    while writing it) is appended to ``path.partial`` and cut from ``path``: set aside, never
    deleted. Returns the ``.partial`` file when something was set aside."""
    path = Path(path)
    if path.is_symlink():
        raise OutputRefused(f"{path} is a symlink; a ledger is never appended through a link")
    if not path.exists():
        return None
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        whole = isinstance(json.loads(tail), dict)
    except ValueError:
        whole = False
    if whole:
        with open(path, "ab") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
        return None
    aside = path.with_name(path.name + PARTIAL)
    if aside.is_symlink():
        raise OutputRefused(f"{aside} is a symlink; remove it (torn ledger lines are set aside "
                            "there)")
    with open(aside, "ab") as f:
        f.write(tail + b"\n")
        f.flush()
        os.fsync(f.fileno())
    claim_appended(aside)
    with open(path, "r+b") as f:
        f.truncate(cut)
    return aside


def read_ledger(path: Path, key: str) -> list[dict[str, Any]]:
    """The records of ``path`` (none when it does not exist). A torn last line (the process
    was killed while writing it) is skipped (``LedgerWriter`` sets it aside); a record
    without ``key`` or a second record of the same key is refused, naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records, seen = [], set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # torn by an interrupt: that item runs again
            raise MolmoActError(f"{path}:{number} is not JSON; remove the line or start a new "
                                "folder") from None
        if not isinstance(record, dict) or key not in record:
            raise MolmoActError(f"{path}:{number} has no {key!r}; it is not this ledger")
        if record[key] in seen:
            raise MolmoActError(f"{path}:{number} repeats {key} {record[key]!r}")
        seen.add(record[key])
        records.append(record)
    return records


class LedgerWriter:
    """Appends one record per line and makes it durable before returning."""

    def __init__(self, path: Path, key: str) -> None:
        self.path = Path(path)
        self.key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keys = {r[key] for r in read_ledger(self.path, key)}
        mend_tail(self.path)
        claim_appended(self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, record: dict[str, Any]) -> bool:
        """Write ``record`` unless its key is already in the ledger; True when written."""
        if record[self.key] in self.keys:
            return False
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.keys.add(record[self.key])
        return True

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
