"""Conventions read off the golden files agree with conventions.json, and disagreements show."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.bundle.conventions import Conventions
from molmoact2_ros.cli.app import main as cli_main
from molmoact2_ros.cli.conventions import (
    MATCH,
    MISMATCH,
    UNKNOWN,
    check_conventions,
    infer_from_bias,
)


def test_bias_reading_hand_worked():
    m = -1e4
    # 4 valid tokens (1 and 2 are image tokens attending to each other), 2 left pads
    allowed = np.zeros((6, 6), bool)
    for q in range(2, 6):
        allowed[q, 2 : q + 1] = True
    allowed[3, 4] = allowed[4, 3] = True
    info = infer_from_bias(np.where(allowed, 0.0, m)[None, None])
    assert info["mask_value"] == m and info["padding_side"] == "left"
    assert info["bidirectional"] and info["bidirectional_pairs"] == 1
    causal = np.where(np.tril(np.ones((3, 3), bool)), 0.0, m)
    info = infer_from_bias(causal)
    assert info["padding_side"] is None and not info["bidirectional"]


def test_tiny_bundles_match_their_conventions(tiny_root, variant_name):
    findings = check_conventions(Bundle.open(tiny_root / variant_name))
    # a velocity graph bakes no step count: that one choice stays open
    velocity = not Bundle.open(tiny_root / variant_name).conventions().euler_in_graph
    assert [f.verdict for f in findings] == [MATCH] * 6 + [UNKNOWN if velocity else MATCH], \
        findings


@pytest.mark.parametrize("key, value", [("padding_side", "left"), ("mask_value", -1e4),
                                        ("bidirectional_image_attention", False),
                                        ("encoder_mask", "padding_only"),
                                        ("image_embeds_include_patch_embedding", True)])
def test_a_wrong_conventions_file_is_caught(tiny_root, tmp_path, capsys, key, value):
    root = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", root,
                    ignore=shutil.ignore_patterns("ctx", "onnx"))
    path = root / "host" / "conventions.json"
    conv = json.loads(path.read_text())
    conv[key] = value
    path.write_text(json.dumps(conv))
    verdicts = {f.name: f.verdict for f in check_conventions(Bundle.open(root))}
    assert verdicts[key] == MISMATCH
    assert sum(v == MISMATCH for v in verdicts.values()) == 1
    assert cli_main(["conventions", str(root)]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_conventions_write_repairs_a_wrong_file_and_shows_the_diff(tiny_root, tmp_path, capsys):
    root = tmp_path / "lp_vtp_sd"
    shutil.copytree(tiny_root / "lp_vtp_sd", root, ignore=shutil.ignore_patterns("ctx", "onnx"))
    path = root / "host" / "conventions.json"
    good = Conventions.from_json(path)
    wrong = replace(good, padding_side="right", mask_value=-30000.0, encoder_mask="exclude_eos",
                    image_embeds_include_patch_embedding=False)
    path.write_text(wrong.to_json())
    assert cli_main(["conventions", str(root)]) == 1
    assert "repair with: molmoact2 conventions --write" in capsys.readouterr().out
    assert cli_main(["conventions", str(root), "--write"]) == 0
    out = capsys.readouterr().out
    assert '-  encoder_mask: "exclude_eos"' in out and '+  encoder_mask: "padding_only"' in out
    assert "-  mask_value: -30000.0" in out and "+  mask_value: -10000.0" in out
    assert out.strip().splitlines()[-1] == ("conventions: lp_vtp_sd: every convention the "
                                            "goldens show matches; wrote 1 conventions.json")
    assert Conventions.from_json(path) == good
    assert cli_main(["conventions", str(root)]) == 0


def test_conventions_write_creates_a_missing_file(tiny_root, tmp_path):
    root = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", root, ignore=shutil.ignore_patterns("ctx", "onnx"))
    path = root / "host" / "conventions.json"
    good = Conventions.from_json(path)
    path.unlink()
    assert cli_main(["conventions", str(root)]) == 2  # missing file: bad input, named
    assert cli_main(["conventions", str(root), "--write"]) == 0
    assert Conventions.from_json(path) == good
