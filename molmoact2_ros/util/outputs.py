"""Where a command may write: one policy for every output path of the package.

A command replaces only what this package wrote. Every folder the package writes into holds a
marker, ``.molmoact2-output`` (JSON), naming the files it wrote there with their size and
SHA-256; a bag folder it recorded has the marker inside, naming the bag's files. ``--force``
replaces such a file or bag only while it is still what was written; anything else at an
output path (a user's file, a folder that merely looks like a bag, a symlink) is refused,
naming it, before any work starts. Nothing here deletes a file it cannot show is its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from ..errors import MolmoActError

MARKER = ".molmoact2-output"
WRITTEN_BY = "molmoact2_ros"
#: files a rosbag2 writer leaves in its folder (what an interrupted recording may hold)
BAG_PATTERNS = ("metadata.yaml", "*.mcap", "*.db3", "*.db3-*")


class OutputRefused(MolmoActError):
    """An output path that holds something this package did not write (or a symlink)."""


# -- the marker -----------------------------------------------------------------------------------

def _read_marker(folder: Path) -> dict[str, Any] | None:
    path = folder / MARKER
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != WRITTEN_BY or \
            not isinstance(data.get("files"), dict):
        return None
    return data


def _write_marker(folder: Path, data: dict[str, Any]) -> None:
    path = folder / MARKER
    if path.is_symlink():
        raise OutputRefused(f"{path} is a symlink; remove it (the package keeps its list of "
                            "written files there)")
    _atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def _digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"size": path.stat().st_size, "sha256": h.hexdigest()}


def _register(path: Path, entry: dict[str, Any] | None) -> None:
    """Record (or, with ``None``, forget) ``path`` in its folder's marker."""
    folder = path.parent
    data = _read_marker(folder) or {"written_by": WRITTEN_BY, "files": {}}
    if entry is None:
        if path.name not in data["files"]:
            return
        del data["files"][path.name]
        if not data["files"] and "folder" not in data:  # nothing of ours left: no marker
            (folder / MARKER).unlink()
            return
    else:
        data["files"][path.name] = entry
    _write_marker(folder, data)


def replace_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and move it into place in one step
    (a reader never sees half a file; an interrupt leaves the old one)."""
    _atomic(Path(path), data)


def _atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- what is ours ---------------------------------------------------------------------------------

def _foreign_in_folder(path: Path, kind: str) -> str:
    """'' when ``path`` is a folder of ``kind`` this package wrote (a recorded bag, a tiny
    bundle) and still holds only what it wrote; else what is not (named)."""
    marker = _read_marker(path)
    if marker is None or marker.get("folder") != kind:
        listing = sorted(p.name for p in path.iterdir())[:3]
        made = "record" if kind == "rosbag2" else "write"
        return (f"it is a folder this package did not {made} (no {MARKER} marker; holds "
                f"{', '.join(listing)}{', ...' if len(listing) == 3 else ''})")
    files = marker["files"]
    for entry in sorted(path.rglob("*")):
        name = entry.relative_to(path).as_posix()
        if entry.name == MARKER or (entry.is_dir() and not entry.is_symlink()):
            continue
        if entry.is_symlink() or not entry.is_file():
            return f"it holds {name}, which this package did not write"
        if name in files:
            if _digest(entry) != files[name]:
                return f"its {name} changed since it was written"
        elif marker.get("complete") or not any(fnmatch(name, p) for p in BAG_PATTERNS):
            return f"it holds {name}, which this package did not write"
    return ""


def _entry_for(path: Path) -> dict[str, Any] | None:
    """What the nearest marker above ``path`` (its folder's, or a written folder's a few
    levels up, e.g. a tiny bundle's) records of it; None when none names it."""
    folder = path.parent
    for _ in range(4):
        marker = _read_marker(folder)
        if marker is not None:
            entry = marker["files"].get(path.relative_to(folder).as_posix())
            if entry is not None:
                return entry
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


def _foreign_file(path: Path) -> str:
    """'' when ``path`` is a file this package wrote and nobody changed since; else why not."""
    entry = _entry_for(path)
    if entry is None:
        return "this package did not write it"
    if entry.get("append"):
        return ""
    try:
        same = _digest(path) == entry
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    return "" if same else "it changed since this package wrote it"


def _refuse_symlink(path: Path, what: str) -> None:
    if path.is_symlink():
        raise OutputRefused(f"{what} {path} is a symlink (to {os.readlink(path)}); outputs are "
                            "never written through a link: give the real path or a new one")


def check_file(path: str | os.PathLike, *, force: bool, what: str,
               create_parent: bool = False) -> Path:
    """Before any work: a file output at ``path`` may be written. Refused: a symlink, a
    folder, a file this package did not write (even with ``force``), one it wrote without
    ``force``, and a missing folder (unless ``create_parent``). Writes nothing."""
    path = Path(os.path.expanduser(str(path)))
    _refuse_symlink(path, what)
    if not os.path.lexists(path):
        parent = path.parent
        _refuse_symlink_parent(parent, what, path)
        if not create_parent and not parent.is_dir():
            raise OutputRefused(f"{what} {path}: the folder {parent} does not exist; create it "
                                "or give another path")
        if parent.exists() and not parent.is_dir():
            raise OutputRefused(f"{what} {path}: {parent} is a file, not a folder")
        return path
    if path.is_dir():
        raise OutputRefused(f"{what} {path} is a folder; give a file name")
    why = _foreign_file(path)
    if why:
        raise OutputRefused(f"{what} {path} exists and {why}; it is never replaced, even with "
                            "--force: give a new path or move it away")
    if not force:
        raise OutputRefused(f"{what} {path} exists already (written by an earlier run); give a "
                            "new path or pass --force to replace it")
    return path


def _refuse_symlink_parent(parent: Path, what: str, path: Path) -> None:
    if parent.is_symlink() and not parent.exists():
        raise OutputRefused(f"{what} {path}: its folder {parent} is a dangling symlink")


def check_folder(path: str | os.PathLike, *, what: str) -> Path:
    """Before any work: a folder the command writes files into (``--report``): not a
    symlink, not a file. Its files are checked one by one with :func:`check_file`."""
    path = Path(os.path.expanduser(str(path)))
    _refuse_symlink(path, what)
    if path.exists() and not path.is_dir():
        raise OutputRefused(f"{what} {path} is a file; give a folder")
    return path


def check_bag(path: str | os.PathLike, *, force: bool, what: str) -> Path:
    """Before any work: a new bag folder at ``path`` may be recorded (its folder must exist);
    see :func:`check_written_folder`."""
    path = Path(os.path.expanduser(str(path)))
    if not os.path.lexists(path) and not path.parent.is_dir():
        raise OutputRefused(f"{what} {path}: folder {path.parent} does not exist")
    return check_written_folder(path, force=force, what=what, kind="rosbag2")


# -- writing and removing -------------------------------------------------------------------------

def remove(path: str | os.PathLike, *, what: str, kind: str = "rosbag2") -> None:
    """Remove an earlier output of this package at ``path`` (a file or a recorded bag),
    after checking again that it is one; a missing path is fine."""
    path = Path(path)
    _refuse_symlink(path, what)
    if not path.exists():
        return
    if path.is_dir():
        if any(path.iterdir()):
            why = _foreign_in_folder(path, kind)
            if why:
                raise OutputRefused(f"{what} {path} is not removed: {why}")
            shutil.rmtree(path)
        else:
            path.rmdir()
        return
    why = _foreign_file(path)
    if why:
        raise OutputRefused(f"{what} {path} is not replaced: {why}")
    path.unlink()
    _register(path, None)


@contextmanager
def writing(path: str | os.PathLike, *, what: str) -> Iterator[Path]:
    """Yields a temporary path beside ``path`` to write the output to (e.g. a plot's
    ``savefig``); on success it replaces ``path`` in one step and is recorded as written.
    An existing file at ``path`` is replaced only if this package wrote it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _refuse_symlink(path, what)
    if os.path.lexists(path):
        if path.is_dir():
            raise OutputRefused(f"{what} {path} is a folder; give a file name")
        why = _foreign_file(path)
        if why:
            raise OutputRefused(f"{what} {path} is not replaced: {why}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix or ".tmp",
                               dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _register(path, _digest(path))


def write_file(path: str | os.PathLike, data: bytes | str, *, what: str) -> Path:
    """Write ``data`` to ``path`` in one step and record it as this package's."""
    with writing(path, what=what) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def claim_appended(path: str | os.PathLike) -> None:
    """Record ``path`` as a file this package appends to (a ledger): its content grows, so
    only its name is kept; call when creating it."""
    path = Path(path)
    entry = (_read_marker(path.parent) or {"files": {}})["files"].get(path.name)
    if entry is None or not entry.get("append"):
        _register(path, {"append": True})


def begin_bag(path: str | os.PathLike) -> None:
    """Mark the folder a bag writer has just created as a bag this package is recording."""
    _write_marker(Path(path), {"written_by": WRITTEN_BY, "folder": "rosbag2",
                               "complete": False, "files": {}})


def seal_bag(path: str | os.PathLike) -> None:
    """Record the closed bag's files (size and SHA-256) in its marker."""
    seal_folder(path, "rosbag2")


def seal_folder(path: str | os.PathLike, kind: str) -> None:
    """Record every file under the finished folder ``path`` (a bag, a tiny bundle: its
    ``kind``) with size and SHA-256 in its marker."""
    path = Path(path)
    files = {p.relative_to(path).as_posix(): _digest(p) for p in sorted(path.rglob("*"))
             if p.name != MARKER and p.is_file() and not p.is_symlink()}
    _write_marker(path, {"written_by": WRITTEN_BY, "folder": kind, "complete": True,
                         "files": files})


def check_written_folder(path: str | os.PathLike, *, force: bool, what: str,
                         kind: str) -> Path:
    """Before any work: a folder of ``kind`` (a recorded bag, a tiny bundle) may be written at
    ``path``. An existing one is refused without ``force``; with it, only an empty folder or
    one this package wrote (its marker inside, nothing added or changed since) is replaced.
    Writes nothing."""
    path = Path(os.path.expanduser(str(path)))
    _refuse_symlink(path, what)
    if not path.exists():
        return path
    ours = "a bag this package recorded" if kind == "rosbag2" else "a folder this package wrote"
    if not force:
        raise OutputRefused(f"{what} {path} exists already; choose a new path or pass --force "
                            f"to replace it (only {ours} is replaced)")
    if path.is_dir() and not any(path.iterdir()):
        return path
    why = f"it is a file, not {ours}" if not path.is_dir() else _foreign_in_folder(path, kind)
    if why:
        raise OutputRefused(f"{what} {path} is not replaced, even with --force: {why}; give a "
                            "new path or move it away")
    return path


def replace_folder(source: Path, target: Path, *, what: str, kind: str) -> None:
    """Move the finished folder ``source`` (sealed as ``kind``) to ``target``, replacing an
    earlier folder of the package there (never anything else)."""
    if _foreign_in_folder(source, kind):
        raise OutputRefused(f"{what} {source} is not a folder this package wrote")
    remove(target, what=what, kind=kind)
    Path(source).rename(target)


def move_bag(source: Path, target: Path, *, what: str) -> None:
    """Move a finished bag folder this package recorded to ``target``, replacing an earlier
    bag of the package there (never anything else)."""
    replace_folder(source, target, what=what, kind="rosbag2")


def keep_previous(target: Path) -> Path | None:
    """Before a file the user asked to rewrite (``conventions --write``) is replaced, keep it
    beside itself as ``NAME.<sha256 prefix>.orig``: named by its content, so never written
    over another kept version. Returns the kept copy (None when there was no file)."""
    target = Path(target)
    if not target.is_file():
        return None
    data = target.read_bytes()
    kept = target.with_name(f"{target.name}.{hashlib.sha256(data).hexdigest()[:12]}.orig")
    if kept.is_symlink() or (kept.exists() and kept.read_bytes() != data):
        raise OutputRefused(f"{kept} is in the way of keeping the previous {target.name}; "
                            "move it away")
    if not kept.exists():
        _atomic(kept, data)
    return kept
