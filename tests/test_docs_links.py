"""README, the other top-level documents and docs/ point only at files in the repository and at
headings that exist; the README stays short; code cites only docs that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
TOP = [REPO / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
README_MAX_LINES = 200
LINK = re.compile(r"\]\(([^)\s]+)\)")
MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]*\w\.md)\b")
#: Markdown files the package writes (device-report's output), not documents to follow.
OUTPUTS = {"report.md", "device-report.md", "r.md", "seed.md", "bundle.md",  # report outputs
           "summary.md"}


def _resolves(name: str, base: Path) -> bool:
    return any((root / name).is_file() for root in (base, REPO, REPO / "docs"))


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors, fenced = set(), False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("doc", [*TOP, *DOCS], ids=lambda p: p.name)
def test_links_point_to_files_and_headings_in_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    bad = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path) if path else doc
        if path.startswith("/") or not file.resolve().is_relative_to(REPO) or not file.exists():
            bad.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(f"{target} (no such heading)")
    assert not bad, f"{doc.name} links to what the repository does not hold: {bad}"


def test_readme_is_short_and_links_every_doc():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; keep it at most {README_MAX_LINES} and move the detail "
        "into docs/")
    links = set(LINK.findall(text))
    missing = [d.name for d in DOCS if f"docs/{d.name}" not in links]
    assert not missing, f"add these to the README's More list: {missing}"


def test_the_four_maintainer_docs_exist_and_readme_links_them():
    names = {p.name for p in DOCS}
    assert {"architecture.md", "host_glue.md", "bundle_format.md", "runtime.md"} <= names
    links = set(LINK.findall((REPO / "README.md").read_text(encoding="utf-8")))
    assert {f"docs/{n}" for n in ("architecture.md", "host_glue.md", "bundle_format.md",
                                  "runtime.md")} <= links


def _sources() -> list[Path]:
    files = [*TOP, REPO / "CMakeLists.txt", *DOCS]
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
