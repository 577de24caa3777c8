"""Bad bundles and bad observations: typed errors naming the thing and the fix."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from molmoact2_ros.bundle.bundle import Bundle, Suffixes
from molmoact2_ros.bundle.golden import load_npz
from molmoact2_ros.errors import BundleError, ObservationError, PromptError
from molmoact2_ros.policy import Observation, Policy
from molmoact2_ros.runtime import open_sessions


@pytest.fixture(scope="module")
def grid(tiny_root):
    with Policy.load(tiny_root / "grid_sampler", seed=0) as policy:
        yield policy


@pytest.fixture
def obs(tiny_root):
    t = load_npz(tiny_root / "grid_sampler" / "golden" / "e2e_trace.npz")
    return Observation(images=(t["image_primary"], t["image_wrist"]), state=t["state"],
                       instruction=str(t["instruction"]))


def _copy(tiny_root, tmp_path, variant="grid_sampler"):
    dst = tmp_path / variant
    shutil.copytree(tiny_root / variant, dst, ignore=shutil.ignore_patterns("ctx"))
    return dst


def test_unknown_variant_and_wrong_folder(tiny_root):
    with pytest.raises(Exception, match="choose one of: grid_sampler"):
        Bundle.open(tiny_root / "grid_sampler", "grid")
    with pytest.raises(BundleError, match="holds variant 'grid_sampler', not 'fused'"):
        Bundle.open(tiny_root / "grid_sampler", "fused")
    with pytest.raises(BundleError, match="does not exist"):
        Bundle.open(tiny_root / "nope")


def test_missing_and_truncated_files_listed_together(tiny_root, tmp_path):
    root = _copy(tiny_root, tmp_path)
    (root / "host" / "tokenizer.json").unlink()
    (root / "onnx" / "llm_split1" / "model.onnx").write_bytes(b"")
    with pytest.raises(BundleError) as err:
        Bundle.open(root).check("onnx")
    msg = str(err.value)
    assert "tokenizer.json is missing" in msg and "llm_split1/model.onnx is empty" in msg
    with pytest.raises(BundleError, match="ctx/vision_socid77_archv73.bin is missing"):
        Bundle.open(root).check("htp")


def test_truncated_graph_is_refused_at_load(tiny_root, tmp_path):
    root = _copy(tiny_root, tmp_path)
    graph = root / "onnx" / "action_step" / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:1000])
    with pytest.raises(BundleError, match="action_step: cannot load .*truncated"):
        open_sessions(Bundle.open(root))


def test_missing_quantised_onnx_says_use_htp(tiny_root):
    with pytest.raises(BundleError, match="quantised sets ship as HTP contexts only"):
        Bundle.open(tiny_root / "grid_sampler").onnx_path("llm_split0", "_w4a16")


def test_bad_suffix_values():
    with pytest.raises(BundleError, match="not a suffix like '_w4a16'"):
        Suffixes.from_mapping({"llm": "../etc"})
    with pytest.raises(BundleError, match="unknown context_suffix groups"):
        Suffixes.from_mapping({"language": "_w4a16"})


def test_norm_stats_of_wrong_width(tiny_root, tmp_path):
    root = _copy(tiny_root, tmp_path)
    path = root / "norm_stats.json"
    data = json.loads(path.read_text())
    data["metadata_by_tag"]["libero"]["action_stats"]["q01"] = [0.0] * 6
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match="action_stats.q01 has 6 values but this policy needs 7"):
        Bundle.open(root).norm_stats()


def test_truncated_embedding_table(tiny_root, tmp_path):
    root = _copy(tiny_root, tmp_path)
    table = root / "host" / "embeddings.npy"
    table.write_bytes(table.read_bytes()[:2000])
    with pytest.raises(BundleError, match="embeddings.npy is truncated"):
        Policy.load(root)


def test_instruction_errors(grid):
    with pytest.raises(PromptError, match="instruction is empty"):
        grid.set_instruction("   ")
    long = "pick up the black bowl between the plate and the ramekin and place it on the plate"
    with pytest.raises(PromptError, match=r"is \d+ tokens but variant grid_sampler leaves \d+ "
                                          r"for the task \(S=128, \d+ fixed\): shorten it by "
                                          r"at least \d+ tokens"):
        grid.set_instruction(long + " and then " + long)
    assert grid.instruction is None or grid.instruction != long


def test_observation_errors_leave_the_policy_usable(grid, obs):
    bad_state = Observation(images=obs.images, state=np.r_[obs.state[:7], np.nan],
                            instruction=obs.instruction)
    with pytest.raises(ObservationError, match=r"NaN/inf at index \[7\]"):
        grid.predict(bad_state)
    with pytest.raises(ObservationError, match="has 7 values but the policy needs 8"):
        grid.predict(Observation(images=obs.images, state=obs.state[:7],
                                 instruction=obs.instruction))
    with pytest.raises(ObservationError, match="got 1 images"):
        grid.predict(Observation(images=obs.images[:1], state=obs.state,
                                 instruction=obs.instruction))
    with pytest.raises(ObservationError):
        grid.predict(Observation(images=(obs.images[0][..., 0], obs.images[1]),
                                 state=obs.state, instruction=obs.instruction))
    chunk = grid.predict(obs)
    assert chunk.actions.shape == (10, 7) and np.all(np.isfinite(chunk.actions))
    assert chunk.variant == "grid_sampler" and chunk.flow_steps == 10
    assert {"vision", "llm_split0", "action_step", "preprocess", "total"} <= set(chunk.latency_ms)


def test_seeded_noise_is_reproducible_per_observation_stamp(tiny_root, obs):
    """With a seed the noise depends on (seed, stamp) only, not on the chunks before."""
    from dataclasses import replace

    later = replace(obs, stamp_ns=obs.stamp_ns + 1)
    with Policy.load(tiny_root / "lp_vtp_sd", seed=5) as p:
        a = p.predict(obs).actions
        b = p.predict(later).actions
        c = p.predict(obs).actions
        p.reseed(6)
        d = p.predict(obs).actions
        p.reseed(None)
        e, f = p.predict(obs).actions, p.predict(obs).actions
    assert np.array_equal(a, c) and not np.allclose(a, b) and not np.allclose(a, d)
    assert not np.allclose(e, f)  # no seed: fresh noise every chunk
