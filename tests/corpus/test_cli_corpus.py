"""Bad CLI input, table-driven: each case exits 2 with one line naming the problem, no traceback."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from molmoact2_ros.cli.app import main

pytestmark = pytest.mark.usefixtures("no_leaks")


def _checkpoint(tiny: Path, tmp: Path) -> Path:
    """A minimal checkpoint folder: tokenizer.json plus one bfloat16 safetensors file."""
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    shutil.copy(tiny / "grid_sampler" / "host" / "tokenizer.json", ckpt)
    header = {"x.wte.embedding": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
              "x.wte.new_embedding": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [8, 12]}}
    raw = json.dumps(header).encode()
    (ckpt / "m.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(12))
    return ckpt


def _variant_copy(tiny: Path, tmp: Path, name: str = "grid_sampler") -> Path:
    dst = tmp / "copy" / name
    shutil.copytree(tiny / name, dst, ignore=shutil.ignore_patterns("ctx", "onnx"))
    return dst


def _file(tiny: Path, tmp: Path) -> Path:
    (tmp / "a_file").write_text("x")
    return tmp / "a_file"


def _empty(tiny: Path, tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _no_manifest(tiny: Path, tmp: Path) -> Path:
    dst = _variant_copy(tiny, tmp)
    (dst / "bundle.json").unlink()
    return dst


def _manifest(text: str):
    def make(tiny: Path, tmp: Path) -> Path:
        dst = _variant_copy(tiny, tmp)
        (dst / "bundle.json").write_text(text)
        return dst
    return make


def _corrupt_shard(tiny: Path, tmp: Path) -> Path:
    ckpt = _checkpoint(tiny, tmp)
    (ckpt / "m.safetensors").write_bytes(b"\xff" * 40)
    return ckpt


def _index(text: str):
    def make(tiny: Path, tmp: Path) -> Path:
        ckpt = _checkpoint(tiny, tmp)
        (ckpt / "model.safetensors.index.json").write_text(text)
        return ckpt
    return make


def _no_tokenizer(tiny: Path, tmp: Path) -> Path:
    ckpt = _checkpoint(tiny, tmp)
    (ckpt / "tokenizer.json").unlink()
    return ckpt


def _linked_conventions(tiny: Path, tmp: Path) -> Path:
    """A bundle whose host/conventions.json (wrong values) is a symlink to a file outside."""
    dst = _variant_copy(tiny, tmp)
    conv = dst / "host" / "conventions.json"
    data = json.loads(conv.read_text())
    data["padding_side"] = "left" if data["padding_side"] == "right" else "right"
    (tmp / "outside.json").write_text(json.dumps(data))
    conv.unlink()
    conv.symlink_to(tmp / "outside.json")
    return dst


def _linked_host(tiny: Path, tmp: Path) -> Path:
    """A bundle whose host/ folder is a symlink to a folder outside it."""
    dst = _variant_copy(tiny, tmp)
    shutil.move(dst / "host", tmp / "outside_host")
    (dst / "host").symlink_to(tmp / "outside_host")
    (tmp / "outside_host" / "conventions.json").unlink()
    return dst


T = "{tiny}"  # the tiny bundle root
# (case id, argv with {tiny}/{made}/{tmp} placeholders, maker for {made}, expected message)
CASES = [
    ("min-cosine negative", ["parity", T, "--min-cosine", "-5"], None,
     "argument --min-cosine: -5.0 is outside (0.0, 1.0]"),
    ("min-cosine above 1", ["parity", T, "--min-cosine", "1.5"], None, "1.5 is outside (0.0, 1.0]"),
    ("min-cosine zero", ["parity", T, "--min-cosine", "0"], None, "0.0 is outside (0.0, 1.0]"),
    ("min-cosine nan", ["parity", T, "--min-cosine", "nan"], None, "'nan' is not a finite number"),
    ("min-cosine text", ["parity", T, "--min-cosine", "high"], None, "'high' is not a number"),
    ("demo chunks 0", ["demo", T, "--chunks", "0"], None,
     "argument --chunks: 0 is below the minimum 1"),
    ("demo chunks negative", ["demo", T, "--chunks", "-3"], None, "-3 is below the minimum 1"),
    ("demo chunks text", ["demo", T, "--chunks", "many"], None, "'many' is not an integer"),
    ("demo warmup negative", ["demo", T, "--warmup", "-1"], None, "-1 is below the minimum 0"),
    ("frames negative", ["trace-to-bag", "t.npz", "out", "--frames", "-1"], None,
     "argument --frames: -1 is below the minimum 1"),
    ("frames zero", ["trace-to-bag", "t.npz", "out", "--frames", "0"], None,
     "0 is below the minimum 1"),
    ("period negative", ["trace-to-bag", "t.npz", "out", "--period-s", "-0.5"], None,
     "argument --period-s: -0.5 is outside (0.0, 3600.0]"),
    ("period zero", ["trace-to-bag", "t.npz", "out", "--period-s", "0"], None,
     "0.0 is outside (0.0, 3600.0]"),
    ("unknown variant", ["demo", T, "--variant", "huge"], None,
     "argument --variant: invalid choice: 'huge'"),
    ("unknown command", ["fly"], None, "argument COMMAND: invalid choice: 'fly'"),
    ("unknown appbuilder", ["--appbuilder", "real", "parity", T], None,
     "argument --appbuilder: invalid choice: 'real'"),
    ("missing bundle path", ["demo", "{tmp}/nowhere"], None, "nowhere does not exist"),
    ("bundle path is a file", ["parity", "{made}"], _file, "a_file is a file"),
    ("empty folder", ["parity", "{made}"], _empty, "empty holds no bundle"),
    ("variant not below root", ["parity", "{made}", "--variant", "fused"],
     lambda tiny, tmp: _variant_copy(tiny, tmp).parent,
     "holds no fused bundle (no fused/ folder; it has grid_sampler)"),
    ("variant folder of another variant", ["conventions", T + "/grid_sampler", "--variant",
                                           "fused"], None,
     "holds variant 'grid_sampler', not 'fused'; give the fused folder"),
    ("no bundle.json, no --variant", ["conventions", "{made}"], _no_manifest,
     "has no bundle.json naming its variant; add --variant"),
    ("bundle.json not JSON", ["conventions", "{made}"], _manifest("{variant"),
     "bundle.json is not valid JSON"),
    ("bundle.json unknown variant", ["conventions", "{made}"], _manifest('{"variant": "big"}'),
     "bundle.json: variant is 'big'; allowed: 'grid_sampler', 'lp_vtp_sd', 'fused'"),
    ("export-host corrupt safetensors", ["export-host", "{made}", "{tmp}/b",
                                         "--variant", "grid_sampler"], _corrupt_shard,
     "m.safetensors is not a readable safetensors file"),
    ("export-host index not JSON", ["export-host", "{made}", "{tmp}/b", "--variant", "fused"],
     _index("{weight"), "model.safetensors.index.json is not a safetensors index"),
    ("export-host index without weight_map", ["export-host", "{made}", "{tmp}/b", "--variant",
                                              "fused"], _index('{"metadata": {}}'),
     "is not a safetensors index (needs a 'weight_map'"),
    ("export-host index names a missing shard", ["export-host", "{made}", "{tmp}/b",
                                                 "--variant", "fused"],
     _index('{"weight_map": {"a.wte.embedding": "gone.safetensors"}}'),
     "names ['gone.safetensors'] which"),
    ("export-host output is a file", ["export-host", "{made}", "{tmp}/a_file"],
     lambda tiny, tmp: (_file(tiny, tmp), _checkpoint(tiny, tmp))[1], "a_file is a file"),
    ("export-host no checkpoint", ["export-host", "{tmp}/ckpt", "{tmp}/b"], None,
     "checkpoint folder"),
    ("export-host no tokenizer", ["export-host", "{made}", "{tmp}/b"], _no_tokenizer,
     "has no tokenizer.json"),
    ("export-host no variant", ["export-host", "{made}", "{tmp}/b"], _checkpoint,
     "has no bundle.json naming its variant; add --variant"),
    ("tiny-bundle output is a file", ["tiny-bundle", "{made}"], _file,
     "output path"),
    ("replay negative flow steps", ["replay", "bag", "--bundle-root", T, "--instruction", "x",
                                    "--flow-steps", "-1"], None,
     "argument --flow-steps: -1 is below the minimum 0"),
    ("replay seed below -1", ["replay", "bag", "--bundle-root", T, "--seed", "-2"], None,
     "argument --seed: -2 is below the minimum -1"),
    ("bench steps huge", ["bench", "--steps", "1000000"], None,
     "argument --steps: 1000000 is above the maximum 100"),
    ("bench chunks huge", ["bench", "--chunks", "100000000"], None,
     "argument --chunks: 100000000 is above the maximum 100000"),
    ("closed-loop horizon huge", ["bench", "--closed-loop", "--horizons", "100000000"], None,
     "argument --horizons: 100000000 is above the maximum 1000"),
    ("closed-loop horizon float", ["bench", "--closed-loop", "--horizons", "1e8"], None,
     "argument --horizons: '1e8' is not an integer"),
    ("closed-loop seed negative", ["bench", "--closed-loop", "--seed", "-1"], None,
     "argument --seed: -1 is below the minimum 0"),
    ("tiny-bundle seed negative", ["tiny-bundle", "{tmp}/tb", "--seed", "-1"], None,
     "argument --seed: -1 is below the minimum 0"),
    ("demo chunks huge", ["demo", T, "--chunks", "10000000"], None,
     "argument --chunks: 10000000 is above the maximum 100000"),
    ("doctor repeats huge", ["doctor", T, "--repeats", "10000000"], None,
     "argument --repeats: 10000000 is above the maximum 1000"),
    ("bench json inside the bundle root", ["bench", "--closed-loop", "--bundle-root", T,
                                           "--json", T + "/grid_sampler/x.json"], None,
     "lies inside the input --bundle-root"),
    ("export-host output inside the checkpoint", ["export-host", "{made}", "{made}",
                                                  "--variant", "grid_sampler"], _checkpoint,
     "lies inside the input checkpoint"),
    ("replay negative max age", ["replay", "bag", "--bundle-root", T, "--instruction", "x",
                                 "--max-age", "-1"], None,
     "argument --max-age: -1.0 is outside"),
    ("replay --set unknown parameter", ["replay", "bag", "--bundle-root", T, "--instruction",
                                        "x", "--set", "speed=3"], None,
     "--set speed: no such parameter; did you mean seed?"),
    ("replay --set bad value", ["replay", "bag", "--bundle-root", T, "--instruction", "x",
                                "--set", "rate_hz=fast"], None,
     "--set rate_hz='fast': expected float"),
    ("conventions --write through a symlinked file", ["conventions", "{made}", "--write"],
     _linked_conventions, "conventions.json is a symlink (to "),
    ("conventions --write into a symlinked host folder", ["conventions", "{made}", "--write"],
     _linked_host, "host is a symlink (to "),
    ("replay missing bundle root", ["replay", "bag", "--bundle-root", "{tmp}/nowhere",
                                    "--instruction", "x"], None, "nowhere does not exist"),
]


@pytest.mark.parametrize("argv, maker, message", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_cli_input_is_one_line_and_exit_2(tiny_root, tmp_path, capsys, argv, maker,
                                              message):
    made = maker(tiny_root, tmp_path) if maker else None
    argv = [a.format(tiny=tiny_root, tmp=tmp_path, made=made) for a in argv]
    if argv[0] == "replay":
        pytest.importorskip("rosbags")
    assert main(argv) == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error")]
    # progress lines may come first; the refusal is one line, and the last
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    assert message in errors[0]
    assert "Traceback" not in out + err


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


def test_nothing_is_written_on_refused_export(tiny_root, tmp_path):
    ckpt = _corrupt_shard(tiny_root, tmp_path)
    assert main(["export-host", str(ckpt), str(tmp_path / "b"), "--variant", "fused"]) == 2
    assert list((tmp_path / "b" / "host").iterdir()) == []
    assert np.load(tiny_root / "fused" / "host" / "embeddings.npy").size  # source untouched


def _numeric_options():
    """Every option of every command whose value is a number: (command, option, type)."""
    import argparse

    from molmoact2_ros.cli.app import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.choices is not None or not action.option_strings:
                continue
            number = action.type in (int, float) or isinstance(action.default, (int, float)) \
                and not isinstance(action.default, bool) or hasattr(action.type, "range_text")
            if number:
                yield name, action.option_strings[-1], action


def test_every_numeric_option_has_a_documented_range():
    """One typed-range helper (cli/args.py) for every number: a range and (range: ...) in help."""
    from molmoact2_ros.cli.app import build_parser

    options = list(_numeric_options())
    assert len(options) >= 25
    unbounded = [f"{c} {o}" for c, o, a in options if not getattr(a.type, "range_text", "")]
    assert not unbounded, unbounded
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for command, option, _ in options:
        text = sub.choices[command].format_help()
        at = text.rindex("  " + option + " ")  # the option's entry, after the usage line
        entry = " ".join(text[at:].split("\n  -", 1)[0].split())
        assert "(range: " in entry, (command, option, entry)


def test_conventions_write_never_writes_outside_the_bundle(tiny_root, tmp_path):
    made = _linked_conventions(tiny_root, tmp_path)
    before = (tmp_path / "outside.json").read_bytes()
    assert main(["conventions", str(made), "--write"]) == 2
    assert (tmp_path / "outside.json").read_bytes() == before
    assert (made / "host" / "conventions.json").is_symlink()
    host = _linked_host(tiny_root, tmp_path / "h")
    assert main(["conventions", str(host), "--write"]) == 2
    assert not (tmp_path / "h" / "outside_host" / "conventions.json").exists()


@pytest.mark.parametrize("value", ["banana", "2", "of", "enable"])
def test_numba_switch_refuses_anything_but_on_off_words(value, tiny_root, monkeypatch, capsys):
    """Like MOLMOACT2_APPBUILDER: a typo is refused in one line, never silently 'on'."""
    from molmoact2_ros.host.jit import switched_off

    monkeypatch.setenv("MOLMOACT2_NUMBA", value)
    assert main(["conventions", str(tiny_root / "grid_sampler")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err
    assert f"MOLMOACT2_NUMBA={value!r}: use one of 1, on, true, yes" in err
    with pytest.raises(Exception, match="MOLMOACT2_NUMBA"):
        switched_off()


@pytest.mark.parametrize("value,off", [("", False), ("1", False), ("ON", False),
                                       (" yes ", False), ("true", False), ("0", True),
                                       ("Off", True), ("false", True), ("no", True)])
def test_numba_switch_accepts_the_usual_words(value, off, monkeypatch):
    from molmoact2_ros.host.jit import switched_off

    monkeypatch.setenv("MOLMOACT2_NUMBA", value)
    assert switched_off() is off


def test_numba_switch_typo_fails_configure(tiny_root, monkeypatch):
    from controller_fakes import Rig

    from molmoact2_ros.errors import MolmoActError

    monkeypatch.setenv("MOLMOACT2_NUMBA", "banana")
    rig = Rig(tiny_root)
    with pytest.raises(MolmoActError, match="MOLMOACT2_NUMBA='banana'"):
        rig.ctl.configure()
    assert rig.ctl.policy is None


@pytest.mark.parametrize("value", ["banana", "-1", "2.5", "5000"])
def test_thread_count_typo_is_refused_by_the_cli_and_at_configure(value, tiny_root, capsys,
                                                                  monkeypatch):
    """MOLMOACT2_THREADS (what a Ray actor sets to its CPUs) takes a thread count or nothing."""
    from controller_fakes import Rig

    from molmoact2_ros.errors import MolmoActError

    monkeypatch.setenv("MOLMOACT2_THREADS", value)
    assert main(["conventions", str(tiny_root / "grid_sampler")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err
    assert f"MOLMOACT2_THREADS={value!r}: give a whole number of threads" in err
    rig = Rig(tiny_root)
    with pytest.raises(MolmoActError, match="MOLMOACT2_THREADS"):
        rig.ctl.configure()
    assert rig.ctl.policy is None


def test_one_thread_preprocesses_both_cameras_on_the_calling_thread(monkeypatch):
    """MOLMOACT2_THREADS=1: no pool hand-off, and the same pixel values as side by side."""
    import threading

    import numpy as np

    from molmoact2_ros.host import images

    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(2)]
    both = images.preprocess(frames)
    seen = []
    original = images.resize_levels
    monkeypatch.setattr(images, "resize_levels", lambda *a, **k: (
        seen.append(threading.current_thread().name), original(*a, **k))[1])
    monkeypatch.setattr(images, "resize_normalise_into", lambda *a, **k: False)
    monkeypatch.setenv("MOLMOACT2_THREADS", "1")
    np.testing.assert_array_equal(images.preprocess(frames), both)
    assert seen == [threading.current_thread().name] * 2
