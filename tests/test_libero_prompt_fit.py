"""``molmoact2 libero`` checks every selected task's instruction against the prompt budget before
the first episode: none fitting exits 2 before an env is built; some fitting runs those and
lists the rest as not promptable, apart from the success rate."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("libero")

from budget_helpers import cut_budget_bundle  # noqa: E402

from molmoact2_ros.cli.app import main  # noqa: E402
from molmoact2_ros.sim import libero_env  # noqa: E402


@pytest.fixture(scope="module")
def cut_root(tiny_root, tmp_path_factory):
    return cut_budget_bundle(tiny_root, tmp_path_factory.mktemp("cut-budget"))


def test_a_suite_none_of_whose_tasks_fit_exits_2_before_any_env(cut_root, tmp_path, capsys,
                                                                 monkeypatch):
    built = []

    def refuse(self, *args, **kwargs):
        built.append(1)
        raise AssertionError("an env was built")

    monkeypatch.setattr(libero_env.LiberoSim, "__init__", refuse)
    code = main(["libero", "--suite", "libero_spatial", "--bundle-root", str(cut_root),
                 "--variant", "grid_sampler", "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and not built, err
    line = next(ln for ln in err.splitlines() if ln.startswith("error:"))
    assert "libero_spatial" in line and "9 tokens left for the task" in line, line
    assert "S >= 138" in line, line
    assert not (tmp_path / "run" / "episodes.jsonl").exists()


def test_a_mixed_selection_runs_the_tasks_that_fit_and_lists_the_rest(cut_root, tmp_path,
                                                                      capsys):
    """libero_10 task 8 is 7 tokens, task 2 is 11 (word counts of the tiny vocabulary)."""
    out = tmp_path / "run"
    code = main(["libero", "--suite", "libero_10", "--tasks", "2,8", "--episodes", "1",
                 "--max-steps", "3", "--settle-steps", "2", "--video", "none", "--no-progress",
                 "--bundle-root", str(cut_root), "--variant", "grid_sampler", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = (out / "episodes.jsonl").read_text().splitlines()[1:]  # after the settings line
    keys = [json.loads(ln)["key"] for ln in lines]
    assert keys == ["libero_10/8/0"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total"]["episodes"] == 1 and summary["refused"] == 0
    assert [(n["task_id"], n["tokens"]) for n in summary["not_promptable"]] == [(2, 11)]
    assert "not promptable (not run, not counted): libero_10 task 2" in captured.out
    assert "Not promptable" in (out / "summary.md").read_text()
