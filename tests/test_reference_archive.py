"""The committed reference archive is what docs/reference_bundle.md says: deterministic, its
files the ones MANIFEST.json lists, and the fixture unpacks nothing outside its folder."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from reference_helpers import REFERENCE_ARCHIVE, extract_reference_bundle

needs_archive = pytest.mark.skipif(not REFERENCE_ARCHIVE.is_file(),
                                   reason="no committed reference archive")


@needs_archive
def test_archive_members_are_sorted_and_carry_no_owner_or_time():
    with tarfile.open(REFERENCE_ARCHIVE, "r:xz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert all(n == "reference_bundle" or n.startswith("reference_bundle/") for n in names)
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", ""), m.name
        assert m.isfile() or m.isdir() or m.islnk(), m.name


@needs_archive
def test_every_file_is_the_one_the_manifest_lists(reference_bundle):
    manifest = json.loads((reference_bundle / "MANIFEST.json").read_text())
    files = {str(p.relative_to(reference_bundle)) for p in reference_bundle.rglob("*")
             if p.is_file()} - {"MANIFEST.json"}
    assert files == set(manifest["files"])
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((reference_bundle / name).read_bytes()).hexdigest() == digest, name
    # one end-to-end case per observation x instruction x action_mode x flow steps
    assert len(manifest["cases"]) == 3 * len(manifest["instructions"]) * 2 * 2
    assert {c["fits"] for c in manifest["cases"]} == {True, False}


def _archive_with(tmp_path: Path, name: str, linkname: str | None = None) -> Path:
    path = tmp_path / "bad.tar.xz"
    with tarfile.open(path, "w:xz") as tar:
        info = tarfile.TarInfo(name)
        if linkname is None:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
        else:
            info.type, info.linkname = tarfile.SYMTYPE, linkname
            tar.addfile(info)
    return path


@pytest.mark.parametrize("name, link", [("../escape.txt", None), ("/abs.txt", None),
                                        ("reference_bundle/link", "/etc/passwd")])
def test_extraction_refuses_members_outside_its_folder(tmp_path, name, link):
    archive = _archive_with(tmp_path, name, link)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(ValueError, match="refusing member"):
        extract_reference_bundle(archive, dest)
    assert not (tmp_path / "escape.txt").exists()
    assert list(dest.iterdir()) == []


@needs_archive
def test_graphs_carry_no_exporter_provenance(reference_bundle):
    """Stack traces in node metadata would name the exporting machine's paths and make the
    bytes depend on where the exporter ran."""
    graphs = sorted(reference_bundle.rglob("*.onnx"))
    assert len(graphs) == 14
    for graph in graphs:
        data = graph.read_bytes()
        assert b"pkg.torch.onnx.stack_trace" not in data, graph
        assert b'.py", line ' not in data, graph
