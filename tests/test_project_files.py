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
