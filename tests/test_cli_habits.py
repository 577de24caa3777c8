"""The command line's habits: help with a description and an example, progress on a pipe,
summary lines, refusals before the work starts (each names the thing and the fix)."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pytest

from molmoact2_ros.cli.app import build_parser, main
from molmoact2_ros.cli.bench import summary_line
from molmoact2_ros.runtime import appbuilder
from molmoact2_ros.util.progress import counter

REPO = Path(__file__).resolve().parents[1]


def _commands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_has_a_description_and_an_example(name):
    parser = _commands()[name]
    assert parser.description and len(parser.description) > 40, f"{name}: no description"
    text = parser.format_help()
    assert "\nexample:\n  molmoact2 " in text, f"{name}: no example in --help"
    examples = text.split("\nexample:\n", 1)[1].splitlines()
    assert any(f" {name} " in f" {line} " for line in examples), f"{name}: example of another"


def test_status_lines_on_a_pipe_one_per_step():
    stream = io.StringIO()  # not a terminal
    bar = counter(3, "bench", stream=stream)
    for label in ("preprocess", "controller", "runtime lp_vtp_sd"):
        bar.set_description(label)
        bar.update()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "bench [1/3] preprocess", "bench [2/3] controller", "bench [3/3] runtime lp_vtp_sd"]


def test_status_lines_for_many_small_updates_come_every_tenth_and_at_the_end():
    stream = io.StringIO()
    bar = counter(95, "replay", unit="msg", every=10, stream=stream)
    for _ in range(95):
        bar.update(1)
    lines = [line.split(" (")[0] for line in stream.getvalue().splitlines()]
    assert lines == [f"replay [{n}/95 msg]" for n in (*range(10, 100, 10), 95)]
    quiet = io.StringIO()
    bar = counter(95, "replay", enabled=False, stream=quiet)
    bar.update(95)
    assert quiet.getvalue() == ""


def test_bench_summary_line_counts_met_missed_and_skipped():
    rows = [{"target": "a", "verdict": "meets"}, {"target": "peak RSS", "verdict": "misses"},
            {"target": "node", "verdict": "skipped"}]
    line = summary_line(rows, ["lp_vtp_sd"], 12.3)
    assert line == ("bench: 1/3 targets met, 1 missed (peak RSS), 1 skipped; variants lp_vtp_sd; "
                    "12 s")


def test_tiny_bundle_refuses_to_overwrite_without_force(tmp_path, capsys):
    pytest.importorskip("onnx")
    existing = tmp_path / "grid_sampler"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep")
    assert main(["tiny-bundle", str(tmp_path), "--variants", "grid_sampler"]) == 2
    err = capsys.readouterr().err
    assert "already holds grid_sampler; pass --force" in err and err.count("\n") == 1
    assert sorted(p.name for p in existing.iterdir()) == ["mine.txt"]  # nothing written
    # --force replaces only a folder tiny-bundle wrote: a user's folder is named and kept
    assert main(["tiny-bundle", str(tmp_path), "--variants", "grid_sampler", "--force"]) == 2
    err = capsys.readouterr().err
    assert "is not replaced, even with --force" in err and "mine.txt" in err, err
    assert sorted(p.name for p in existing.iterdir()) == ["mine.txt"]
    (existing / "mine.txt").unlink()  # an empty folder is written into
    assert main(["tiny-bundle", str(tmp_path), "--variants", "grid_sampler", "--force"]) == 0
    assert (existing / "bundle.json").is_file()
    first = (existing / "golden" / "e2e_trace.npz").read_bytes()
    assert main(["tiny-bundle", str(tmp_path), "--variants", "grid_sampler", "--force"]) == 0
    assert (existing / "golden" / "e2e_trace.npz").read_bytes() == first  # same seed, same bytes
    (existing / "host" / "prompt.json").write_text("{}")  # edited since: no longer replaced
    assert main(["tiny-bundle", str(tmp_path), "--variants", "grid_sampler", "--force"]) == 2
    assert "its host/prompt.json changed since it was written" in capsys.readouterr().err
    assert (existing / "host" / "prompt.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging


def test_doctor_exits_2_on_a_missing_path(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "nowhere")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "nowhere does not exist" in captured.err and captured.err.count("\n") == 1


def test_closed_loop_resolves_bundles_like_every_command(tiny_root, tmp_path, capsys):
    assert main(["bench", "--closed-loop", "--bundle-root", str(tmp_path / "nowhere")]) == 2
    captured = capsys.readouterr()
    assert "does not exist" in captured.err and captured.out == ""  # refused before any run
    pytest.importorskip("onnxruntime")
    # a variant's own folder, as parity, demo, replay and doctor take it
    assert main(["bench", "--closed-loop", "--bundle-root", str(tiny_root / "lp_vtp_sd"),
                 "--latencies-ms", "300", "--duration-s", "1", "--blends", "none",
                 "--seeds", "1", "--robots", "tracking", "--horizons", "10",
                 "--scenes", "waypoints"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("waypoints  tracking ")]
    assert len(rows) == 2  # the synthetic policy and the lp_vtp_sd bundle
    assert out.splitlines()[-1].startswith("bench --closed-loop: 2 runs (synthetic, lp_vtp_sd;")


def test_a_missing_matplotlib_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    png = tmp_path / "cl.png"
    assert main(["bench", "--closed-loop", "--plot", str(png), "--duration-s", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no run
    assert "'matplotlib'" in captured.err and "[plot]" in captured.err
    assert not png.exists()


@pytest.mark.parametrize("command", ["replay", "compare"])
def test_a_report_without_matplotlib_is_refused_before_the_run(command, tiny_root, tmp_path,
                                                               monkeypatch, capsys):
    """``--report`` draws PNGs: without matplotlib the command stops before it reads a bag."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    bag = tmp_path / "bag"
    bag.mkdir()  # never opened: the refusal comes first
    report = tmp_path / "report"
    argv = (["replay", str(bag), "--bundle-root", str(tiny_root), "--report", str(report)]
            if command == "replay" else ["compare", str(bag), str(tmp_path / "other"),
                                         "--report", str(report)])
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "'matplotlib'" in captured.err and "[plot]" in captured.err, captured.err
    assert not report.exists()


def test_htp_without_qai_appbuilder_suggests_the_fake_before_any_worker(tiny_root, monkeypatch,
                                                                         capsys):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "fake_qai_appbuilder" not in p])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv(appbuilder.ENV, raising=False)
    if appbuilder.using_test_fake() or __import__("importlib").util.find_spec("qai_appbuilder"):
        pytest.skip("a qai_appbuilder is installed here")
    assert main(["parity", str(tiny_root / "grid_sampler"), "--backend", "htp"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1  # the one line: no worker was started, nothing loaded
    assert "--appbuilder fake" in captured.err and "qai-appbuilder==2.51.40" in captured.err


def test_replay_variant_mismatch_names_both_variants(tiny_root, tmp_path, capsys):
    pytest.importorskip("rosbags")
    from replay_helpers import obs_bag, run_cli, trace

    bag = obs_bag(tmp_path / "obs", trace(tiny_root), 1)
    rc, out, err = run_cli(["replay", bag, "--bundle-root", tiny_root / "grid_sampler",
                            "--variant", "lp_vtp_sd", "--instruction", "pick it up"], capsys)
    assert rc == 2 and out == ""
    assert "holds grid_sampler, but this run's variant is lp_vtp_sd (from --variant)" in err
    assert "is empty" not in err


def test_replay_prints_status_lines_on_a_pipe(tiny_root, tmp_path, capsys):
    pytest.importorskip("rosbags")
    pytest.importorskip("onnxruntime")
    from replay_helpers import obs_bag, run_cli, trace

    tr = trace(tiny_root, "lp_vtp_sd")
    bag = obs_bag(tmp_path / "obs", tr, 2)
    rc, out, err = run_cli(["replay", bag, "--bundle-root", tiny_root, "--variant", "lp_vtp_sd",
                            "--instruction", str(tr["instruction"])], capsys)
    assert rc == 0, out + err
    lines = [line for line in err.splitlines() if line.startswith("replay [")]
    assert 1 <= len(lines) <= 11 and lines[-1].startswith("replay [6/6 msg]"), err


def test_conventions_lists_what_the_goldens_cannot_show(tiny_root, capsys):
    assert main(["conventions", str(tiny_root / "grid_sampler")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "not verifiable from the goldens" in x)
    assert "flip_images_180" in line and "euler_baked_steps" not in line  # the trace shows it


def test_make_is_quiet_with_one_line_per_stage_and_has_help():
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    recipes = [line for line in text.splitlines() if line.startswith("\t")]
    pip = [line for line in recipes if "pip install" in line]
    assert pip and all("--quiet" in line for line in pip)
    starts = [line for line in recipes
              if not line.startswith("\t\t")]  # continuation lines of a command
    previous = text.splitlines()
    loud = [line for line in starts if not line.startswith("\t@")
            and not previous[previous.index(line) - 1].rstrip().endswith("\\")]
    assert not loud, f"make echoes these commands: {loud}"
    out = subprocess.run(["make", "--no-print-directory", "-s", "help"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    for target in ("install", "bundle", "demo", "test", "lint", "docs", "clean"):
        assert f"\n  {target} " in out, out
