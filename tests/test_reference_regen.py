"""The committed reference bundle is what its exporter writes from the pinned LeRobot commit.

Needs the exporter's own environment (torch, transformers, onnx; reference/requirements.txt)
and a LeRobot checkout named by ``MOLMOACT2_LEROBOT``; skipped otherwise (``make test`` has no
torch). The export takes several minutes on two cores.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPORTER = ROOT / "reference" / "export_reference.py"
REFERENCE_ARCHIVE = ROOT / "tests" / "reference_bundle.tar.xz"


def _members(archive: Path) -> dict[str, str]:
    """Member name -> sha256 of its bytes (hard links resolved to their target's bytes)."""
    out: dict[str, str] = {}
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        by_name = {m.name: m for m in members}
        for m in members:
            target = by_name[m.linkname] if m.islnk() else m
            if target.isfile():
                out[m.name] = hashlib.sha256(tar.extractfile(target).read()).hexdigest()
    return out


@pytest.mark.skipif(not REFERENCE_ARCHIVE.is_file(), reason="no committed reference archive")
def test_regenerated_bundle_is_byte_identical(tmp_path):
    checkout = os.environ.get("MOLMOACT2_LEROBOT")
    if not checkout:
        pytest.skip("MOLMOACT2_LEROBOT names no LeRobot checkout at the pinned commit")
    for module in ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "dashscope"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (reference/requirements.txt)")
    out, archive = tmp_path / "bundle", tmp_path / "reference_bundle.tar.xz"
    run = subprocess.run(
        [sys.executable, str(EXPORTER), "--lerobot", checkout, "--out", str(out),
         "--archive", str(archive)],
        capture_output=True, text=True, timeout=3600, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    want, got = _members(REFERENCE_ARCHIVE), _members(archive)
    assert sorted(got) == sorted(want), (
        f"members differ: only committed {sorted(set(want) - set(got))[:5]}, "
        f"only regenerated {sorted(set(got) - set(want))[:5]}")
    changed = [name for name in want if want[name] != got[name]]
    assert not changed, f"regenerated files differ from the committed ones: {changed[:10]}"
    assert archive.read_bytes() == REFERENCE_ARCHIVE.read_bytes()
