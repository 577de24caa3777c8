"""The table of tried bad inputs and faults in docs/reliability.md, generated from the suite.

``python tests/reliability_table.py`` prints it, ``--write`` puts it into the document between
its markers; ``tests/test_reliability_doc.py`` fails when the two differ. Cases are the test
items pytest collects per file of ``tests/corpus`` and ``tests/faults`` (every parametrised
row counts once); the description is the first sentence of the file's docstring.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "reliability.md"
FOLDERS = ("tests/corpus", "tests/faults")
BEGIN, END = "<!-- reliability-table -->", "<!-- /reliability-table -->"


def collected() -> Counter:
    """Test items per file, as pytest collects them (without running anything)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *FOLDERS], cwd=REPO, capture_output=True, text=True, check=False).stdout
    return Counter(line.split("::", 1)[0] for line in out.splitlines() if "::" in line)


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split())
    return re.split(r"(?<=[.])\s", first, maxsplit=1)[0].rstrip(".")


def render(counts: Counter | None = None) -> str:
    counts = collected() if counts is None else counts
    rows = ["| file | what is tried | cases |", "|---|---|---|"]
    for folder in FOLDERS:
        for path in sorted((REPO / folder).glob("test_*.py")):
            rel = path.relative_to(REPO).as_posix()
            rows.append(f"| `{rel}` | {_summary(path)} | {counts.get(rel, 0)} |")
    rows.append(f"| total | | {sum(counts.values())} |")
    return "\n".join(rows)


def in_document() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write(table: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")


if __name__ == "__main__":
    table = render()
    if "--write" in sys.argv[1:]:
        write(table)
    print(table)
