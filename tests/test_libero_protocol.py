"""``molmoact2 libero`` as the published evaluation (LeRobot's ``lerobot-eval``), and its ledger
and options against hostile inputs: one line, exit 2 naming the option or the file, and not one
byte changed of a file it did not write.

The protocol's figures are checked against LeRobot's source at huggingface/lerobot 7427f318:
``TASK_SUITE_MAX_STEPS`` in ``src/lerobot/envs/libero.py``, ``observation_height/width`` of
``LiberoEnv`` in ``src/lerobot/envs/configs.py``, ``n_action_steps = chunk_size = 10`` and
``per_episode_seed`` in ``docs/source/molmoact2.mdx``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("libero")

from libero_helpers import PLUS_X, ScriptedPolicy, rows  # noqa: E402

from molmoact2_ros.bundle.bundle import bundle_parameters  # noqa: E402
from molmoact2_ros.cli.app import main  # noqa: E402
from molmoact2_ros.control.params import Settings  # noqa: E402
from molmoact2_ros.host.flow import observation_rng  # noqa: E402

#: LeRobot 7427f318, src/lerobot/envs/libero.py TASK_SUITE_MAX_STEPS
LEROBOT_STEPS = {"libero_spatial": 280, "libero_object": 280, "libero_goal": 300,
                 "libero_10": 520, "libero_90": 400}
#: LeRobot 7427f318, src/lerobot/envs/configs.py LiberoEnv.observation_height/width
LEROBOT_RENDER_PX = 360
HORIZON = 10
#: options that keep an accidental run short (no new options: the cases must also run, and
#: fail, against a version without them)
SHORT = ["--suite", "libero_spatial", "--tasks", "0", "--episodes", "1", "--max-steps", "2",
         "--settle-steps", "0", "--video", "none", "--no-progress"]
HEADER = "molmoact2-libero-ledger/2"


def _run(capsys, *args: str) -> tuple[int, str]:
    code = main(["libero", *args])
    err = capsys.readouterr().err
    return code, err


def _refused(code: int, err: str, needle: str) -> None:
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], err[-3000:]
    assert len(errors[0]) < 600, errors[0][:600]


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links not followed) with its bytes."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            out[str(path.relative_to(folder))] = (
                b"link:" + os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return out


def _record(key: str, **kw) -> dict:
    suite, task, init = key.split("/")
    rec = {"key": key, "suite": suite, "task_id": int(task), "init_index": int(init),
           "instruction": "x", "status": "ok", "reason": "", "success": False, "steps": 2,
           "max_steps": 2, "settle_steps": 0, "time_mode": "lockstep", "chunks": 1,
           "rows_executed": 2, "rows_skipped": 0, "idle_steps": 0, "clipped_steps": 0,
           "clipped_values": 0, "chunk_latency_ms": [0.0], "drops": {},
           "timing": {"wall_s": 1.0, "sim_steps_per_s": 2.0, "inference_ms": [1.0]}}
    rec.update(kw)
    return rec


def _line(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _ours(*records: str, run: dict | None = None) -> str:
    """A ledger in this command's format, written by hand: its settings line, then lines."""
    header = _line({"format": HEADER, "run": run or {"suite": "libero_spatial",
                                                     "time_mode": "lockstep"}})
    return "\n".join([header, *records]) + "\n"


# -- the ledger and the output folder ---------------------------------------------------------
LEDGER_CASES = {
    # a file another tool wrote, without a newline: it used to be emptied
    "foreign_no_newline": b"results of another tool",
    # records without this command's settings line (a ledger of another time mode whose
    # run.json is gone used to be summarised as this run's)
    "no_settings_line": (_line(_record("libero_spatial/0/0", time_mode="latency")) + "\n"
                         ).encode(),
    "settings_line_is_a_list": b"[]\n",
    "settings_line_is_a_number": b"3\n",
    "settings_line_is_empty_object": b"{}\n",
    "record_is_a_list": _ours("[]").encode(),
    "record_is_a_number": _ours("7").encode(),
    "record_is_empty_object": _ours("{}").encode(),
    "record_has_only_key": _ours(_line({"key": "libero_spatial/0/0"})).encode(),
    "steps_is_many": _ours(_line(_record("libero_spatial/0/0", steps="many"))).encode(),
    "success_is_no": _ours(_line(_record("libero_spatial/0/0", success="no"))).encode(),
    "duplicate_key": _ours(_line(_record("libero_spatial/0/0")),
                           _line(_record("libero_spatial/0/0", success=True))).encode(),
    "bad_json_line": _ours("{not json", _line(_record("libero_spatial/0/1"))).encode(),
    # this command's ledger, other settings, its last record complete but without a newline:
    # the record used to be deleted before the settings were compared
    "complete_record_without_newline": _ours(_line(_record("libero_spatial/0/0"))).encode()[:-1],
}
LEDGER_NEEDLES = {
    "foreign_no_newline": "not a ledger of molmoact2 libero",
    "no_settings_line": "not a ledger of molmoact2 libero",
    "settings_line_is_a_list": "not a ledger of molmoact2 libero",
    "settings_line_is_a_number": "not a ledger of molmoact2 libero",
    "settings_line_is_empty_object": "not a ledger of molmoact2 libero",
    "record_is_a_list": "episodes.jsonl:2",
    "record_is_a_number": "episodes.jsonl:2",
    "record_is_empty_object": "line 2: key is missing",
    "record_has_only_key": "line 2: suite is missing",
    "steps_is_many": "line 2: steps is 'many'",
    "success_is_no": "line 2: success is 'no'",
    "duplicate_key": "episodes.jsonl:3 repeats episode libero_spatial/0/0 of line 2",
    "bad_json_line": "episodes.jsonl:2 is not a JSON record",
    "complete_record_without_newline": "other settings",
}


@pytest.mark.parametrize("case", list(LEDGER_CASES))
def test_a_ledger_it_cannot_trust_is_refused_and_left_as_it_is(tiny_root, tmp_path, capsys,
                                                               case):
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.jsonl").write_bytes(LEDGER_CASES[case])
    before = _snapshot(tmp_path)
    code, err = _run(capsys, *SHORT, "--bundle-root", str(tiny_root), "--out", str(out))
    _refused(code, err, LEDGER_NEEDLES[case])
    assert _snapshot(tmp_path) == before


def test_a_ledger_linked_elsewhere_is_refused_and_its_target_untouched(tiny_root, tmp_path,
                                                                       capsys):
    target = tmp_path / "elsewhere.jsonl"
    target.write_bytes(b'{"key": "a"}\n{"torn')
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.jsonl").symlink_to(target)
    before = _snapshot(tmp_path)
    code, err = _run(capsys, *SHORT, "--bundle-root", str(tiny_root), "--out", str(out))
    _refused(code, err, "not a regular file")
    assert _snapshot(tmp_path) == before and target.read_bytes() == b'{"key": "a"}\n{"torn'


@pytest.mark.parametrize("names", [("summary.json", "summary.md"), ("notes.txt",)])
def test_an_out_folder_of_another_tool_is_refused_and_untouched(tiny_root, tmp_path, capsys,
                                                                names):
    out = tmp_path / "out"
    out.mkdir()
    for name in names:
        (out / name).write_text(f"{name} of another tool\n")
    before = _snapshot(tmp_path)
    code, err = _run(capsys, *SHORT, "--bundle-root", str(tiny_root), "--out", str(out))
    _refused(code, err, "--out")
    assert "did not write" in err
    assert _snapshot(tmp_path) == before


def test_out_inside_the_bundle_is_refused(tiny_root, tmp_path, capsys):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_root / "grid_sampler", bundle / "grid_sampler")
    before = _snapshot(tmp_path)
    code, err = _run(capsys, *SHORT, "--bundle-root", str(bundle), "--out",
                     str(bundle / "grid_sampler" / "results"))
    _refused(code, err, "--out")
    assert "inside the bundle" in err
    assert _snapshot(tmp_path) == before


def test_empty_out_is_refused_and_nothing_lands_in_the_current_folder(tiny_root, tmp_path,
                                                                      capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run(capsys, *SHORT, "--bundle-root", str(tiny_root), "--out", "")
    _refused(code, err, "--out is empty")
    assert os.listdir(tmp_path) == []


# -- options that would be ignored, misplaced or select nothing -------------------------------
@pytest.mark.parametrize("extra,needle", [
    (["--tasks", "3-1"], "--tasks '3-1': 3-1 is reversed"),
    (["--tasks", ","], "--tasks ',' selects no task"),
    (["--tasks", " "], "--tasks ' ' selects no task"),
    (["--tasks", "0-2000000"], "libero_spatial has tasks 0..9; 0-2000000 goes beyond them"),
    (["--latency-ms", "50"], "--latency-ms applies to --time-mode latency only"),
    (["--set", "instruction=open the drawer"], "--set instruction"),
    (["--set", "seed=3"], "--set seed"),
    (["--ray", ""], "--ray is empty"),
], ids=["reversed", "comma", "blank", "huge", "latency_in_lockstep", "set_instruction",
        "set_seed", "ray_empty"])
def test_an_option_that_would_not_act_is_refused_naming_it(tiny_root, tmp_path, capsys, extra,
                                                           needle):
    args = SHORT[:2] + SHORT[4:]  # without --tasks 0
    code, err = _run(capsys, *args, *extra, "--bundle-root", str(tiny_root),
                     "--out", str(tmp_path / "o"))
    _refused(code, err, needle)
    assert not (tmp_path / "o").exists()


# -- the ledger's own writes ------------------------------------------------------------------
def test_a_complete_last_record_is_kept_and_a_torn_one_set_aside(tmp_path):
    from molmoact2_ros.sim.ledger import Ledger

    run = {"suite": "libero_spatial", "time_mode": "lockstep"}
    whole = _line(_record("libero_spatial/0/0"))
    (tmp_path / "episodes.jsonl").write_text(_ours(whole, run=run)[:-1])  # no final newline
    led = Ledger(tmp_path, run)
    assert led.done() == {"libero_spatial/0/0"}
    led.append(_record("libero_spatial/0/1"))
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert [json.loads(ln).get("key") for ln in lines] == [None, "libero_spatial/0/0",
                                                           "libero_spatial/0/1"]
    with open(tmp_path / "episodes.jsonl", "a") as f:
        f.write('{"key":"libero_spatial/0/2","succ')
    again = Ledger(tmp_path, run)
    assert again.done() == {"libero_spatial/0/0", "libero_spatial/0/1"}
    assert (tmp_path / "episodes.jsonl.partial").read_text() == \
        '{"key":"libero_spatial/0/2","succ\n'
    assert (tmp_path / "episodes.jsonl").read_text().splitlines() == lines


def test_a_record_that_is_not_a_boolean_success_is_not_written(tmp_path):
    from molmoact2_ros.sim.ledger import Ledger, LedgerError

    led = Ledger(tmp_path, {"suite": "libero_spatial"})
    with pytest.raises(LedgerError, match="success is 'no'"):
        led.append(_record("libero_spatial/0/0", success="no"))
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 1


# -- the published protocol, physics only (a scripted policy; no renderer) --------------------
def test_the_suite_budgets_and_render_size_are_lerobots():
    from molmoact2_ros.sim.libero_env import LiberoSim
    from molmoact2_ros.sim.protocol import MAX_STEPS, max_steps_of

    assert MAX_STEPS == LEROBOT_STEPS
    assert {s: max_steps_of(s) for s in LEROBOT_STEPS} == LEROBOT_STEPS
    import inspect

    default = inspect.signature(LiberoSim).parameters["camera_size"].default
    assert default == LEROBOT_RENDER_PX


def _protocol_runner(sim, tiny_root, protocol: str, policy, **kw):
    from molmoact2_ros.sim.protocol import EXECUTION
    from molmoact2_ros.sim.runner import EpisodeRunner

    settings = Settings().with_changes({**EXECUTION[protocol], "backend": "onnx",
                                        **bundle_parameters(tiny_root)})
    return EpisodeRunner(sim, settings, policy_factory=lambda s: policy, **kw)


class _SeedRecorder(ScriptedPolicy):
    """A scripted policy that keeps the noise seed in force at each real observation."""

    def __init__(self, script) -> None:
        super().__init__(script)
        self.seed = None
        self.draws: list[tuple[int, int]] = []

    def reseed(self, seed) -> None:
        self.seed = seed

    def predict(self, obs, guidance=None):
        if obs.stamp_ns:
            self.draws.append((self.seed, obs.stamp_ns))
        return super().predict(obs, guidance)


def test_published_runs_every_row_of_every_chunk_up_to_the_suites_budget(libero_arm, tiny_root):
    from molmoact2_ros.sim.runner import EpisodeSpec

    script = [rows([0.2 * (i % 3 - 1), 0, 0, 0, 0, 0, -1]) for i in range(40)]
    runner = _protocol_runner(libero_arm, tiny_root, "published", ScriptedPolicy(script))
    try:
        rec = runner.run(EpisodeSpec("libero_spatial", 0, 0))
    finally:
        runner.close()
    budget = LEROBOT_STEPS["libero_spatial"]
    assert rec.max_steps == budget and rec.steps == budget and not rec.success
    assert rec.chunks == budget // HORIZON
    assert rec.rows_executed == budget and rec.rows_skipped == 0 and rec.idle_steps == 0


def test_node_protocol_replans_before_a_chunk_ends(libero_arm, tiny_root):
    from molmoact2_ros.sim.runner import EpisodeSpec

    runner = _protocol_runner(libero_arm, tiny_root, "node", ScriptedPolicy([PLUS_X] * 10),
                              max_steps=40)
    try:
        rec = runner.run(EpisodeSpec("libero_spatial", 0, 0))
    finally:
        runner.close()
    # overlap 0.1 s: the next observation two rows before the end, the rest replaced
    assert rec.chunks == 5 and rec.rows_skipped == 8 and rec.rows_executed == 40


def test_each_episode_draws_its_own_noise_and_a_rerun_the_same(libero_arm, tiny_root):
    from molmoact2_ros.sim.runner import EpisodeSpec

    def draws(inits):
        policy = _SeedRecorder([PLUS_X] * 3)
        runner = _protocol_runner(libero_arm, tiny_root, "published", policy, max_steps=10)
        out = {}
        try:
            for init in inits:
                before = len(policy.draws)
                runner.run(EpisodeSpec("libero_spatial", 0, init))
                out[init] = policy.draws[before:]
        finally:
            runner.close()
        return out

    first = draws([0, 1])
    # the noise each observation gets is drawn from (seed, stamp) (host/flow.observation_rng)
    noise = {i: [observation_rng(s, t).standard_normal(8) for s, t in d]
             for i, d in first.items()}
    assert len(noise[0]) == len(noise[1]) == 1
    assert first[0][0][1] == first[1][0][1]  # the same sim stamp in both episodes ...
    assert not np.allclose(noise[0][0], noise[1][0])  # ... and different noise
    again = draws([1])
    assert again[1] == first[1]  # a rerun of one episode draws what it drew before


# -- the published protocol on the tiny bundle, rendered ---------------------------------------
def test_tiny_bundle_published_run_renders_at_lerobots_size_with_noise_per_episode(
        tiny_root, tmp_path, capsys, monkeypatch):
    import imageio.v2 as imageio

    import molmoact2_ros.policy as policy_module

    drawn: list[np.ndarray] = []
    real = policy_module.initial_noise

    def recording(rng, shape, pad):
        x0 = real(rng, shape, pad)
        drawn.append(np.array(x0))
        return x0

    monkeypatch.setattr(policy_module, "initial_noise", recording)
    base = ["--suite", "libero_spatial", "--tasks", "0", "--max-steps", "10", "--settle-steps",
            "0", "--no-progress", "--bundle-root", str(tiny_root)]
    code, err = _run(capsys, *base, "--episodes", "2", "--out", str(tmp_path / "a"))
    assert code == 0, err[-3000:]
    first = drawn[-2:]  # warm-up draws come first: one chunk per episode after them
    lines = (tmp_path / "a" / "episodes.jsonl").read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(ln) for ln in lines[1:]]
    assert header["run"]["render_px"] == LEROBOT_RENDER_PX
    assert header["run"]["protocol"] == "published"
    assert [r["chunks"] for r in records] == [1, 1]
    assert all(r["rows_executed"] == 10 and r["rows_skipped"] == 0 for r in records)
    assert not np.allclose(first[0], first[1])
    for r in records:
        assert r["video"].endswith("_failure.mp4"), r["video"]
        with imageio.get_reader(str(tmp_path / "a" / r["video"])) as reader:
            frame = reader.get_data(0)
        # both cameras side by side under the 48 px banner (H.264 pads the height to 16)
        assert frame.shape[1] == 2 * LEROBOT_RENDER_PX, frame.shape
        assert -(-(LEROBOT_RENDER_PX + 48) // 16) * 16 == frame.shape[0], frame.shape
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["protocol"]["name"] == "published"
    assert summary["protocol"]["deviations"] == ["max_steps 10 (published 280)",
                                                 "settle_steps 0 (published 50)"]
    assert summary["synthetic_bundle"] is True
    del printed
    code, err = _run(capsys, *base, "--episodes", "1", "--first-init", "1", "--video", "none",
                     "--out", str(tmp_path / "b"))
    assert code == 0, err[-3000:]
    np.testing.assert_array_equal(drawn[-1], first[1])  # the rerun draws the same noise


@pytest.mark.parametrize("variant,model,spatial", [
    ("grid_sampler", "allenai/MolmoAct2-LIBERO-LeRobot", 0.984),
    ("lp_vtp_sd", "allenai/MolmoAct2-LIBERO-LeRobot", 0.984),
    ("fused", "allenai/MolmoAct2-LIBERO (original", 0.978),
])
def test_each_variant_is_read_against_its_own_published_rates(variant, model, spatial):
    from molmoact2_ros.sim.evaluation import summary_lines
    from molmoact2_ros.sim.summary import markdown, summarize

    run = {"variant": variant, "protocol": "node", "deviations": ["protocol node: x"],
           "synthetic_bundle": False}
    s = summarize([_record("libero_spatial/0/0")], run)
    assert s["suites"]["libero_spatial"]["published_rate"] == pytest.approx(spatial)
    assert model in s["published"]["model"]
    assert "molmoact2.mdx" in s["published"]["source"]
    text = "\n".join(summary_lines(s, [])) + markdown(s)
    assert model in text and "protocol: node" in text and "protocol node: x" in text
    assert "random-weight" not in text
