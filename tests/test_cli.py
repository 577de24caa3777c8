"""The ``molmoact2`` command line: help, version, exit statuses, summaries, messages, the fake."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest
from htp_helpers import ensure_contexts, fake_env

import molmoact2_ros
from molmoact2_ros.cli.app import build_parser, main
from molmoact2_ros.runtime import appbuilder

#: Every command, checked option by option.
OWNED = ("demo", "parity", "conventions", "tiny-bundle", "export-host", "replay",
         "trace-to-bag", "bench", "doctor", "device-report")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_help_lists_every_command_in_groups(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in _subparsers(build_parser()):
        assert re.search(rf"^  {re.escape(name)} +\S", out, re.M), name
    for group in ("run:", "check:", "bundle tools:", "exit status: 0 ok; 1 a check failed"):
        assert group in out
    assert "`" not in out.replace("`molmoact2", "")  # no reStructuredText backticks


@pytest.mark.parametrize("command", OWNED)
def test_every_option_of_a_command_has_help_and_shows_its_default(command, capsys):
    sub = _subparsers(build_parser())[command]
    for action in sub._actions:
        assert action.help, f"{command} {action.option_strings or action.dest} has no help"
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    for action in sub._actions:
        if action.option_strings and not (action.default is None or action.default is False
                                          or action.default is argparse.SUPPRESS):
            # argparse may wrap inside a value (also after a hyphen): compare without spaces
            want = "".join(f"(default: {action.default})".split())
            assert want in "".join(out.split()), action.dest


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"molmoact2 {molmoact2_ros.__version__}"


def test_console_script_exit_statuses(tiny_root):
    """The installed entry point: 0 ok, 2 bad input, as documented in --help."""
    run = [sys.executable, "-m", "molmoact2_ros.cli"]
    ok = subprocess.run(run + ["--version"], capture_output=True, text=True, check=False)
    bad = subprocess.run(run + ["demo", str(tiny_root), "--chunks", "0"], capture_output=True,
                         text=True, check=False)
    assert ok.returncode == 0 and bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: molmoact2 demo: argument --chunks: 0 is below the minimum 1 "
        "(see molmoact2 demo --help)"]


def _boom(args):
    raise RuntimeError("deliberately broken")


def test_unexpected_errors_are_one_line_and_traceback_only_with_debug(monkeypatch, capsys,
                                                                      tiny_root):
    import molmoact2_ros.cli.demo as demo

    monkeypatch.setattr(demo, "cmd_demo", _boom)
    assert main(["demo", str(tiny_root)]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: demo failed unexpectedly: RuntimeError: deliberately broken (rerun with "
        "molmoact2 --debug for the traceback)"]
    assert main(["--debug", "demo", str(tiny_root)]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "_boom" in err


def test_demo_excludes_warmup_explains_itself_and_names_the_variant(tiny_root, capsys):
    assert main(["demo", str(tiny_root / "lp_vtp_sd"), "--chunks", "3", "--warmup", "1"]) == 0
    out, err = capsys.readouterr()
    assert "== None" not in out
    assert ("== lp_vtp_sd: 2 flow steps, backend onnx, median and p95 of 3 chunks (1 warm-up "
            "chunks run first, not timed)") in out
    assert "tiny and random" in out and "molmoact2 bench" in out
    assert re.search(r"^demo: every chunk finite and 1 variant\(s\) ran; median total per chunk "
                     r"on onnx: lp_vtp_sd \d+ ms$", out.strip().splitlines()[-1])
    assert [ln.split(" (")[0] for ln in err.splitlines()] == [
        "demo lp_vtp_sd [1/4] warm-up", "demo lp_vtp_sd [2/4] chunk 1",
        "demo lp_vtp_sd [3/4] chunk 2", "demo lp_vtp_sd [4/4] chunk 3"]


def test_parity_over_the_fake_says_so(tiny_root, monkeypatch, capsys):
    """--appbuilder fake: the HTP workers import tests/fake_qai_appbuilder, and outputs say so."""
    if not (appbuilder.fake_path() / "qai_appbuilder").is_dir():
        pytest.skip("an installed package (colcon): --appbuilder fake needs a source checkout")
    ensure_contexts(tiny_root)
    monkeypatch.setattr(sys, "path", list(sys.path))  # use_test_fake edits both: undo after
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setenv(appbuilder.ENV, "installed")  # the option alone must choose the fake
    fake_env(monkeypatch)  # control variables off, resource tracker started before leak counts
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(appbuilder.fake_path())])
    assert not appbuilder.using_test_fake()
    code = main(["--appbuilder", "fake", "parity", str(tiny_root), "--variant", "grid_sampler",
                 "--backend", "htp"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "qai_appbuilder: test fake" in err.splitlines()[0]
    assert "== grid_sampler (htp (qai_appbuilder: test fake))" in out
    assert re.match(r"parity: PASS: (\d+)/\1 rows pass for grid_sampler on htp \(qai_appbuilder: "
                    r"test fake\)", out.strip().splitlines()[-1])


def test_appbuilder_env_var_selects_the_fake(monkeypatch, capsys):
    monkeypatch.setenv(appbuilder.ENV, "fake")
    assert build_parser().parse_args(["demo", "x"]).appbuilder == "fake"
    monkeypatch.delenv(appbuilder.ENV)
    assert build_parser().parse_args(["demo", "x"]).appbuilder == "installed"
    monkeypatch.setenv(appbuilder.ENV, "real")
    assert main(["demo", "x"]) == 2
    assert capsys.readouterr().err == (f"error: {appbuilder.ENV}='real': use one of installed, "
                                       "fake\n")


def test_replay_takes_a_variant_folder_as_bundle_root(tiny_root, tmp_path, capsys):
    """Was: 'bundle.grid_sampler is empty: set it to the grid_sampler bundle folder first'."""
    pytest.importorskip("rosbags")
    trace = tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz"
    assert main(["trace-to-bag", str(trace), str(tmp_path / "bag"), "--frames", "1"]) == 0
    from molmoact2_ros.bundle.golden import load_npz

    instruction = str(load_npz(trace, ["instruction"])["instruction"])
    code = main(["replay", str(tmp_path / "bag"), "--bundle-root", str(tiny_root / "grid_sampler"),
                 "--instruction", instruction])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "is empty" not in out + err and "1 chunks" in out


@pytest.mark.parametrize("argv, module, extra", [
    (["tiny-bundle", "{tmp}/t"], "onnx", "synth"),
    (["demo", "{tiny}/grid_sampler", "--chunks", "1"], "onnxruntime", "onnx"),
    (["parity", "{tiny}/grid_sampler"], "onnxruntime", "onnx"),
    (["replay", "bag", "--bundle-root", "{tiny}", "--instruction", "x"], "rosbags", "replay"),
    (["export-host", "{ckpt}", "{tmp}/b", "--variant", "grid_sampler"], "safetensors", "export"),
])
def test_a_missing_optional_dependency_names_its_extra(tiny_root, tmp_path, monkeypatch, capsys,
                                                       argv, module, extra):
    import shutil

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(tiny_root / "grid_sampler" / "host" / "tokenizer.json", ckpt)
    (ckpt / "m.safetensors").write_bytes(b"")
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: import raises
    argv = [a.format(tiny=tiny_root, tmp=tmp_path, ckpt=ckpt) for a in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"[{extra}]" in last, err
    assert "Traceback" not in out + err


def test_doctor_resolves_a_root_and_says_does_not_exist(tiny_root, tmp_path, capsys):
    """Was: '<root>/ctx/... is missing' for a root with --variant; an empty folder passed."""
    ensure_contexts(tiny_root)
    main(["doctor", str(tiny_root), "--variant", "fused", "--repeats", "1"])
    out = capsys.readouterr().out
    bundle_line = next(ln for ln in out.splitlines() if ln[6:].startswith("bundle "))
    assert bundle_line.startswith("PASS") and bundle_line.rstrip().endswith("fused (fused)")
    (tmp_path / "empty").mkdir()
    assert main(["doctor", str(tmp_path / "empty")]) == 1
    out = capsys.readouterr().out
    assert "FAIL  bundle" in out and "holds no bundle" in out
    assert main(["doctor", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_doctor_checks_every_variant_of_a_root(tiny_root, monkeypatch, capsys):
    """Like parity: a root without --variant checks each variant's bundle, not one FAIL line."""
    ensure_contexts(tiny_root)
    monkeypatch.setenv("PYTHONPATH", "")  # no qai_appbuilder: loads are skipped, files checked
    main(["doctor", str(tiny_root)])
    out = capsys.readouterr().out
    bundles = [ln for ln in out.splitlines() if ln[6:].startswith("bundle ")]
    assert [ln.rstrip().rsplit("(", 1)[-1] for ln in bundles] == \
        ["grid_sampler)", "lp_vtp_sd)", "fused)"], out
    assert all(ln.startswith("PASS") for ln in bundles), out


def test_bundle_parameters_from_a_root_or_one_variant_folder(tiny_root, tmp_path):
    """What replay --bundle-root and the launch file's bundle_root turn into parameters."""
    from molmoact2_ros.bundle.bundle import bundle_parameters

    assert bundle_parameters(tiny_root) == {
        f"bundle.{v}": str((tiny_root / v).resolve()) for v in ("grid_sampler", "lp_vtp_sd",
                                                                 "fused")}
    assert bundle_parameters(tiny_root / "fused") == {
        "bundle.fused": str((tiny_root / "fused").resolve())}
    from molmoact2_ros.errors import BundleError

    with pytest.raises(BundleError, match="does not exist"):
        bundle_parameters(tmp_path / "nowhere")
