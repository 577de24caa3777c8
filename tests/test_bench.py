"""``molmoact2 bench`` runs every row side by side and prints verdicts (no timing asserts)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np

from molmoact2_ros.bench.host import REPLAY_MIN_CHUNKS
from molmoact2_ros.bench.runtime import floor_bytes
from molmoact2_ros.bundle.variants import VARIANTS
from molmoact2_ros.cli.app import main


def test_bench_prints_every_row_and_a_verdict_per_target(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    code = main(["bench", "--variants", "lp_vtp_sd", "--chunks", "3", "--naive-chunks", "1",
                 "--json", str(out_json)])
    assert code == 0
    captured = capsys.readouterr()
    out = captured.out
    steps = [line.split(" (")[0] for line in captured.err.splitlines()
             if line.startswith("bench [")]  # stderr is a pipe here: one line per step
    assert steps == ["bench [1/6] preprocess", "bench [2/6] controller", "bench [3/6] replay",
                     "bench [4/6] node", "bench [5/6] rss", "bench [6/6] runtime lp_vtp_sd"]
    last = out.splitlines()[-1]
    assert last.startswith("bench: ") and " targets met, " in last
    assert last.endswith(f"; wrote {out_json}") and "variants lp_vtp_sd" in last
    assert "(a) resident shm total" in out and "(b) naive pipes total" in out
    assert "(b)/(a) overhead ratio" in out and "RSS (a)" in out and "floor plain copy" in out
    assert "== verdicts" in out and "controller overhead" in out
    payload = json.loads(out_json.read_text())
    record = payload["variants"][0]
    assert record["variant"] == "lp_vtp_sd" and record["ratio"] > 0 and record["floor_ratio"] > 0
    assert "embed" in record["host"] and record["resident"]["total"]["n"] == 3
    host = payload["host"]
    assert host["preprocess 256x256"]["n"] == 3 and host["preprocess 640x480"]["n"] == 3
    assert host["controller overhead"]["n"] == 3
    assert host["replay"]["chunks"] == REPLAY_MIN_CHUNKS and not host["replay"]["drops"]
    kernel = host["preprocess 256x256"]["kernel"]
    assert kernel in ("numba", "numpy")
    if kernel == "numba":  # the two designs side by side, and the same bits from both
        assert host["numpy path 256x256"]["same_values"] is True
        assert host["numpy path 640x480"]["same_values"] is True
    assert host["node process RSS"]["published"] == 3
    assert host["node process RSS"]["kernel"] == kernel
    if kernel == "numba":  # the RSS of the same process pinned to the numpy path, beside it
        assert host["node process RSS, numpy path"]["kernel"] == "numpy"
    if importlib.util.find_spec("rclpy") is None:
        assert host["node"] == {"skipped": "rclpy not available"}
        assert "skipped: rclpy not available" in out
    elif importlib.util.find_spec("molmoact2_ros.msg") is not None:
        # under ROS 2 with the package built (tests/test_node_bench_rclpy.py looks closer)
        assert host["node"].get("received") == 3, host["node"]
        assert "rclpy node overhead" in out and "rclpy floor" in out
    targets = [v["target"] for v in payload["verdicts"]]
    assert len(targets) == len(set(targets)) == 11  # 4 preprocess, 3 per variant, 4 more
    assert all(v["verdict"] in ("meets", "misses", "skipped") for v in payload["verdicts"])


def test_floor_counts_library_copies_and_arena_copies_of_shared_outputs():
    v = VARIANTS["lp_vtp_sd"]
    one, three = floor_bytes(v, 1), floor_bytes(v, 3)
    # hidden state in and out of every split: [1, S, H] fp16, S = 130, H = 2560
    hidden = 130 * 2560 * 2
    kv = 2 * 36 * 130 * 1024 * 2  # keys + values of all layers
    ctx = 2 * 36 * 130 * 8 * 96 * 2  # k_ctx + v_ctx
    embeds = 32 * 2560 * 2
    assert one["total"] == one["inputs"] + one["outputs"] + one["arena"]
    assert one["inputs"] >= kv + 4 * hidden + int(np.prod((1, 2, 729, 588))) * 2
    assert one["outputs"] >= embeds + 4 * hidden + kv + ctx
    # into the arena: what another process reads; not k_ctx/v_ctx (read in the action worker),
    # not the last split's hidden_out (read by nobody), not action_step's output
    assert one["arena"] == embeds + 3 * hidden + kv
    # two more Euler steps add two more action_step calls' library copies, nothing to the arena
    assert three["arena"] == one["arena"]
    assert three["inputs"] - one["inputs"] == 2 * (ctx + (10 * 32 + 1 + 130 + 32) * 2)
    assert three["outputs"] - one["outputs"] == 2 * 10 * 32 * 2
