"""docs/reliability.md's table of tried inputs and faults is the suite's, regenerated."""

from __future__ import annotations

import reliability_table


def test_the_reliability_table_is_generated_from_the_suite():
    want = reliability_table.render()
    assert "| total | |" in want and reliability_table.in_document() == want, (
        "docs/reliability.md is out of date: run python tests/reliability_table.py --write")
