"""Output paths and inputs of every writing command: a file this package did not write, a
symlink or a resumed run's earlier output is never replaced (one line, exit 2, every byte as
it was), and inputs that would be ignored are refused.

The output policy is ``molmoact2_ros/util/outputs.py``; each case names the finding it covers.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from molmoact2_ros.util import outputs
from molmoact2_ros.util.ledger import LedgerWriter, read_ledger

INSTRUCTION = "put the bowl on the plate"


def _snapshot(*folders: Path) -> dict[str, object]:
    """Every entry below ``folders``: bytes of files, targets of symlinks (not followed)."""
    seen: dict[str, object] = {}
    for folder in folders:
        for root, dirs, files in os.walk(folder, followlinks=False):
            for name in dirs + files:
                p = Path(root) / name
                if p.is_symlink():
                    seen[str(p)] = ("link", os.readlink(p))
                elif p.is_file():
                    seen[str(p)] = p.read_bytes()
                else:
                    seen[str(p)] = "<dir>"
    return seen


def _run(argv, capsys):
    from molmoact2_ros.cli.app import main

    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _refused(rc, out, err, pattern):
    assert rc == 2, out + err
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture
def foreign(tmp_path, tiny_root):
    """A user's folder: files and folders this package did not write, and symlinks out of it
    (to a file and to a bag-looking folder elsewhere); and two real observation bags."""
    from replay_helpers import obs_bag, trace

    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "bag").mkdir(parents=True)
    (elsewhere / "bag" / "metadata.yaml").write_text("rosbag2_bagfile_information: {}\n")
    (elsewhere / "secret.txt").write_text("not yours\n")
    home.mkdir()
    (home / "notes.txt").write_text("my notes\n")
    (home / "paper.tex").write_text("\\documentclass{article}\n")
    (home / "summary.json").write_text('{"mine": true}\n')
    (home / "bench.json").write_text("[]\n")
    (home / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\nmine")
    (home / "report.md").write_text("# mine\n")
    (home / "looks_like_a_bag").mkdir()
    (home / "looks_like_a_bag" / "metadata.yaml").write_text("rosbag2_bagfile_information: {}\n")
    (home / "looks_like_a_bag" / "data.db3").write_bytes(b"SQLite format 3\x00 mine")
    (home / "grid_sampler").mkdir()  # a folder named like a tiny bundle's variant
    (home / "grid_sampler" / "bundle.json").write_text('{"mine": true}\n')
    (home / "bundle" / "host").mkdir(parents=True)  # a bundle with a user's host/ files
    (home / "bundle" / "host" / "prompt.json").write_text('{"mine": true}\n')
    (home / "bundle" / "norm_stats.json").write_text('{"mine": true}\n')
    (home / "linked_bundle" / "host").mkdir(parents=True)
    (home / "linked_bundle" / "host" / "tokenizer.json").symlink_to(elsewhere / "secret.txt")
    (tmp_path / "input" / "checkpoint").mkdir(parents=True)
    (tmp_path / "input" / "checkpoint" / "tokenizer.json").write_text("{}\n")
    (home / "link.txt").symlink_to(elsewhere / "secret.txt")
    (home / "link_bag").symlink_to(elsewhere / "bag")
    (home / "dangling").symlink_to(tmp_path / "nowhere")
    tr = trace(tiny_root, "lp_vtp_sd")
    for name in ("obs", "looks_like_a_bag"):  # the second records onto home's folder of its name
        obs_bag(tmp_path / "input" / name, tr, 1)
    return tmp_path


# -- every writing command over foreign files and symlinks -----------------------------------------

def _commands(t: Path, tiny_root: Path) -> list[tuple[str, list[str], str]]:
    home, obs = t / "home", t / "input" / "obs"
    trace = tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz"
    replay = ["replay", obs, "--bundle-root", tiny_root, "--variant", "lp_vtp_sd",
              "--instruction", INSTRUCTION, "--no-progress"]
    rows = []
    for target in ("notes.txt", "paper.tex", "looks_like_a_bag", "link_bag", "link.txt",
                   "dangling"):
        why = ("symlink" if target.startswith(("link", "dangl"))
               else "not replaced, even with --force")
        rows.append((f"replay --record {target}", [*replay, "--record", home / target,
                                                   "--force"], why))
        rows.append((f"trace-to-bag {target}", ["trace-to-bag", trace, home / target,
                                                "--force"], why))
    for target in ("notes.txt", "report.md"):
        rows.append((f"device-report --out {target}",
                     ["device-report", tiny_root, "--out", home / target, "--force"],
                     "this package did not write it"))
    rows.append(("device-report --out link.txt",
                 ["device-report", tiny_root, "--out", home / "link.txt", "--force"], "symlink"))
    for target, why in (("bench.json", "this package did not write it"),
                        ("link.txt", "symlink"), ("dangling", "symlink")):
        rows.append((f"bench --json {target}", ["bench", "--json", home / target, "--force"],
                     why))
        rows.append((f"bench --closed-loop --plot {target}",
                     ["bench", "--closed-loop", "--plot", home / target, "--force"], why))
    rows.append(("bench --closed-loop --plot plot.png",
                 ["bench", "--closed-loop", "--plot", home / "plot.png", "--force"],
                 "this package did not write it"))
    rows.append(("compare --report home", ["compare", obs, obs, "--report", home, "--force"],
                 "summary.json exists and this package did not write it"))
    rows.append(("compare --report link_bag", ["compare", obs, obs, "--report",
                                               home / "link_bag", "--force"], "symlink"))
    rows.append(("replay --report home", [*replay, "--report", home, "--force"],
                 "summary.json exists and this package did not write it"))
    rows.append(("replay --record-dir home (resumable many-bag run)",
                 ["replay", t / "input" / "looks_like_a_bag", "--record-dir", home,
                  "--bundle-root", tiny_root, "--variant", "lp_vtp_sd",
                  "--instruction", INSTRUCTION, "--no-progress", "--force"],
                 "looks_like_a_bag is not replaced, even with --force"))
    rows.append(("replay --report link_bag (many bags)",
                 ["replay", obs, t / "input" / "looks_like_a_bag", "--golden-dir", t / "input",
                  "--report",
                  home / "link_bag", "--bundle-root", tiny_root, "--force"], "symlink"))
    for target, why in (("", "grid_sampler is not replaced, even with --force"),
                        ("link_bag", "symlink")):
        rows.append((f"tiny-bundle home/{target}", ["tiny-bundle", home / target, "--variants",
                                                    "grid_sampler", "--force"], why))
    ckpt = t / "input" / "checkpoint"
    rows.append(("export-host into a bundle with a user's host/prompt.json",
                 ["export-host", ckpt, home / "bundle", "--force"],
                 "prompt.json exists and this package did not write it"))
    rows.append(("export-host over a symlinked host/tokenizer.json",
                 ["export-host", ckpt, home / "linked_bundle", "--force"], "symlink"))
    return rows


def test_no_writing_command_changes_a_foreign_byte(foreign, tiny_root, capsys):
    """Finding (data loss): --force deleted whatever sat at an output path. Every command
    that writes, pointed with --force at files and folders it did not write and at
    symlinks, refuses in one line and leaves every byte (and every link) as it was."""
    before = _snapshot(foreign)
    failures = []
    for label, argv, why in _commands(foreign, tiny_root):
        rc, out, err = _run(argv, capsys)
        line = err.strip().splitlines()[-1] if err.strip() else ""
        if rc != 2 or "Traceback" in out + err or why not in line:
            failures.append(f"{label}: exit {rc}: {line or out[-200:]}")
        now = _snapshot(foreign)
        if now != before:
            changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
            failures.append(f"{label} changed {changed}")
            before = now
    assert not failures, "\n".join(failures)


def test_conventions_write_keeps_the_file_it_replaces(tiny_root, tmp_path, capsys):
    """conventions --write repairs host/conventions.json on purpose; the previous bytes are
    kept beside it, and a symlinked file is refused with the file outside unchanged."""
    import shutil

    bundle = tmp_path / "lp_vtp_sd"
    shutil.copytree(tiny_root / "lp_vtp_sd", bundle, ignore=shutil.ignore_patterns("ctx", "onnx"))
    conv = bundle / "host" / "conventions.json"
    wrong = json.loads(conv.read_text())
    wrong["padding_side"] = "right" if wrong["padding_side"] == "left" else "left"
    conv.write_text(json.dumps(wrong) + "\n")
    old = conv.read_bytes()
    rc, out, err = _run(["conventions", bundle, "--write"], capsys)
    kept = list(conv.parent.glob("conventions.json.*.orig"))
    assert len(kept) == 1 and kept[0].read_bytes() == old, out + err
    outside = tmp_path / "outside.json"
    outside.write_bytes(old)
    conv.unlink()
    conv.symlink_to(outside)
    before = _snapshot(tmp_path)
    rc, out, err = _run(["conventions", bundle, "--write"], capsys)
    assert rc == 2 and "is a symlink" in err and _snapshot(tmp_path) == before


# -- the policy itself ----------------------------------------------------------------------------

def test_force_replaces_only_what_the_package_wrote(tmp_path):
    """A file the package wrote is replaced with --force; after someone edits it, not."""
    out = tmp_path / "bench.json"
    outputs.write_file(out, "[1]\n", what="--json")
    with pytest.raises(outputs.OutputRefused, match="exists already"):
        outputs.check_file(out, force=False, what="--json")
    assert outputs.check_file(out, force=True, what="--json") == out
    outputs.write_file(out, "[2]\n", what="--json")
    out.write_text("[2, 'edited by hand']\n")
    with pytest.raises(outputs.OutputRefused, match="changed since this package wrote it"):
        outputs.check_file(out, force=True, what="--json")
    with pytest.raises(outputs.OutputRefused, match="changed since"):
        outputs.write_file(out, "[3]\n", what="--json")
    assert out.read_text() == "[2, 'edited by hand']\n"


def test_force_replaces_a_recorded_bag_but_not_one_with_a_foreign_file(tiny_root, tmp_path,
                                                                         capsys):
    """trace-to-bag --force replaces the bag it wrote; a file added to that bag by someone
    else makes it foreign (refused, naming the file)."""
    trace = tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz"
    out = tmp_path / "obs"
    assert _run(["trace-to-bag", trace, out, "--frames", "1"], capsys)[0] == 0
    assert (out / outputs.MARKER).is_file()
    assert _run(["trace-to-bag", trace, out, "--frames", "2", "--force"], capsys)[0] == 0
    (out / "notes.txt").write_text("mine\n")
    before = _snapshot(tmp_path)
    _refused(*_run(["trace-to-bag", trace, out, "--force"], capsys),
             r"obs is not replaced, even with --force: it holds notes\.txt")
    assert _snapshot(tmp_path) == before


def test_symlinked_record_is_refused_before_the_policy_loads(tiny_root, tmp_path, capsys):
    """Finding: ``replay --record <symlink to a bag> --force`` was refused only after the
    policy loaded, with shutil's message. Now: first, naming the link and the fix."""
    real = tmp_path / "golden"
    real.mkdir()
    (real / "metadata.yaml").write_text("x: 1\n")
    (tmp_path / "link").symlink_to(real)
    before = _snapshot(tmp_path)
    rc, out, err = _run(["replay", tmp_path / "missing_bag_is_checked_later", "--bundle-root",
                         tiny_root, "--instruction", INSTRUCTION, "--record", tmp_path / "link",
                         "--force", "--no-progress"], capsys)
    _refused(rc, out, err, r"--record bag .*link is a symlink \(to .*golden\); outputs are "
             r"never written through a link")
    assert _snapshot(tmp_path) == before


# -- ledgers --------------------------------------------------------------------------------------

def test_ledger_keeps_a_last_record_without_its_newline(tmp_path):
    """Finding: replay's verdicts.jsonl lost its last record when it lacked its newline."""
    path = tmp_path / "verdicts.jsonl"
    path.write_text('{"bag": "a"}\n{"bag": "b"}')
    with LedgerWriter(path, "bag") as w:
        w.append({"bag": "c"})
    assert [r["bag"] for r in read_ledger(path, "bag")] == ["a", "b", "c"]
    assert not path.with_name("verdicts.jsonl.partial").exists()


def test_ledger_sets_a_torn_line_aside_and_never_deletes_it(tmp_path):
    """A torn last line goes to ``.partial`` (appended to what is there), never deleted."""
    path = tmp_path / "verdicts.jsonl"
    aside = tmp_path / "verdicts.jsonl.partial"
    aside.write_text("earlier torn line\n")
    path.write_text('{"bag": "a"}\n{"bag": "b", "stat')
    with LedgerWriter(path, "bag") as w:
        w.append({"bag": "b"})
    assert [r["bag"] for r in read_ledger(path, "bag")] == ["a", "b"]
    assert aside.read_text() == 'earlier torn line\n{"bag": "b", "stat\n'


# -- a resumed many-bag run ----------------------------------------------------------------------

def test_resumed_record_dir_keeps_an_earlier_golden(tiny_root, tmp_path, capsys):
    """Finding: a resumed ``replay --record-dir`` replaced an existing golden without
    --force (the guard was skipped once the ledger had entries)."""
    from replay_helpers import obs_bag, trace

    tr = trace(tiny_root, "lp_vtp_sd")
    bags = [obs_bag(tmp_path / "in" / name, tr, 1) for name in ("a", "b")]
    goldens, report = tmp_path / "goldens", tmp_path / "report"
    argv = ["replay", *bags, "--record-dir", goldens, "--report", report, "--bundle-root",
            tiny_root, "--variant", "lp_vtp_sd", "--instruction", INSTRUCTION, "--no-progress"]
    rc, out, err = _run(argv, capsys)
    assert rc == 0, out + err
    # as if interrupted after b's golden was written but before its verdict was: resume
    ledger = report / "verdicts.jsonl"
    lines = ledger.read_text().splitlines()
    ledger.write_text("\n".join(ln for ln in lines if json.loads(ln)["bag"] == "a") + "\n")
    (report / "summary.json").unlink()
    (report / "summary.md").unlink()
    before = _snapshot(goldens)
    _refused(*_run(argv, capsys), r"--record-dir bag .*goldens/b exists already")
    assert _snapshot(goldens) == before
    rc, out, err = _run([*argv, "--force"], capsys)
    assert rc == 0 and "resuming" not in out, out + err  # --force starts over


# -- inputs accepted and ignored ------------------------------------------------------------------

def test_compare_report_inside_an_input_bag_is_refused(foreign, capsys):
    """Finding: ``compare --report`` could point inside an input bag."""
    obs = foreign / "input" / "obs"
    before = _snapshot(foreign)
    _refused(*_run(["compare", obs, foreign / "home", "--report", obs / "report"], capsys),
             r"--report .*obs/report lies inside the input A")
    assert _snapshot(foreign) == before


def test_compare_missing_bundle_root_is_refused(foreign, capsys):
    """Finding: ``compare --bundle-root <missing>`` was ignored."""
    obs = foreign / "input" / "obs"
    _refused(*_run(["compare", obs, obs, "--bundle-root", foreign / "nothing"], capsys),
             r"--bundle-root: bundle path .*nothing does not exist")


@pytest.mark.parametrize("command", ["replay", "compare"])
def test_atol_with_the_wrong_number_of_values_is_bad_input(command, tiny_root, tmp_path,
                                                           capsys):
    """Finding: ``--atol`` with the wrong number of values exited 1, not 2."""
    from replay_helpers import obs_bag, trace

    obs = obs_bag(tmp_path / "obs", trace(tiny_root, "lp_vtp_sd"), 1)
    common = ["--bundle-root", tiny_root, "--variant", "lp_vtp_sd", "--instruction",
              INSTRUCTION, "--no-progress"]
    if command == "compare":
        import shutil

        assert _run(["replay", obs, "--record", tmp_path / "a", *common], capsys)[0] == 0
        shutil.copytree(tmp_path / "a", tmp_path / "b")
        argv = ["compare", tmp_path / "a", tmp_path / "b", "--atol", "0.1,0.2"]
    else:
        argv = ["replay", obs, *common, "--atol", "0.1,0.2"]
    _refused(*_run(argv, capsys), r"--atol gives 2 values but the actions have 7 dimensions")


@pytest.mark.parametrize("row, fragment", [
    ({"precision": "fp64"}, "precision is 'fp64'; it applies to none of this bundle's contexts"),
    ({"precision": "w8a8"}, "use fp32, fp16 or a context suffix (fp16, fp32, w4a16)"),
    ({"tensor": "chunks"}, "tensor 'chunks' is in no e2e golden (e2e_trace*.npz)"),
], ids=["unknown-precision", "precision-without-contexts", "unknown-tensor"])
def test_tolerance_rows_that_never_apply_are_refused(row, fragment, tiny_root, tmp_path,
                                                     capsys):
    """Finding: ``tolerances.json`` rows with an unknown precision or tensor were accepted and
    never applied."""
    import shutil

    bundle = tmp_path / "lp_vtp_sd"
    shutil.copytree(tiny_root / "lp_vtp_sd", bundle)
    limit = {"component": "e2e", "precision": "fp32", "tensor": "chunk", "atol": 0.1,
             "why": "a documented difference", **row}
    (bundle / "golden" / "tolerances.json").write_text(json.dumps(
        {"format": "molmoact2_tolerances.v1", "limits": [limit]}))
    rc, out, err = _run(["parity", bundle], capsys)
    assert rc == 2 and "limits[0]: " in err and fragment in err, out + err


def test_ray_port_outside_the_tcp_range_is_refused(tiny_root, tmp_path, capsys):
    """Finding: ``--ray 127.0.0.1:99999`` passed the address check and was probed at port
    34463 (99999 mod 65536)."""
    from molmoact2_ros.cluster.connect import ClusterError, probe

    with pytest.raises(ClusterError, match="port 99999 is outside 1..65535"):
        probe("127.0.0.1:99999", timeout_s=0.1)
    rc, out, err = _run(["replay", tmp_path / "bag", "--ray", "127.0.0.1:99999",
                         "--bundle-root", tiny_root], capsys)
    _refused(rc, out, err, r"--ray 127\.0\.0\.1:99999: port 99999 is outside 1\.\.65535")


def test_device_report_refuses_a_seed_trace_whose_cosine_is_text(tiny_root, tmp_path, capsys):
    """Finding: a seed trace whose ``final_action_cosine`` is a string showed only as
    ``ValueError: could not convert string to float`` inside a section (exit 1)."""
    from test_seed_workspace import seed_001

    ws = seed_001(tiny_root, tmp_path)
    path = ws / "golden" / "trace.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "final_action_cosine": "high"}))
    rc, out, err = _run(["device-report", ws, "--variant", "grid_sampler", "--out",
                         tmp_path / "r.md"], capsys)
    _refused(rc, out, err, r"trace\.json: final_action_cosine is 'high' \(str\); it must be a "
             r"number in \[-1, 1\]")
    assert not (tmp_path / "r.md").exists()


def test_device_report_refuses_a_golden_of_a_variant_the_root_lacks(tiny_root, tmp_path,
                                                                    capsys):
    """Finding: a golden recorded with a variant the bundle root lacks was found only at the
    end of ``device-report`` (exit 1 after every section ran), not refused up front."""
    from replay_helpers import obs_bag, trace

    bag = obs_bag(tmp_path / "obs", trace(tiny_root, "lp_vtp_sd"), 1)
    golden = tmp_path / "golden"
    assert _run(["replay", bag, "--bundle-root", tiny_root, "--variant", "lp_vtp_sd",
                 "--instruction", INSTRUCTION, "--record", golden, "--no-progress"],
                capsys)[0] == 0
    rc, out, err = _run(["device-report", tiny_root / "grid_sampler", "--out", tmp_path / "r.md",
                         "--bag", bag, "--golden", golden], capsys)
    _refused(rc, out, err, r"--golden .*golden was recorded with variant lp_vtp_sd, which the "
             r"bundle root .*grid_sampler does not hold \(it holds grid_sampler\)")
    assert not (tmp_path / "r.md").exists()
