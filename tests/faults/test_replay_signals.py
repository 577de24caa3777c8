"""SIGINT and SIGTERM during replay: the run stops after the current message, the output bag
is closed (readable, with the chunks so far) and the exit status says which signal."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytest.importorskip("rosbags")
from replay_helpers import obs_bag, trace  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")


#: Long enough that no run can finish before its signal, even on a machine at load 30.
FRAMES = 400


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_closes_the_output_bag(tiny_root, tmp_path, sig, status):
    """The signal goes in once the run says its first chunk is written (not after a sleep),
    so the assertion measures a run interrupted mid-way, loaded machine or not."""
    from molmoact2_ros.replay.chunkbag import read_chunk_bag

    tr = trace(tiny_root, "grid_sampler")
    bag = obs_bag(tmp_path / "obs", tr, FRAMES, compressed="jpeg", mcap=True)
    golden = tmp_path / "golden"
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "molmoact2_ros.cli", "replay", str(bag), "--bundle-root",
             str(tiny_root), "--instruction", str(tr["instruction"]), "--record", str(golden),
             "--set", "compressed_images=true", "--no-progress"],
            stdout=subprocess.PIPE, stderr=err_file, text=True)
        try:
            seen = []
            for line in proc.stdout:  # ends at EOF if the run exits without a first chunk
                seen.append(line)
                if "first chunk written" in line:
                    break
            assert seen and "first chunk written" in seen[-1], "".join(seen)
            proc.send_signal(sig)
            rest, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out, err = "".join(seen) + rest, err_path.read_text()
    assert proc.returncode == status, out + err
    assert "Traceback" not in err and f"interrupted by signal {int(sig)}" in err
    written = read_chunk_bag(golden)  # readable: metadata written, storage closed
    assert 1 <= len(written.chunks) < FRAMES
    assert f"chunk bag: {golden} ({len(written.chunks)} chunks)" in out
