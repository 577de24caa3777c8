"""An append-only JSON-lines ledger: one record per finished work item, flushed as it comes,
so an interrupted run resumes from what is on disk without losing or repeating an item."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import MolmoActError


def read_ledger(path: Path, key: str) -> list[dict[str, Any]]:
    """The records of ``path`` (none when it does not exist). A torn last line (the process
    was killed while writing it) is dropped; a record without ``key`` or a second record of
    the same key is refused, naming the line."""
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
        self._trim_torn_tail()
        self._file = self.path.open("a", encoding="utf-8")

    def _trim_torn_tail(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

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
