"""``molmoact2 bench`` runs both designs side by side and reports a ratio (no timing asserts)."""

from __future__ import annotations

import json

from molmoact2_ros.cli import main


def test_bench_prints_both_designs_and_a_ratio(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    code = main(["bench", "--variants", "lp_vtp_sd", "--chunks", "3", "--naive-chunks", "1",
                 "--json", str(out_json)])
    assert code == 0
    out = capsys.readouterr().out
    assert "(a) resident shm total" in out and "(b) naive pipes total" in out
    assert "(b)/(a) overhead ratio" in out and "RSS (a)" in out
    record = json.loads(out_json.read_text())["variants"][0]
    assert record["variant"] == "lp_vtp_sd" and record["ratio"] > 0
    assert {"preprocess", "embed"} <= set(record["host"])
    assert record["resident"]["total"]["n"] == 3
