"""SIGINT and SIGTERM during replay: the run stops after the current message, the output bag
is closed (readable, with the chunks so far) and the exit status says which signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("rosbags")
from replay_helpers import obs_bag, trace  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_closes_the_output_bag(tiny_root, tmp_path, sig, status):
    from molmoact2_ros.replay.chunkbag import read_chunk_bag

    tr = trace(tiny_root, "grid_sampler")
    bag = obs_bag(tmp_path / "obs", tr, 60)
    golden = tmp_path / "golden"
    proc = subprocess.Popen(
        [sys.executable, "-m", "molmoact2_ros.cli", "replay", str(bag), "--bundle-root",
         str(tiny_root), "--instruction", str(tr["instruction"]), "--record", str(golden),
         "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not golden.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert golden.exists(), "the run never opened its output bag"
        time.sleep(1.0)  # a few chunks
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == status, out + err
    assert "Traceback" not in err and f"interrupted by signal {int(sig)}" in err
    written = read_chunk_bag(golden)  # readable: metadata written, storage closed
    assert 1 <= len(written.chunks) < 60
    assert f"chunk bag: {golden} ({len(written.chunks)} chunks)" in out
