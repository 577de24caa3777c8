"""The committed reference bundle (docs/reference_bundle.md): where it is, and a safe unpack."""

from __future__ import annotations

from pathlib import Path

#: The reference bundle exported from LeRobot's MolmoAct2 (docs/reference_bundle.md).
REFERENCE_ARCHIVE = Path(__file__).parent / "reference_bundle.tar.xz"


def extract_reference_bundle(archive: Path, dest: Path) -> Path:
    """Unpack the reference archive into ``dest``; members must stay inside it."""
    import tarfile

    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts or not (
                    member.isfile() or member.isdir() or member.islnk()):
                raise ValueError(f"{archive}: refusing member {member.name!r}")
        tar.extractall(dest, filter="data")
    return dest / "reference_bundle"
