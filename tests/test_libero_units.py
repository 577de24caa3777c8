"""The LIBERO loop's pieces that need no simulator: rows by stamps, the ledger's resume rules,
the Wilson interval against published values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from molmoact2_ros.control.chunk_io import Published
from molmoact2_ros.control.params import Settings
from molmoact2_ros.sim.executor import ChunkExecutor
from molmoact2_ros.sim.ledger import Ledger, LedgerError
from molmoact2_ros.sim.summary import summarize, wilson

P = 50_000_000


def _pub(seq: int, start_ns: int, ready_ns: int, rows: int = 4, kind: str = "delta"
         ) -> Published:
    actions = np.full((rows, 7), float(seq), np.float32)
    actions[:, 0] = np.arange(rows)
    return Published(None, actions, seq, None, Settings(), start_ns, ready_ns, start_ns,
                     start_ns, 0, action_type=kind)


def test_rows_run_in_the_step_that_ends_at_their_stamp_then_zero():
    ex = ChunkExecutor(P)
    ex.accept(_pub(1, 1000 * P, 1000 * P), 1000 * P)
    cmds = [ex.command((1000 + k) * P) for k in range(6)]
    assert [c[0] for c in cmds[:4]] == [0, 1, 2, 3] and all(c[1] == 1 for c in cmds[:4])
    # delta rows: after the chunk the pose dims stop (zero) and the gripper holds its command
    for c in cmds[4:]:
        assert not np.any(c[:6]) and c[6] == 1.0
    assert [e.due_ns - e.step_start_ns for e in ex.log] == [P] * 6
    assert (ex.rows_executed, ex.rows_skipped, ex.idle_steps) == (4, 0, 2)


def test_absolute_rows_hold_the_last_row_after_the_chunk():
    ex = ChunkExecutor(P)
    ex.accept(_pub(2, 0, 0, kind="absolute"), 0)
    cmds = [ex.command(k * P) for k in range(6)]
    np.testing.assert_array_equal(cmds[5], cmds[3])


def test_a_chunk_counts_from_when_it_is_available_and_replaces_the_older_one():
    ex = ChunkExecutor(P)
    ex.accept(_pub(1, 0, 0), 0)
    ex.accept(_pub(2, P, P + P // 2), P + P // 2)  # ready mid-step: from the next step on
    for k in range(5):
        ex.command(k * P)
    rows = [(e.sequence, e.row) for e in ex.log]
    # step 1 started before chunk 2 existed; from step 2 on chunk 2 runs at its own stamps
    assert rows == [(1, 0), (1, 1), (2, 1), (2, 2), (2, 3)]
    assert ex.rows_skipped == 2 + 1 and ex.chunks_superseded == 1  # chunk 1's rows 2-3, row 0


def test_receipt_start_between_steps_plays_each_row_once_in_order():
    ex = ChunkExecutor(P)
    start = 3 * P + 7_000_000  # execution.start=receipt: the chunk starts when it is ready
    ex.accept(_pub(1, start, start), start)
    for k in range(10):
        ex.command(k * P)
    played = [e.row for e in ex.log if e.sequence == 1]
    assert played == [0, 1, 2, 3]
    assert all(e.step_start_ns >= start for e in ex.log if e.sequence)


def test_largest_command_change_is_the_pose_jump_between_steps_and_resets_per_episode():
    ex = ChunkExecutor(P)
    first = _pub(1, 0, 0)  # x: 0 1 2 3, every other dim 1 (the gripper too)
    ex.accept(first, 0)
    second = _pub(5, 3 * P, 3 * P)  # from step 3: x 0 1 2 3, y..yaw 5, the gripper -10
    second.actions[:, 6] = -10.0
    ex.accept(second, 3 * P)
    commands = [ex.command(k * P) for k in range(5)]
    assert [c[1] for c in commands] == [1, 1, 1, 5, 5] and commands[3][6] == -10.0
    # x steps by 1 and falls 2 -> 0 at the switch, y..yaw jump 1 -> 5; the gripper's 11 is no
    # pose jump
    assert ex.largest_command_change == 4.0
    ex.reset()
    assert ex.largest_command_change == 0.0
    ex.accept(_pub(2, 10 * P, 10 * P), 10 * P)
    ex.command(10 * P)  # the first command of an episode has nothing to change from
    assert ex.largest_command_change == 0.0


def test_wilson_interval_matches_published_values():
    # Wilson (1927) / Newcombe (1998) table: 0/1, 1/1 and 49/50 (z = 1.96)
    assert wilson(0, 1) == pytest.approx((0.0, 0.7935), abs=1e-4)
    assert wilson(1, 1) == pytest.approx((0.2065, 1.0), abs=1e-4)
    assert wilson(49, 50) == pytest.approx((0.8950, 0.9965), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def _rec(key: str, success: bool, **kw) -> dict:
    suite, task, init = key.split("/")
    return {"key": key, "suite": suite, "task_id": int(task), "init_index": int(init),
            "instruction": "x", "status": "ok", "reason": "", "success": success, "steps": 10,
            "chunks": 1, "rows_executed": 10, "rows_skipped": 0, "idle_steps": 0,
            "clipped_steps": 0, "clipped_values": 0, "chunk_latency_ms": [0.0], "drops": {},
            "timing": {"env_step_ms": 300.0, "overhead_ms": 3.0, "sim_steps_per_s": 3.0,
                       "inference_ms": [50.0]}, **kw}


def test_summary_per_task_and_suite_with_interval_and_overhead():
    recs = [_rec("libero_goal/0/0", True), _rec("libero_goal/0/1", False),
            _rec("libero_goal/2/0", True)]
    s = summarize(recs)
    g = s["suites"]["libero_goal"]
    assert (g["successes"], g["episodes"], g["published_rate"]) == (2, 3, 0.98)
    assert g["tasks"]["0"]["success_rate"] == 0.5
    assert s["loop_overhead_pct_of_step"] == 1.0 and s["sim_steps_per_s"] == 3.0


def test_ledger_sets_a_torn_line_aside_and_refuses_duplicates(tmp_path):
    led = Ledger(tmp_path, {"suite": "libero_goal"})
    led.append(_rec("libero_goal/0/0", True))
    torn = '{"key": "libero_goal/0/1", "succ'
    with open(tmp_path / "episodes.jsonl", "a") as f:
        f.write(torn)  # killed while writing
    again = Ledger(tmp_path, {"suite": "libero_goal"})
    assert again.done() == {"libero_goal/0/0"}
    assert (tmp_path / "episodes.jsonl.partial").read_text() == torn + "\n"
    assert again.pending(["libero_goal/0/0", "libero_goal/0/1"]) == ["libero_goal/0/1"]
    again.append(_rec("libero_goal/0/1", False))
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["run"] == {"suite": "libero_goal"}
    assert [json.loads(ln)["key"] for ln in lines[1:]] == ["libero_goal/0/0", "libero_goal/0/1"]
    with pytest.raises(LedgerError, match="already"):
        again.append(_rec("libero_goal/0/1", True))
    with pytest.raises(LedgerError, match="other settings"):
        Ledger(tmp_path, {"suite": "libero_10"})


def test_sim_node_entry_point_and_launch_arguments_are_installed():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert "scripts/libero_sim" in (root / "CMakeLists.txt").read_text()
    assert (root / "scripts" / "libero_sim").stat().st_mode & 0o111
    tree = ast.parse((root / "launch" / "libero.launch.py").read_text())
    declared = {node.args[0].value for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") ==
                "DeclareLaunchArgument" and isinstance(node.args[0], ast.Constant)}
    assert {"suite", "tasks", "episodes", "bundle_root", "variant", "backend", "time_mode",
            "latency_ms", "max_steps", "out", "policy"} <= declared


def test_policy_status_levels_from_ros_bytes_ints_and_controller_names():
    from molmoact2_ros.sim.policy_status import level_name

    # diagnostic_msgs/DiagnosticStatus: OK 0, WARN 1, ERROR 2, STALE 3 (a byte in rclpy)
    assert [level_name(bytes([n])) for n in range(4)] == ["OK", "WARN", "ERROR", "STALE"]
    assert [level_name(n) for n in range(4)] == ["OK", "WARN", "ERROR", "STALE"]
    assert [level_name(s) for s in ("ok", "warn", "error")] == ["OK", "WARN", "ERROR"]
    for bad in (bytes([7]), b"", 9, "fine"):
        with pytest.raises(ValueError, match="unknown diagnostic level"):
            level_name(bad)


def test_worst_status_keeps_the_worst_and_counts_a_real_watchdog_stall(tmp_path):
    from controller_fakes import Rig

    from molmoact2_ros.sim.policy_status import WorstStatus

    status = WorstStatus()
    assert status.to_json() == {"worst": None, "message": "", "statuses": 0, "stalls": 0}
    status.add(b"\x00", "running")
    status.add(b"\x01", "3 stale observations skipped")
    status.add(b"\x00", "running")
    assert status.to_json() == {"worst": "WARN", "message": "3 stale observations skipped",
                                "statuses": 3, "stalls": 0}
    # the controller's own watchdog: inputs keep arriving, nothing is published for 10+ periods
    rig = Rig(tmp_path, trigger="on_observation")
    for v in ("grid_sampler", "lp_vtp_sd", "fused"):
        (tmp_path / v).mkdir()
    ctl = rig.start()
    rig.clock.now += 5 * 10**9
    rig.observe()  # an input arrives; nothing is processed, so nothing is published
    d = ctl.diagnostics()
    status.add(d["level"], d["message"])
    got = status.to_json()
    assert d["level"] in ("warn", "error") and got["stalls"] == 1, d
    assert got["worst"] == d["level"].upper() and got["message"] == d["message"]


def test_summary_reports_the_worst_policy_status_and_old_ledgers_have_none():
    ok = {"worst": "OK", "message": "running", "statuses": 4, "stalls": 0}
    warn = {"worst": "WARN", "message": "no instruction", "statuses": 2, "stalls": 0}
    s = summarize([_rec("libero_goal/0/0", True, policy_diagnostics=ok),
                   _rec("libero_goal/0/1", True, policy_diagnostics=warn),
                   _rec("libero_goal/0/2", True)])  # a line written before the field existed
    assert s["policy_diagnostics"] == {"worst": "WARN", "message": "no instruction",
                                       "episode": "libero_goal/0/1", "episodes": 2,
                                       "statuses": 6, "stalls": 0}
    assert summarize([_rec("libero_goal/0/0", True)])["policy_diagnostics"] is None
    from molmoact2_ros.sim.summary import markdown

    assert "| policy status, worst over episodes | WARN (6 statuses, 0 stalled) in " \
        "libero_goal/0/1: no instruction |" in markdown(s)


class _Pipe:
    """A stream that is not a terminal (a pipe or a log), collecting lines thread-safely."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.text = ""

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        with self.lock:
            self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def lines(self) -> list[str]:
        with self.lock:
            return self.text.splitlines()


def test_progress_on_a_pipe_names_each_phase_then_every_n_steps_and_never_goes_quiet():
    import time
    from types import SimpleNamespace

    from molmoact2_ros.cli.libero_progress import EpisodeProgress

    pipe = _Pipe()
    progress = EpisodeProgress(stream=pipe, every_steps=5, heartbeat_s=0.5)
    try:
        progress.phase("loading LIBERO and the suite's tasks")
        assert pipe.lines() == ["libero: loading LIBERO and the suite's tasks (0 s)"]
        spec = SimpleNamespace(key="libero_goal/0/0")
        progress.start(2, 0)
        progress.begin(spec)
        for phase in ("build", "reset", "settle", "run"):
            progress.episode_phase(spec, phase)
        assert [ln.split(": ", 1)[1].rsplit(" (", 1)[0] for ln in pipe.lines()[1:]] == [
            "building the env", "resetting to the init state", "settling", "running"]
        rec = SimpleNamespace(max_steps=20, chunks=1)
        for k in range(1, 11):
            progress.step(spec, SimpleNamespace(step=k), rec)
        steps = [ln for ln in pipe.lines() if "step " in ln]
        assert [ln.split(": ", 1)[1].split(",")[0] for ln in steps] == ["step 5/20",
                                                                        "step 10/20"]
        # a long wait (an env build, a slow chunk): a line still comes
        deadline = time.monotonic() + 60
        while not any("still" in ln for ln in pipe.lines()):
            assert time.monotonic() < deadline, pipe.lines()
            time.sleep(0.05)
        assert "libero [1/2] libero_goal/0/0: step 10/20, chunk 1" in pipe.lines()[-1]
    finally:
        progress.close()


def _banner_colours(frame):
    """(reddish, amber) pixel counts of the status text in a frame's banner."""
    import numpy as np

    banner = frame[20:45].astype(int)
    r, g, b = banner[..., 0], banner[..., 1], banner[..., 2]
    red = int(np.count_nonzero((r > 170) & (g < 140) & (b < 140)))
    amber = int(np.count_nonzero((r > 170) & (g > 150) & (b < 130)))
    return red, amber


@pytest.mark.parametrize("outcome", ["failure", "refused"])
def test_a_video_ends_on_its_outcome_and_is_named_by_it(tmp_path, outcome):
    import numpy as np

    imageio = pytest.importorskip("imageio.v2")
    pytest.importorskip("imageio_ffmpeg")
    from molmoact2_ros.sim.video import OUTCOME_FRAMES, EpisodeVideo

    video = EpisodeVideo(tmp_path, "libero_goal_task01_init02", "open the drawer", size=64)
    scene = np.full((64, 64, 3), 90, np.uint8)
    added = 3 if outcome == "failure" else 0  # a refused instruction renders nothing
    for k in range(added):
        video.add((scene, scene), k, False)
    path = video.finish(outcome, "too long" if outcome == "refused" else "")
    assert path == tmp_path / f"libero_goal_task01_init02_{outcome}.mp4"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    with imageio.get_reader(str(path)) as reader:
        frames = [reader.get_data(i) for i in range(reader.count_frames())]
    assert len(frames) == added + OUTCOME_FRAMES
    red, amber = _banner_colours(frames[-1])
    assert red > 5 and amber < red / 4, (red, amber)  # the last frame: red outcome text
    if added:
        red, amber = _banner_colours(frames[0])
        assert amber > 5 and red < amber / 4, (red, amber)  # while running: amber
