"""norm_stats.json rules that no parity check can see: LeRobot's mask rule, the mode, the HF
normaliser's min == max → 0, and the provenance every report and the node name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from molmoact2_ros.bundle.normstats import NormStats
from molmoact2_ros.errors import BundleError


@pytest.fixture
def write(tiny_root, tmp_path):
    return lambda edit: _write(tiny_root, tmp_path, edit)


def _write(tiny_root, tmp_path, edit):
    src = json.loads((tiny_root / "grid_sampler" / "norm_stats.json").read_text())
    edit(src, src["metadata_by_tag"]["libero"])
    path = tmp_path / "norm_stats.json"
    path.write_text(json.dumps(src))
    return path


def test_without_a_mask_names_containing_gripper_pass_through_raw(write, tmp_path):
    def edit(top, meta):
        del meta["state_stats"]["mask"]
        meta["state_stats"]["names"] = ["x", "y", "z", "rx", "ry", "rz", "Gripper_L",
                                        "right_gripper"]
    stats = NormStats.from_json(write(edit))
    assert stats.state.mask.tolist() == [True] * 6 + [False, False]
    assert stats.state.mask_source == "names"
    raw = np.array([0.0, 0.0, 0.5, 3.0, 0.0, 0.0, 0.03, -0.03], np.float32)
    out = stats.state.normalize(raw)
    assert out[6] == np.float32(0.03) and out[7] == np.float32(-0.03)
    assert "raw: Gripper_L, right_gripper (from the names" in stats.describe()


def test_min_equal_max_maps_to_zero_as_the_hf_normaliser(write, tmp_path):
    def edit(top, meta):
        s = meta["state_stats"]
        s["min"][2] = s["max"][2] = 0.9
    stats = NormStats.from_json(write(edit))
    raw = np.array([0.0, 0.0, 0.5, 3.0, 0.0, 0.0, 0.03, -0.03], np.float32)
    out = stats.state.normalize(raw)
    # the HF formula by hand: 2 (x - q01) / max(q99 - q01, 1e-6) - 1, clipped; 0 where min == max
    s = json.loads(write(edit).read_text())["metadata_by_tag"]["libero"]["state_stats"]
    q01, q99 = np.array(s["q01"]), np.array(s["q99"])
    want = np.clip(2 * (raw - q01) / np.maximum(q99 - q01, 1e-6) - 1, -1, 1)
    assert out[2] == 0.0 and abs(want[2]) > 0.1
    assert np.allclose(out[:6][[0, 1, 3, 4, 5]], want[[0, 1, 3, 4, 5]], atol=1e-6)


def test_min_max_mode_reads_min_and_max(write, tmp_path):
    def edit(top, meta):
        top["norm_mode"] = "min_max"
        top["source"] = "a LeRobot processor, named by hand"
    stats = NormStats.from_json(write(edit))
    s = json.loads((tmp_path / "norm_stats.json").read_text())["metadata_by_tag"]["libero"]
    lo = np.array(s["action_stats"]["min"], np.float32)
    hi = np.array(s["action_stats"]["max"], np.float32)
    assert np.allclose(stats.action.denormalize(-np.ones(7))[:6], lo[:6])
    assert np.allclose(stats.action.denormalize(np.ones(7))[:6], hi[:6])
    assert "from a LeRobot processor, named by hand; mode min_max" in stats.describe()


def test_a_file_without_a_mode_is_refused_naming_the_field(write, tmp_path):
    with pytest.raises(BundleError, match="norm_mode is missing.*min_max.*q01_q99"):
        NormStats.from_json(write(lambda top, meta: top.pop("norm_mode")))
