"""The project's own files: the license matches the manifests, make help lists the targets,
the changelog names the release."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_license_is_the_apache_2_text_the_manifests_declare():
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a pointer to it
    assert ET.parse(REPO / "package.xml").getroot().findtext("license") == "Apache-2.0"
    assert re.search(r'license="Apache-2\.0"', (REPO / "setup.py").read_text(encoding="utf-8"))


def test_changelog_has_this_release_and_the_deprecation():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(r"^## 0\.2\.0\b", text, re.M)
    assert "molmoact2_ros.node" in text and "removed in 0.3" in text


def test_contributing_says_how_to_test_with_and_without_ros():
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "make test" in text and "colcon build" in text and "docs/architecture.md" in text


def test_make_test_names_its_slowest_tests_and_a_quick_subset_exists():
    """``make test`` prints its 15 slowest tests; ``make test-quick`` leaves out what
    tests/conftest.py marks slow, and CONTRIBUTING.md names it for inner loops."""
    import subprocess

    text = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = text.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "--durations=15" in recipe
    quick = text.split("\ntest-quick:", 1)[1].split("\n\n", 1)[0]
    assert '-m "not slow"' in quick
    assert "make test-quick" in (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    out = subprocess.run(["make", "--no-print-directory", "-s", "-n", "test-quick"], cwd=REPO,
                         capture_output=True, text=True, check=False).stdout
    assert "not slow" in out
