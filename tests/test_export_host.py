"""host/ assets from a checkpoint: the exported tiny checkpoint reproduces the tiny bundle."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from molmoact2_ros.bundle.conventions import Conventions
from molmoact2_ros.cli.app import main as cli_main
from molmoact2_ros.cli.export_host import embedding_table
from molmoact2_ros.errors import BundleError

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _write_bf16(path, tensors):
    """A safetensors file with BF16 tensors, written from the format spec (numpy has no bf16)."""
    header, blobs, offset = {}, [], 0
    for name, values in tensors.items():
        bits = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(values.shape),
                        "data_offsets": [offset, offset + len(bits)]}
        blobs.append(bits)
        offset += len(bits)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def _checkpoint(tiny_root, tmp_path, variant="grid_sampler"):
    table = np.load(tiny_root / variant / "host" / "embeddings.npy")
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    shutil.copy(tiny_root / variant / "host" / "tokenizer.json", ckpt)
    shutil.copy(tiny_root / variant / "norm_stats.json", ckpt)
    base, new = table[:-128].astype(np.float32), table[-128:].astype(np.float32)
    safetensors_numpy.save_file({"model.transformer.wte.embedding": base,
                                 "model.lm_head.weight": base[:4]}, str(ckpt / "a.safetensors"))
    safetensors_numpy.save_file({"model.transformer.wte.new_embedding": new},
                                str(ckpt / "b.safetensors"))
    index = {"weight_map": {"model.transformer.wte.embedding": "a.safetensors",
                            "model.lm_head.weight": "a.safetensors",
                            "model.transformer.wte.new_embedding": "b.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    return ckpt, table


def _bundle_without_host(tiny_root, tmp_path, variant):
    bundle = tmp_path / variant
    shutil.copytree(tiny_root / variant, bundle, ignore=shutil.ignore_patterns("ctx", "host"))
    return bundle


def test_exported_host_assets_reproduce_the_bundle(tiny_root, tmp_path, variant_name, capsys):
    """Onboarding with no hand edit: export-host, then conventions and parity pass."""
    ckpt, table = _checkpoint(tiny_root, tmp_path, variant_name)
    bundle = _bundle_without_host(tiny_root, tmp_path, variant_name)
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 0
    out = capsys.readouterr().out
    # the step count shows in the primary trace where Euler runs in the graph; a velocity
    # graph bakes none (its default is listed); the image flip no golden shows
    in_graph = Conventions.from_json(tiny_root / variant_name / "host" /
                                     "conventions.json").euler_in_graph
    listed = "flip_images_180" if in_graph else "euler_baked_steps, flip_images_180"
    assert f"defaults still to verify: {listed}" in out
    assert out.strip().splitlines()[-1].startswith("export-host: wrote 4 files to ")
    np.testing.assert_array_equal(np.load(bundle / "host" / "embeddings.npy"), table)
    # the goldens decide what the bundle's writer chose; the two unreadable choices are defaults
    assert Conventions.from_json(bundle / "host" / "conventions.json") == \
        Conventions.from_json(tiny_root / variant_name / "host" / "conventions.json")
    assert cli_main(["conventions", str(bundle)]) == 0
    assert cli_main(["parity", str(bundle)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("parity: PASS: ")


def test_export_host_refuses_to_overwrite_without_force(tiny_root, tmp_path, capsys):
    ckpt, _ = _checkpoint(tiny_root, tmp_path)
    bundle = _bundle_without_host(tiny_root, tmp_path, "grid_sampler")
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 0
    prompt = bundle / "host" / "prompt.json"
    prompt.write_text("{}")  # a local edit a re-run must not silently replace or keep
    capsys.readouterr()
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already has tokenizer.json, embeddings.npy, prompt.json, " \
        "conventions.json; pass --force to overwrite them" in err
    assert prompt.read_text() == "{}"
    # --force replaces what export-host wrote, never a file edited since: that is named
    assert cli_main(["export-host", str(ckpt), str(bundle), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert "prompt.json exists and it changed since this package wrote it" in err, err
    assert prompt.read_text() == "{}"
    prompt.rename(prompt.with_name("prompt.mine.json"))
    assert cli_main(["export-host", str(ckpt), str(bundle), "--force"]) == 0
    assert json.loads(prompt.read_text())["template"]
    assert cli_main(["export-host", str(ckpt), str(bundle), "--force"]) == 0  # its own: replaced
    assert (bundle / "host" / "prompt.mine.json").read_text() == "{}"


def test_a_failed_export_leaves_nothing_that_blocks_a_rerun(tiny_root, tmp_path):
    ckpt, _ = _checkpoint(tiny_root, tmp_path)
    (ckpt / "b.safetensors").write_bytes(b"not safetensors")
    bundle = _bundle_without_host(tiny_root, tmp_path, "grid_sampler")
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 2
    assert sorted(p.name for p in (bundle / "host").iterdir()) == []


def test_bfloat16_tables_are_widened_exactly(tmp_path):
    values = np.array([[1.0, -2.5, 0.15625], [3.0e3, -0.0, 1.0e-3]], np.float32)
    exact = (values.view(np.uint32) & 0xFFFF0000).view(np.float32)  # bf16-representable
    _write_bf16(tmp_path / "m.safetensors", {"x.wte.embedding": exact,
                                             "x.wte.new_embedding": exact[:1]})
    got = embedding_table(tmp_path)
    np.testing.assert_array_equal(got, np.concatenate([exact, exact[:1]]).astype(np.float16))


def test_not_a_molmoact_checkpoint(tmp_path):
    safetensors_numpy.save_file({"w": np.zeros((2, 2), np.float32)},
                                str(tmp_path / "m.safetensors"))
    with pytest.raises(BundleError, match="no tensor ending in"):
        embedding_table(tmp_path)


def _lerobot_processor(ckpt, stats: dict, *, mode: str | None = "QUANTILES"):
    """A LeRobot fine-tune's normaliser state as LeRobot saves it: flat ``feature.stat`` keys
    in the preprocessor step's safetensors, the mode in policy_preprocessor.json's norm_map."""
    name = "policy_preprocessor_step_3_normalizer_processor.safetensors"
    tensors = {}
    for ours, feature in (("state_stats", "observation.state"), ("action_stats", "action")):
        for stat in ("q01", "q99", "min", "max", "mean", "std"):
            tensors[f"{feature}.{stat}"] = np.asarray(stats[ours][stat], np.float32)
        tensors[f"{feature}.mask"] = np.asarray(stats[ours]["mask"], bool)
    safetensors_numpy.save_file(tensors, str(ckpt / name))
    if mode:
        config = {"name": "policy_preprocessor", "steps": [
            {"registry_name": "normalizer_processor", "state_file": name,
             "config": {"eps": 1e-8, "norm_map": {"VISUAL": "IDENTITY", "STATE": mode,
                                                  "ACTION": mode}}}]}
        (ckpt / "policy_preprocessor.json").write_text(json.dumps(config))
    return ckpt / name


def test_a_lerobot_fine_tunes_processor_stats_replace_the_bundles(tiny_root, tmp_path, capsys):
    """The fine-tune's own statistics (the processor's), recorded with their source, win over
    the golden/norm_stats.json the bundle ships."""
    from molmoact2_ros.bundle.bundle import Bundle

    ckpt, _ = _checkpoint(tiny_root, tmp_path)
    shipped = json.loads((tiny_root / "grid_sampler" / "norm_stats.json").read_text())
    tuned = json.loads(json.dumps(shipped["metadata_by_tag"]["libero"]))
    tuned["action_stats"]["q99"][0] = 0.5  # the fine-tune's dataset differs
    processor = _lerobot_processor(ckpt, tuned)
    bundle = _bundle_without_host(tiny_root, tmp_path, "grid_sampler")
    (bundle / "golden" / "norm_stats.json").write_bytes((bundle / "norm_stats.json").read_bytes())
    (bundle / "norm_stats.json").unlink()
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 0
    assert f"wrote {bundle / 'norm_stats.json'}" in capsys.readouterr().out
    stats = Bundle.open(bundle).norm_stats()
    assert stats.source == f"LeRobot processor {processor}" and stats.mode == "q01_q99"
    assert stats.action.q99[0] == np.float32(0.5)
    assert stats.state.mask.tolist() == tuned["state_stats"]["mask"]
    # a second run does not replace it silently
    assert cli_main(["export-host", str(ckpt), str(bundle), "--force"]) == 0
    shutil.rmtree(bundle / "host")
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 2
    assert "norm_stats.json exists; pass --force" in capsys.readouterr().err


def test_a_processor_without_its_mode_needs_it_named(tiny_root, tmp_path, capsys):
    ckpt, _ = _checkpoint(tiny_root, tmp_path)
    tuned = json.loads((tiny_root / "grid_sampler" / "norm_stats.json").read_text())
    _lerobot_processor(ckpt, tuned["metadata_by_tag"]["libero"], mode=None)
    bundle = _bundle_without_host(tiny_root, tmp_path, "grid_sampler")
    (bundle / "norm_stats.json").unlink()
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 2
    err = capsys.readouterr().err
    assert "names the normalisation mode; name it with --norm-mode" in err, err
    assert not (bundle / "norm_stats.json").exists()
    assert cli_main(["export-host", str(ckpt), str(bundle), "--force", "--norm-mode",
                     "min_max"]) == 0
    from molmoact2_ros.bundle.normstats import NormStats

    stats = NormStats.from_json(bundle / "norm_stats.json")
    lo = tuned["metadata_by_tag"]["libero"]["action_stats"]["min"]
    assert stats.mode == "min_max" and np.allclose(stats.action.q01, lo)
