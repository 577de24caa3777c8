"""README and docs/ point only at files in the repository; code cites only docs that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]*\w\.md)\b")
#: Markdown files the package writes (device-report's output), not documents to follow.
OUTPUTS = {"report.md", "device-report.md", "r.md", "summary.md"}


def _resolves(name: str, base: Path) -> bool:
    return any((root / name).is_file() for root in (base, REPO, REPO / "docs"))


@pytest.mark.parametrize("doc", [REPO / "README.md", *DOCS], ids=lambda p: p.name)
def test_links_point_to_files_in_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "#")):
            continue
        path = target.split("#")[0]
        if path.startswith("/") or not (doc.parent / path).resolve().is_relative_to(REPO) \
                or not (doc.parent / path).exists():
            bad.append(target)
    assert not bad, f"{doc.name} links to files outside the repository: {bad}"


def test_the_four_maintainer_docs_exist_and_readme_links_them():
    names = {p.name for p in DOCS}
    assert {"architecture.md", "host_glue.md", "bundle_format.md", "runtime.md"} <= names
    links = set(LINK.findall((REPO / "README.md").read_text(encoding="utf-8")))
    assert {f"docs/{n}" for n in ("architecture.md", "host_glue.md", "bundle_format.md",
                                  "runtime.md")} <= links


def _sources() -> list[Path]:
    files = [REPO / "README.md", REPO / "CMakeLists.txt", *DOCS]
    for folder in ("molmoact2_ros", "tests", "launch"):
        files += sorted((REPO / folder).rglob("*.py"))
    return [f for f in files if "fake_qai_appbuilder" not in f.parts or f.suffix == ".py"]


def test_every_cited_markdown_file_is_in_the_repository():
    """A bare file name in a comment that a clone lacks is a reference nobody can follow."""
    bad = []
    for path in _sources():
        for name in MD_NAME.findall(path.read_text(encoding="utf-8")):
            if name not in OUTPUTS and not _resolves(name, path.parent):
                bad.append(f"{path.relative_to(REPO)}: {name}")
    assert not bad, bad
