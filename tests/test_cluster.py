"""``--ray`` against a real local Ray cluster (``ray.init(num_cpus=2)``, one per module): the
same verdicts as in-process, a killed actor's item re-run once and recorded once, bounded
retries, resume after an interrupt, and one-line refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from htp_helpers import leftover_threads, process_gone
from replay_helpers import obs_bag, run_cli, trace

ray = pytest.importorskip("ray")

from ray_helpers import local_ray  # noqa: E402

from molmoact2_ros.cluster.connect import ClusterError, is_address  # noqa: E402
from molmoact2_ros.cluster.fanout import Job, Resources, fan_out  # noqa: E402
from molmoact2_ros.replay.fleet import pair_bags, without_timing  # noqa: E402
from molmoact2_ros.replay.fleet_worker import check_bag, close_worker, setup_worker  # noqa: E402
from molmoact2_ros.util.ledger import LedgerWriter, read_ledger  # noqa: E402

INSTRUCTION = "pick up the bowl"
#: generous: Ray starts worker processes on a busy 2-core machine
WAIT_S = 120.0


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] not in ("Z", "X"):
                out.add(int(entry.name))
    return out


@pytest.fixture(scope="module")
def ray_session():
    """One local cluster of 2 CPUs for the module; afterwards no Ray process or thread of this
    process may be left."""
    threads = set(threading.enumerate())
    children = _children()
    with local_ray() as session:
        yield session
    deadline = time.monotonic() + WAIT_S
    while True:
        left = _children() - children
        extra = leftover_threads(threads)
        if not left and not extra or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left and not extra, f"Ray left processes {left} and threads {extra}"


@pytest.fixture(scope="module")
def fleet(tiny_root, tmp_path_factory):
    """Six bags of 3-5 observations with goldens recorded in-process; bag_4's golden comes
    from its recording with the cameras swapped (a failing bag) and bag_5 has none (an
    error verdict)."""
    root = tmp_path_factory.mktemp("fleet")
    tr = trace(tiny_root)
    bags = [str(obs_bag(root / f"bag_{i}", tr, frames=3 + i % 3, mcap=i % 2 == 0))
            for i in range(6)]
    goldens = root / "golden"
    from molmoact2_ros.cli.app import main

    base = ["replay", "--bundle-root", str(tiny_root), "--instruction", INSTRUCTION,
            "--no-progress"]
    assert main([*base, *bags[:4], "--record-dir", str(goldens)]) == 0
    swapped = obs_bag(root / "swapped" / "bag_4", tr, frames=4, swap=True)
    assert main([*base, str(swapped), "--record-dir", str(goldens)]) == 0
    return {"root": root, "bags": bags, "goldens": goldens, "tiny": tiny_root}


def _verdicts(folder: Path) -> list[dict]:
    data = json.loads((folder / "summary.json").read_text())
    return [without_timing(v) for v in data["verdicts"]]


def test_ray_verdicts_equal_the_in_process_ones(ray_session, fleet, tmp_path, capsys):
    args = ["replay", *fleet["bags"], "--bundle-root", fleet["tiny"], "--golden-dir",
            fleet["goldens"], "--no-progress"]
    rc_here, out_here, _ = run_cli([*args, "--report", tmp_path / "here"], capsys)
    rc_ray, out_ray, err = run_cli([*args, "--ray", "--report", tmp_path / "ray"], capsys)
    here, there = _verdicts(tmp_path / "here"), _verdicts(tmp_path / "ray")
    assert [v["status"] for v in here] == ["pass"] * 4 + ["fail", "error"]
    assert here == there
    assert rc_here == rc_ray == 2  # one bag could not be checked
    assert here[4]["passed"] < here[4]["compared"] == 4 and here[4]["worst"]["max_abs"] > 0
    assert "no golden chunk bag" in here[5]["error"]
    summary_lines = [ln for ln in out_here.splitlines() if not ln.startswith("report:")]
    for line in summary_lines[-4:]:
        assert line in out_ray
    assert "ray: 5 bags" not in out_ray and "ray: 6 bags on 2 actors" in out_ray, err


def test_goldens_recorded_on_ray_equal_the_in_process_ones(ray_session, fleet, tmp_path,
                                                           capsys):
    from molmoact2_ros.replay.chunkbag import read_chunk_bag

    bags = fleet["bags"][:3]
    rc, out, err = run_cli(["replay", "--ray", "local", *bags, "--bundle-root", fleet["tiny"],
                            "--instruction", INSTRUCTION, "--record-dir", tmp_path,
                            "--no-progress"], capsys)
    assert rc == 0, err
    for bag in bags:
        name = Path(bag).name
        ours, theirs = read_chunk_bag(tmp_path / name), read_chunk_bag(fleet["goldens"] / name)
        assert sorted(ours.chunks) == sorted(theirs.chunks)
        for stamp, chunk in theirs.chunks.items():
            assert (ours.chunks[stamp] == chunk).all()
    assert not list(tmp_path.glob("*.partial"))


def _options(fleet) -> dict:
    return {"bundle_root": str(fleet["tiny"]), "variant": None, "backend": "onnx",
            "instruction": None, "seed": None, "flow_steps": None, "max_age": 0.5,
            "namespace": "", "set": None, "storage": "mcap", "bag_version": 8,
            "min_cosine": None, "atol": None, "rtol": None, "min_within": None,
            "min_produced": 1.0, "appbuilder": "installed"}


def test_a_killed_actor_has_its_bag_rerun_once_and_recorded_once(ray_session, fleet,
                                                                  tmp_path):
    items = pair_bags(fleet["bags"], golden_dir=str(fleet["goldens"]))
    worker = setup_worker(_options(fleet))
    try:
        expected = {i.name: without_timing(check_bag(worker, i)) for i in items}
    finally:
        close_worker(worker)
    victim = items[2].name
    killed: list[int] = []

    def on_dispatch(key, actor, info):
        if key == victim and not killed:
            os.kill(info["pid"], signal.SIGKILL)  # the actor process, for real
            killed.append(info["pid"])

    outcomes = []
    with LedgerWriter(tmp_path / "verdicts.jsonl", "bag") as ledger:
        def on_result(outcome):
            outcomes.append(outcome)
            ledger.append(outcome.value)

        stats = fan_out([(i.name, i) for i in items],
                        Job(setup_worker, check_bag, _options(fleet), close_worker),
                        on_result, resources=Resources(num_cpus=1), max_retries=1,
                        on_dispatch=on_dispatch)
    assert killed and _wait(lambda: process_gone(killed[0]))
    assert stats.deaths == 1 and stats.retries == {victim: 1}
    assert stats.actors_started == stats.actors + 1 and stats.duplicates == 0
    assert sorted(o.key for o in outcomes) == sorted(expected)  # every bag, once
    rerun = next(o for o in outcomes if o.key == victim)
    assert rerun.attempts == 2 and not rerun.error
    assert {o.key: without_timing(o.value) for o in outcomes} == expected
    lines = read_ledger(tmp_path / "verdicts.jsonl", "bag")
    assert sorted(v["bag"] for v in lines) == sorted(expected)


def _wait(condition, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- the generic fan-out, with work defined here (shipped to the actors by value) ----------------
def _setup(arg):
    return {"setups": arg}


def _work(state, payload):
    if payload == "crash":
        os._exit(3)  # the actor process dies mid-item, as an OOM kill would do it
    if payload == "raise":
        raise ValueError("bad item")
    if payload == "wedge":
        time.sleep(3600)  # a GL deadlock, a hung worker: no result, no death
    return payload * 2


def _job() -> Job:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return Job(_setup, _work, "x")


def test_an_item_that_kills_every_actor_fails_after_bounded_retries(ray_session):
    items = [("a", 1), ("b", "crash"), ("c", 3), ("d", "raise"), ("e", 5)]
    outcomes = []
    stats = fan_out(items, _job(), outcomes.append, resources=Resources(num_cpus=1),
                    max_retries=2)
    by_key = {o.key: o for o in outcomes}
    assert sorted(by_key) == ["a", "b", "c", "d", "e"] and len(outcomes) == 5
    assert [by_key[k].value for k in "ace"] == [2, 6, 10]
    assert "died 3 times" in by_key["b"].error and by_key["b"].attempts == 3
    assert by_key["d"].error == "ValueError: bad item" and by_key["d"].attempts == 1
    assert stats.deaths == 3 and stats.retries == {"b": 2}


def test_a_wedged_item_is_killed_retried_then_reported_while_the_rest_goes_on(ray_session):
    items = [("a", 1), ("w", "wedge"), ("c", 3), ("e", 5)]
    outcomes = []
    stats = fan_out(items, _job(), outcomes.append, resources=Resources(num_cpus=1),
                    max_retries=1, item_timeout_s={"a": 60.0, "w": 10.0, "c": 60.0, "e": 60.0})
    by_key = {o.key: o for o in outcomes}
    assert sorted(by_key) == ["a", "c", "e", "w"] and len(outcomes) == 4
    assert [by_key[k].value for k in "ace"] == [2, 6, 10]
    assert by_key["w"].error.startswith("no result within 10 s (--item-timeout-s), 2 times")
    assert by_key["w"].attempts == 2 and stats.timeouts == {"w": 2} and stats.deaths == 0


def test_the_clusters_gcs_answers_the_join_probe_as_grpc(ray_session):
    from molmoact2_ros.cluster.connect import answer_at

    host, port = ray_session.get_runtime_context().gcs_address.rsplit(":", 1)
    assert answer_at(host, int(port)) is None


def test_resume_after_an_interrupt_runs_every_item_once(ray_session, tmp_path):
    items = [(f"k{i}", i) for i in range(6)]
    ledger_path = tmp_path / "ledger.jsonl"
    with LedgerWriter(ledger_path, "key") as ledger:
        first = fan_out(items, _job(), lambda o: ledger.append({"key": o.key, "v": o.value}),
                        resources=Resources(num_cpus=1), actors=1,
                        should_stop=lambda: len(ledger.keys) >= 2)
    assert first.interrupted
    done = [r["key"] for r in read_ledger(ledger_path, "key")]
    assert 2 <= len(done) < 6
    with LedgerWriter(ledger_path, "key") as ledger:
        second = fan_out(items, _job(), lambda o: ledger.append({"key": o.key, "v": o.value}),
                         resources=Resources(num_cpus=1), done=ledger.keys)
    records = read_ledger(ledger_path, "key")
    assert sorted(r["key"] for r in records) == [k for k, _ in items]
    assert {r["key"]: r["v"] for r in records} == {k: 2 * v for k, v in items}
    assert second.items == 6 - len(done)


def _env_setup(arg):
    return None


def _env_work(state, payload):
    return {k: os.environ.get(k) for k in payload}


def test_an_actor_keeps_its_thread_pools_within_its_declared_cpus(ray_session, monkeypatch):
    """llvmpipe's render threads and ONNX Runtime's pool are sized by the declared CPUs, so two
    actors on two cores do not each spin threads over both (a driver's own setting wins)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    names = ("LP_NUM_THREADS", "MOLMOACT2_THREADS", "OMP_NUM_THREADS")
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MOLMOACT2_THREADS", raising=False)
    got = []
    fan_out([("a", names)], Job(_env_setup, _env_work), got.append,
            resources=Resources(num_cpus=1))
    assert got[0].value == {"LP_NUM_THREADS": "1", "MOLMOACT2_THREADS": "1",
                            "OMP_NUM_THREADS": "1"}, got[0]
    monkeypatch.setenv("LP_NUM_THREADS", "2")
    got.clear()
    fan_out([("a", names)], Job(_env_setup, _env_work), got.append,
            resources=Resources(num_cpus=1))
    assert got[0].value["LP_NUM_THREADS"] == "2", got[0]


def test_an_actor_that_cannot_hold_its_resources_is_refused(ray_session):
    with pytest.raises(ClusterError, match="no node of the Ray cluster can hold an actor of "
                       "64 CPU"):
        fan_out([("a", 1)], _job(), print, resources=Resources(num_cpus=64))


def test_replay_with_a_wedged_bag_finishes_and_reports_it(ray_session, fleet, tmp_path, capsys):
    wedged = tmp_path / "wedged" / "bag_0.mcap"  # pairs with bag_0's golden
    wedged.parent.mkdir()
    os.mkfifo(wedged)  # opening it for reading blocks: a hung read, not an error
    rc, out, err = run_cli(["replay", "--ray", *fleet["bags"][1:3], str(wedged),
                            "--bundle-root", fleet["tiny"], "--golden-dir", fleet["goldens"],
                            "--ray-retries", "0", "--item-timeout-s", "60", "--no-progress",
                            "--report", tmp_path / "report"], capsys)
    assert rc == 2, err
    verdicts = {v["bag"]: v for v in _verdicts(tmp_path / "report")}
    assert verdicts["bag_1"]["status"] == verdicts["bag_2"]["status"] == "pass"
    assert verdicts["bag_0"]["status"] == "error"
    assert "no result within 60 s (--item-timeout-s)" in verdicts["bag_0"]["error"]
    assert "past their deadline: bag_0 x1" in out


def test_a_setup_that_fails_names_the_node_and_the_cause(ray_session, fleet, tmp_path, capsys):
    rc, out, err = run_cli(["replay", "--ray", *fleet["bags"][:2], "--bundle-root",
                            tmp_path / "nowhere", "--golden-dir", fleet["goldens"],
                            "--no-progress"], capsys)
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: actor setup failed on ") and "nowhere" in line, err


# -- refusals and the path without Ray ------------------------------------------------------------
def test_an_unreachable_address_is_refused_in_one_line(fleet, capsys):
    rc, out, err = run_cli(["replay", "--ray", "127.0.0.1:9", *fleet["bags"][:2],
                            "--bundle-root", fleet["tiny"], "--golden-dir", fleet["goldens"]],
                           capsys)
    assert rc == 2
    assert err.strip() == ("error: --ray 127.0.0.1:9: no Ray cluster answers there "
                           "(Connection refused); start one with `ray start --head` and pass "
                           "the address it prints, or use --ray local")


def test_missing_ray_is_refused_naming_the_extra(fleet, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an install without the extra sees
    rc, out, err = run_cli(["replay", "--ray", *fleet["bags"][:2], "--bundle-root",
                            fleet["tiny"], "--golden-dir", fleet["goldens"]], capsys)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1
    assert "'ray'" in err and "pip install -e '.[cluster]'" in err


def test_ray_takes_an_address_or_leaves_the_word_to_the_bags():
    from argparse import Namespace

    from molmoact2_ros.cli.ray_args import fix_ray_address

    assert all(is_address(a) for a in ("local", "auto", "10.0.0.5:6379", "ray://head:10001",
                                       "[::1]:6379"))
    assert not any(is_address(a) for a in ("bag_0", "/data/bag:1", "run.mcap", None))
    args = Namespace(ray="bag_0", bags=["bag_1"])
    fix_ray_address(args, "bags")
    assert args.ray == "local" and args.bags == ["bag_0", "bag_1"]


def test_many_bags_without_ray_never_import_it(fleet, tmp_path):

    code = ("import sys; from molmoact2_ros.cli.app import main; "
            f"rc = main({['replay', *fleet['bags'][:2], '--bundle-root', str(fleet['tiny']), '--golden-dir', str(fleet['goldens']), '--no-progress']!r}); "  # noqa: E501
            "print(rc, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 False", out.stdout + out.stderr


def test_an_interrupted_many_bag_run_resumes_from_its_ledger(fleet, tmp_path, capsys):
    args = ["replay", *fleet["bags"][:4], "--bundle-root", fleet["tiny"], "--golden-dir",
            fleet["goldens"], "--report", tmp_path, "--no-progress"]
    assert run_cli(args, capsys)[0] == 0
    full = _verdicts(tmp_path)
    # as if interrupted after two bags, the third torn while it was written
    lines = (tmp_path / "verdicts.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if json.loads(ln)["bag"] in ("bag_0", "bag_2")]
    (tmp_path / "verdicts.jsonl").write_text("\n".join(kept) + "\n" + lines[-1][:25])
    for name in ("summary.json", "summary.md"):
        (tmp_path / name).unlink()
    rc, out, err = run_cli(args, capsys)
    assert rc == 0, err
    assert "resuming: 2 of 4 bags already in" in out
    assert sum(line.startswith("PASS     bag_") for line in out.splitlines()) == 2
    assert _verdicts(tmp_path) == full
    assert len(read_ledger(tmp_path / "verdicts.jsonl", "bag")) == 4
    rc, out, err = run_cli(args, capsys)
    assert rc == 2 and "holds a finished report" in err


def test_ledger_refuses_a_repeated_key_and_drops_a_torn_tail(tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_text('{"bag": "a"}\n{"bag": "b"}\n{"bag": "c", "x": ')
    assert [r["bag"] for r in read_ledger(path, "bag")] == ["a", "b"]
    with LedgerWriter(path, "bag") as writer:
        assert not writer.append({"bag": "a"})
        assert writer.append({"bag": "c"})
    assert [r["bag"] for r in read_ledger(path, "bag")] == ["a", "b", "c"]
    path.write_text('{"bag": "a"}\n{"bag": "a"}\n')
    from molmoact2_ros.errors import MolmoActError

    with pytest.raises(MolmoActError, match=r"l.jsonl:2 repeats bag 'a'"):
        read_ledger(path, "bag")


def test_merged_report_names_the_worst_bag_and_the_settings_that_differ():
    from molmoact2_ros.replay.fleet import format_merged, merge

    def v(bag, status, max_abs, passed, differences=()):
        return {"bag": bag, "status": status, "differences": list(differences),
                "worst": {"stamp_ns": 1_500_000_000, "cosine": 0.9, "max_abs": max_abs,
                          "row": 3, "dim": 6, "name": "gripper", "within_tol": 0.5,
                          "passed": passed}}

    report = merge([v("a", "pass", 1e-4, True), v("b", "fail", 0.01, False, ["seed 1 (golden 7)"]),
                    v("c", "pass", 0.5, True, ["seed 1 (golden 7)"]),
                    {"bag": "d", "status": "error", "error": "no golden"}])
    assert (report["pass"], report["fail"], report["error"], report["ok"]) == (2, 1, 1, False)
    assert report["worst"]["bag"] == "b"  # a failed chunk comes before a larger passing one
    assert report["settings_differ"] == {"seed": ["b", "c"]}
    text = format_merged(report)
    assert "worst: b chunk 1.500000000 s, max-abs 0.01 at action 3 gripper" in text
    assert "seed differs from the golden in 2 bags: b, c" in text and text.endswith("FAIL")

