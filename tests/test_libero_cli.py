"""``molmoact2 libero`` end to end on real LIBERO and the tiny bundle, its bad inputs (one line,
exit 2) and its resume after SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("libero")

from molmoact2_ros.cli.app import main  # noqa: E402

QUICK = ["--suite", "libero_spatial", "--tasks", "0", "--settle-steps", "5", "--render-size", "64",
         "--no-progress"]


def _cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "molmoact2_ros.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


def test_one_episode_writes_ledger_summary_plot_video_and_resumes(tiny_root, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["libero", *QUICK, "--episodes", "1", "--max-steps", "12",
            "--bundle-root", str(tiny_root), "--out", str(out)]
    assert main(args) == 0
    lines = (out / "episodes.jsonl").read_text().splitlines()[1:]  # after the settings line
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["key"] == "libero_spatial/0/0" and rec["steps"] == 12 and rec["status"] == "ok"
    for name in ("summary.json", "summary.md", "success_by_task.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / rec["video"]).stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "(LeRobot fine-tune)) 98.4%" in printed and "95% CI" in printed
    md = (out / "summary.md").read_text()
    assert "98.4%" in md and "Wilson" in md
    # the same command again: everything is in the ledger, nothing runs twice
    assert main(args) == 0
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 2
    assert "1 in the ledger already, 0 to run" in capsys.readouterr().err
    # other settings on the same folder are refused (one ledger, one configuration)
    assert main([*args, "--time-mode", "latency"]) == 2
    assert "other settings" in capsys.readouterr().err


@pytest.mark.parametrize("extra,needle", [
    (["--suite", "libero_nope"], "unknown LIBERO suite 'libero_nope'"),
    (["--tasks", "12"], "libero_spatial has tasks 0..9"),
    (["--first-init", "49", "--episodes", "2"], "init states 0..49"),
    (["--time-mode", "realtime"], "through ROS"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_root, tmp_path, extra, needle):
    r = _cli("libero", *QUICK, "--episodes", "1", "--bundle-root", str(tiny_root),
             "--out", str(tmp_path / "o"), *extra, timeout=120)
    assert r.returncode == 2, r.stderr
    errors = _error_lines(r.stderr)
    assert len(errors) == 1 and needle in errors[0], r.stderr
    assert not (tmp_path / "o" / "episodes.jsonl").exists()


def test_missing_sim_extra_names_it(tiny_root, tmp_path):
    code = ("import sys; sys.modules['libero'] = None; from molmoact2_ros.cli.app import main; "
            f"sys.exit(main(['libero', '--bundle-root', {str(tiny_root)!r}, '--out', "
            f"{str(tmp_path / 'o')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    errors = _error_lines(r.stderr)
    assert len(errors) == 1 and "pip install -e '.[sim]'" in errors[0], r.stderr


def test_unusable_gl_names_both_backends_and_their_packages(tiny_root, tmp_path):
    r = _cli("libero", *QUICK, "--bundle-root", str(tiny_root), "--out", str(tmp_path / "o"),
             env={"MUJOCO_GL": "glx"}, timeout=120)
    assert r.returncode == 2
    (line,) = _error_lines(r.stderr)
    for needle in ("MUJOCO_GL=egl", "libegl1 libegl-mesa0 libgl1-mesa-dri", "MUJOCO_GL=osmesa",
                   "libosmesa6"):
        assert needle in line, line


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def test_sigterm_then_resume_loses_and_repeats_nothing(tiny_root, tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "molmoact2_ros.cli", "libero", "--suite", "libero_spatial",
            "--tasks", "0", "--episodes", "2", "--max-steps", "4", "--settle-steps", "0",
            "--video", "none", "--no-progress", "--bundle-root", str(tiny_root), "--out",
            str(out)]
    ledger = out / "episodes.jsonl"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: ledger.exists() and ledger.read_text().count("\n") >= 2
                  or proc.poll() is not None, 600, "the first episode in the ledger")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    keys = [json.loads(ln)["key"] for ln in ledger.read_text().splitlines()[1:]]
    if proc.returncode == 143:  # stopped during the second episode: it is not in the ledger
        assert keys == ["libero_spatial/0/0"] and "resume" in err
    else:  # the second episode finished before the signal arrived
        assert proc.returncode == 0 and len(keys) == 2
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    keys = [json.loads(ln)["key"] for ln in ledger.read_text().splitlines()[1:]]
    assert keys == ["libero_spatial/0/0", "libero_spatial/0/1"]
    assert Path(out / "summary.json").exists()
