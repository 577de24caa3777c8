"""Bad input to ``replay`` and ``trace-to-bag``: one line on stderr naming the problem, exit
status 2, no traceback, nothing written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags")
from replay_helpers import obs_bag, run_cli, trace  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")

INSTRUCTION = "put the bowl on the plate"


def _raw(tmp, tr):
    return obs_bag(tmp / "obs", tr, 1)


def _truncated(tmp, tr, mcap):
    bag = obs_bag(tmp / "obs", tr, 2, mcap=mcap)
    data = next(bag.glob("*.mcap" if mcap else "*.db3"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return bag


def _write(tmp, topics):
    """A bag with the given (topic, type, message or None) rows."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    from molmoact2_ros.replay.replay import typestore

    store = typestore()
    out = tmp / "obs"
    with Writer(out, version=8, storage_plugin=StoragePlugin.SQLITE3) as w:
        for topic, kind, make in topics:
            conn = w.add_connection(topic, kind, typestore=store)
            if make is not None:
                w.write(conn, 10**9, store.serialize_cdr(make(store.types[kind]), kind))
    return out


def _without_joint_states(tmp, tr):
    return _write(tmp, [("/camera/agentview/image", "sensor_msgs/msg/Image", None),
                        ("/camera/wrist/image", "sensor_msgs/msg/Image", None)])


def _wrong_type(tmp, tr):
    """joint_states recorded as std_msgs/String."""
    return _write(tmp, [("/camera/agentview/image", "sensor_msgs/msg/Image", None),
                        ("/camera/wrist/image", "sensor_msgs/msg/Image", None),
                        ("/joint_states", "std_msgs/msg/String",
                         lambda t: t(data="not a joint state"))])


def _golden_settings_list(tmp, tr):
    """A chunk bag whose settings message is a JSON list, not an object."""
    from molmoact2_ros.replay.chunkbag import ChunkBagWriter

    writer = ChunkBagWriter(tmp / "listgolden", ["variant", "lp_vtp_sd"])
    writer.close()
    return _raw(tmp, tr)


def _empty_bag(tmp, tr):
    from rosbags.rosbag2 import StoragePlugin, Writer

    from molmoact2_ros.replay.replay import typestore

    store = typestore()
    out = tmp / "obs"
    with Writer(out, version=8, storage_plugin=StoragePlugin.MCAP) as w:
        for topic, kind in (("/camera/agentview/image", "sensor_msgs/msg/Image"),
                            ("/camera/wrist/image", "sensor_msgs/msg/Image"),
                            ("/joint_states", "sensor_msgs/msg/JointState")):
            w.add_connection(topic, kind, typestore=store)
    return out


def _text_file(tmp, tr):
    path = tmp / "obs.mcap"
    path.write_text("this is not a bag\n")
    return path


def _empty_dir(tmp, tr):
    (tmp / "obs").mkdir()
    return tmp / "obs"


# (case id, bag maker, extra arguments (with {tmp}/{root}), stderr pattern)
REPLAY_CASES = [
    ("missing-path", lambda t, tr: t / "nope", [], r"bag .*nope does not exist"),
    ("not-a-bag-file", _text_file, [], r"bag .*obs\.mcap cannot be read as a rosbag2"),
    ("empty-folder", _empty_dir, [], r"is a folder without metadata\.yaml, not a rosbag2"),
    ("truncated-sqlite3", lambda t, tr: _truncated(t, tr, False), [],
     r"bag .*obs (cannot be read as a rosbag2|is truncated or corrupt)"),
    ("truncated-mcap", lambda t, tr: _truncated(t, tr, True), [],
     r"bag .*obs (cannot be read as a rosbag2|is truncated or corrupt)"),
    ("missing-topic", _without_joint_states, [],
     r"has no topic /joint_states; it has /camera/agentview/image \[sensor_msgs/msg/Image\]"),
    ("compressed-topics-absent", _raw, ["--set", "compressed_images=true"],
     r"has no topic /camera/agentview/image/compressed, /camera/wrist/image/compressed"),
    ("unexpected-type", _wrong_type, [],
     r"topic /joint_states holds std_msgs/msg/String, expected sensor_msgs/msg/JointState"),
    ("empty-bag", _empty_bag, [], r"holds no message on /camera/agentview/image"),
    ("unknown-set-key", _raw, ["--set", "sync.slop=0.1"],
     r"--set sync\.slop: no such parameter; did you mean sync\.slop_s\?"),
    ("set-wrong-type", _raw, ["--set", "sync.queue_size=many"],
     r"--set sync\.queue_size='many': expected int"),
    ("set-bool-not-bool", _raw, ["--set", "compressed_images=maybe"],
     r"--set compressed_images='maybe': expected true/false"),
    ("set-without-value", _raw, ["--set", "sync.slop_s"], r"write NAME=VALUE"),
    ("set-out-of-range", _raw, ["--set", "sync.slop_s=-1"], r"sync\.slop_s=-1\.0 is out of range"),
    ("empty-instruction", _raw, ["--instruction", "  "], r"no instruction: pass --instruction"),
    ("no-instruction", _raw, ["--instruction", None], r"no instruction: pass --instruction"),
    ("instruction-too-long", _raw, ["--instruction", " ".join([INSTRUCTION] * 40),
                                    "--record", "{tmp}/newgolden"],
     r"is \d+ tokens but variant lp_vtp_sd leaves \d+ for the task \(S=130, .*shorten it"),
    ("missing-bundle-root", _raw, ["--bundle-root", "{tmp}/nobundles"],
     r"bundle path .*nobundles does not exist"),
    ("record-exists", _raw, ["--record", "{tmp}/existing"],
     r"--record bag .*existing exists already; choose a new path or pass --force"),
    ("force-on-non-bag-folder", _raw, ["--record", "{tmp}/workspace", "--force"],
     r"workspace is not replaced, even with --force: it is a folder this package did not "
     r"record .*holds notes\.txt"),
    ("record-folder-missing", _raw, ["--record", "{tmp}/no/such/golden"],
     r"folder .*no/such does not exist"),
    ("golden-missing", _raw, ["--golden", "{tmp}/nogolden"],
     r"golden bag .*nogolden does not exist"),
    ("golden-not-a-chunk-bag", _raw, ["--golden", "{tmp}/obs"],
     r"golden bag .*obs holds no molmoact2_ros/msg/ActionChunk topic; it has /camera"),
    ("golden-settings-list", _golden_settings_list, ["--golden", "{tmp}/listgolden"],
     r"golden bag .*listgolden: /molmoact2_replay/settings holds a JSON list; the settings "
     r"must be an object"),
    ("golden-npz-corrupt", _raw, ["--golden", "{tmp}/bad.npz"],
     r"bad\.npz is not a readable \.npz"),
    ("report-is-a-file", _raw, ["--report", "{tmp}/existing"], r"--report .*existing is a file"),
    # outputs never replace inputs, --force or not (the recording stays as it was)
    ("record-is-the-bag", _raw, ["--record", "{tmp}/obs", "--force"],
     r"--record bag .*obs is the input bag .*obs; write outputs to a new path"),
    ("record-contains-the-bag", _raw, ["--record", "{tmp}", "--force"],
     r"--record bag .* contains the input bag .*obs"),
    ("report-inside-the-bag", _raw, ["--report", "{tmp}/obs/report", "--force"],
     r"--report .*obs/report lies inside the input bag"),
    ("record-dir-holds-the-bag", _raw, ["--record-dir", "{tmp}", "--force"],
     r"--record-dir .* contains the input bag .*obs"),
    ("record-is-the-golden", _raw, ["--golden", "{tmp}/golden.npz", "--record",
                                    "{tmp}/golden.npz", "--force"],
     r"--record bag .*golden\.npz is the input --golden"),
]


@pytest.fixture
def scene(tmp_path):
    (tmp_path / "existing").write_text("keep me\n")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "notes.txt").write_text("keep me\n")
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 truncated")
    (tmp_path / "golden.npz").write_bytes(b"PK\x03\x04 a golden trace")
    return tmp_path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(folder.rglob("*"))}


def _expect_one_line_error(rc, out, err, pattern):
    assert rc == 2, out + err
    assert "Traceback" not in err + out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize("case", REPLAY_CASES, ids=[c[0] for c in REPLAY_CASES])
def test_replay_bad_input(case, scene, tiny_root, capsys):
    _, make, extra, pattern = case
    tr = trace(tiny_root, "lp_vtp_sd")
    bag = make(scene, tr)
    args = {"--bundle-root": str(tiny_root), "--instruction": INSTRUCTION}
    rest: list[str] = []
    it = iter(extra)
    for flag in it:
        value = next(it) if flag not in ("--force",) else None
        if flag in args:
            args[flag] = value if value is None else value.format(tmp=scene)
        elif value is None:
            rest.append(flag)
        else:
            rest += [flag, value.format(tmp=scene)]
    argv = ["replay", str(bag), "--variant", "lp_vtp_sd", "--no-progress"]
    for flag, value in args.items():
        if value is not None:
            argv += [flag, value]
    before = _snapshot(scene)
    rc, out, err = run_cli(argv + rest, capsys)
    _expect_one_line_error(rc, out, err, pattern)
    assert _snapshot(scene) == before  # nothing written, nothing removed


def _trace_without_images(tmp):
    path = tmp / "partial.npz"
    np.savez(path, state=np.zeros(8, np.float32))
    return path


TRACE_CASES = [
    ("trace-missing", lambda t, root: t / "none.npz", "{tmp}/out", [],
     r"golden file .*none\.npz is missing"),
    ("trace-lacks-images", lambda t, root: _trace_without_images(t), "{tmp}/out", [],
     r"partial\.npz lacks \['image_primary', 'image_wrist'\] needed for trace-to-bag"),
    ("trace-not-npz", lambda t, root: t / "existing", "{tmp}/out", [],
     r"existing holds object arrays or is corrupt"),
    ("out-exists", lambda t, root: root / "grid_sampler/golden/e2e_trace.npz", "{tmp}/existing",
     [], r"output bag .*existing exists already; choose a new path or pass --force"),
    ("zero-frames", lambda t, root: root / "grid_sampler/golden/e2e_trace.npz", "{tmp}/out",
     ["--frames", "0"], r"argument --frames: 0 is below the minimum 1"),
    ("bad-period", lambda t, root: root / "grid_sampler/golden/e2e_trace.npz", "{tmp}/out",
     ["--period-s", "0"], r"argument --period-s: 0\.0 is outside \(0\.0, 3600\.0\]"),
    ("out-is-the-trace", lambda t, root: t / "golden.npz", "{tmp}/golden.npz", ["--force"],
     r"output bag .*golden\.npz is the input trace"),
    ("too-many-frames", lambda t, root: root / "grid_sampler/golden/e2e_trace.npz", "{tmp}/out",
     ["--frames", "100000000"], r"argument --frames: 100000000 is above the maximum 100000"),
]


@pytest.mark.parametrize("case", TRACE_CASES, ids=[c[0] for c in TRACE_CASES])
def test_trace_to_bag_bad_input(case, scene, tiny_root, capsys):
    _, make, out_path, extra, pattern = case
    src = make(scene, tiny_root)
    before = _snapshot(scene)
    rc, out, err = run_cli(["trace-to-bag", str(src), out_path.format(tmp=scene), *extra],
                           capsys)
    _expect_one_line_error(rc, out, err, pattern)
    assert _snapshot(scene) == before


def test_force_overwrites_an_old_bag(scene, tiny_root, capsys):
    src = tiny_root / "grid_sampler/golden/e2e_trace.npz"
    out = scene / "bag"
    assert run_cli(["trace-to-bag", src, out, "--frames", "1"], capsys)[0] == 0
    assert run_cli(["trace-to-bag", src, out, "--frames", "2"], capsys)[0] == 2
    rc, text, _ = run_cli(["trace-to-bag", src, out, "--frames", "2", "--force"], capsys)
    assert rc == 0 and "wrote 2 observations" in text
    assert "message_count: 6" in (out / "metadata.yaml").read_text()
