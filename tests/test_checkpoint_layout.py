"""export-host reads a checkpoint laid out as the released one (tokenizer_config.json,
processor_config.json, config.json); a golden masked with finfo(float32).min reads as masked;
the golden decoder reads the exporter's prompt back from the goldens."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.bundle.checkpoint import read_settings, robot_template
from molmoact2_ros.bundle.conventions import Conventions
from molmoact2_ros.cli.app import main as cli_main
from molmoact2_ros.errors import BundleError
from molmoact2_ros.host.prompt import Tokenizer
from molmoact2_ros.host.prompt_decode import decode_golden_prompt

safetensors_numpy = pytest.importorskip("safetensors.numpy")

PROCESSOR = {"image_use_col_tokens": True, "use_single_crop_col_tokens": False,
             "use_single_crop_start_token": True,
             "image_processor": {"crop_mode": "resize", "resample": 2,
                                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                                 "size": {"height": 378, "width": 378}, "patch_size": 14,
                                 "pooling_size": [2, 2]}}


def released_checkpoint(tiny_root, tmp_path, variant="grid_sampler", *, action_mode="both",
                        bos=None, processor=None):
    """The tiny bundle's weights and tokenizer in the released folder layout."""
    host = tiny_root / variant / "host"
    table = np.load(host / "embeddings.npy").astype(np.float32)
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    shutil.copy(host / "tokenizer.json", ckpt)
    shutil.copy(tiny_root / variant / "norm_stats.json", ckpt)
    safetensors_numpy.save_file({"model.transformer.wte.embedding": table[:-128],
                                 "model.transformer.wte.new_embedding": table[-128:]},
                                str(ckpt / "model.safetensors"))
    eos_id = Tokenizer(host / "tokenizer.json").token_id("<|im_end|>")
    (ckpt / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": bos, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    (ckpt / "config.json").write_text(json.dumps(
        {"action_mode": action_mode, "eos_token_id": eos_id, "add_setup_tokens": True,
         "add_control_tokens": True, "mask_action_dim_padding": True}))
    (ckpt / "processor_config.json").write_text(json.dumps(processor or PROCESSOR))
    return ckpt


def bundle_copy(tiny_root, tmp_path, variant, *, goldens=True):
    ignore = ["ctx", "host"] + ([] if goldens else ["golden"])
    bundle = tmp_path / variant
    shutil.copytree(tiny_root / variant, bundle, ignore=shutil.ignore_patterns(*ignore))
    return bundle


def test_prompt_tokens_come_from_tokenizer_config(tiny_root, tmp_path, capsys):
    """BOS is bos_token or eos_token, as the model's processor takes it; no hand edit."""
    ckpt = released_checkpoint(tiny_root, tmp_path)
    bundle = bundle_copy(tiny_root, tmp_path, "grid_sampler")
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 0
    prompt = json.loads((bundle / "host" / "prompt.json").read_text())
    assert (prompt["bos_token"], prompt["eos_token"], prompt["pad_token"]) == (
        "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert prompt["template"] == robot_template()
    assert "defaults still to verify: flip_images_180\n" in \
        capsys.readouterr().out
    assert cli_main(["conventions", str(bundle)]) == 0
    assert cli_main(["parity", str(bundle)]) == 0
    # a tokenizer_config that names its own BOS gets it
    (ckpt / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    assert read_settings(ckpt).prompt["bos_token"] == "<|endoftext|>"


def test_template_follows_the_config_setup_and_control_tokens(tiny_root, tmp_path):
    ckpt = released_checkpoint(tiny_root, tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "add_setup_tokens": False}))
    template = read_settings(ckpt).prompt["template"]
    assert "The setup is {setup}. The current state" in template
    assert "<control_start>{control}<control_end>" in template


@pytest.mark.parametrize("mode, mask", [("both", "exclude_eos"),
                                        ("continuous", "padding_only")])
def test_action_mode_gives_the_action_expert_mask(tiny_root, tmp_path, mode, mask):
    """Without goldens to read it off, config.json's action_mode decides the mask."""
    ckpt = released_checkpoint(tiny_root, tmp_path, action_mode=mode)
    bundle = bundle_copy(tiny_root, tmp_path, "grid_sampler", goldens=False)
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 0
    assert Conventions.from_json(bundle / "host" / "conventions.json").encoder_mask == mask


@pytest.mark.parametrize("change, named", [
    ({"use_single_crop_col_tokens": None}, "image_use_col_tokens"),
    ({"image_processor": {**PROCESSOR["image_processor"], "crop_mode": "overlap-and-resize-c2"}},
     "crop_mode"),
    ({"image_processor": {**PROCESSOR["image_processor"], "resample": 3}}, "resample"),
    ({"image_processor": {**PROCESSOR["image_processor"], "image_mean": [0.48, 0.45, 0.4]}},
     "image_mean"),
    ({"image_processor": {**PROCESSOR["image_processor"], "size": {"height": 336,
                                                                   "width": 336}}}, "size"),
])
def test_processor_settings_the_host_path_lacks_are_refused(tiny_root, tmp_path, change, named):
    ckpt = released_checkpoint(tiny_root, tmp_path, processor={**PROCESSOR, **change})
    with pytest.raises(BundleError, match=named):
        read_settings(ckpt)


def test_a_discrete_only_checkpoint_is_refused(tiny_root, tmp_path):
    ckpt = released_checkpoint(tiny_root, tmp_path, action_mode="discrete")
    with pytest.raises(BundleError, match="action_mode is 'discrete'"):
        read_settings(ckpt)


def _fill_finfo_min(bundle):
    """Rewrite the golden biases as the model fills them: finfo(float32).min, not -30000."""
    for name in ("llm_split0_io.npz", "llm_split1_io.npz", "llm_split2_io.npz",
                 "llm_split3_io.npz", "e2e_trace.npz", "e2e_trace_alt.npz"):
        path = bundle / "golden" / name
        data = dict(np.load(path, allow_pickle=False))
        bias = data["attention_bias"]
        data["attention_bias"] = np.where(bias < 0, np.finfo(np.float32).min,
                                          0).astype(np.float32)
        np.savez(path, **data)


def test_a_finfo_min_golden_reads_as_masked(tiny_root, tmp_path, capsys):
    """conventions and export-host used to abort on it; now it is "masked" and parity holds."""
    ckpt = released_checkpoint(tiny_root, tmp_path, variant="fused")
    bundle = bundle_copy(tiny_root, tmp_path, "fused")
    _fill_finfo_min(bundle)
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 0
    assert Conventions.from_json(bundle / "host" / "conventions.json").mask_value == -30000.0
    assert cli_main(["conventions", str(bundle)]) == 0
    assert "read as masked" in capsys.readouterr().out
    assert cli_main(["parity", str(bundle)]) == 0
    # a mask too weak to zero the softmax is still caught, against the same golden
    path = bundle / "host" / "conventions.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "mask_value": -1.0}))
    assert cli_main(["conventions", str(bundle)]) == 1
    assert cli_main(["parity", str(bundle)]) == 1


@pytest.mark.parametrize("variant", ["grid_sampler", "lp_vtp_sd"])
def test_the_golden_decoder_recovers_the_prompt(tiny_root, variant):
    d = decode_golden_prompt(Bundle.open(tiny_root / variant))
    trace = np.load(tiny_root / variant / "golden" / "e2e_trace.npz", allow_pickle=False)
    assert d.instruction == str(trace["instruction"])
    assert d.first_difference is None and not d.note
    assert d.padding_side == Bundle.open(tiny_root / variant).conventions().padding_side
    assert int(d.is_image.sum()) == Bundle.open(tiny_root / variant).variant.image_tokens
    # the golden's ids are the package's ids for the trace's observation
    np.testing.assert_array_equal(d.golden_ids, trace["input_ids"])


@pytest.mark.parametrize("field, value, where", [
    ("bos_token", "<|endoftext|>", 0),
    ("template", robot_template().replace("Image 2", "Image 3"), None),
])
def test_the_golden_decoder_names_the_first_difference(tiny_root, tmp_path, capsys, field,
                                                       value, where):
    root = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", root, ignore=shutil.ignore_patterns("ctx"))
    path = root / "host" / "prompt.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    d = decode_golden_prompt(Bundle.open(root))
    assert d.first_difference is not None
    pos, golden, ours = d.first_difference
    if where is not None:
        assert (pos, golden, ours) == (where, "<|im_end|>", "<|endoftext|>")
    assert cli_main(["conventions", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"first difference at position {pos}: golden {golden!r}, package {ours!r}" in out
