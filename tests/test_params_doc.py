"""docs/parameters.md is generated from the parameter table and committed current."""

from __future__ import annotations

from pathlib import Path

from molmoact2_ros.control.params import PARAMS
from molmoact2_ros.control.params_doc import REGENERATE, main, markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "parameters.md"


def test_the_committed_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == markdown(), (
        f"docs/parameters.md is out of date with control/params.py; regenerate it: {REGENERATE}")


def test_every_parameter_has_one_row_with_its_default_and_how_it_applies():
    rows = [line for line in markdown().splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [p.name for p in PARAMS]
    flow = next(r for r in rows if r.startswith("| `flow_steps`"))
    assert "| `0` | live | [0, 100] |" in flow
    assert "| `30.0` | configure | [0.1, 3600] |" in next(
        r for r in rows if r.startswith("| `runtime.call_timeout_s`"))


def test_main_writes_the_page(tmp_path, capsys):
    out = tmp_path / "parameters.md"
    assert main([str(out)]) == 0
    assert out.read_text(encoding="utf-8") == markdown()
    assert f"({len(PARAMS)} parameters)" in capsys.readouterr().out
