"""host/ assets from a checkpoint: the exported tiny checkpoint reproduces the tiny bundle."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from molmoact2_ros.cli import main as cli_main
from molmoact2_ros.errors import BundleError
from molmoact2_ros.export_host import embedding_table
from molmoact2_ros.golden import e2e_parity
from molmoact2_ros.policy import Policy

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


def _checkpoint(tiny_root, tmp_path):
    table = np.load(tiny_root / "grid_sampler" / "host" / "embeddings.npy")
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    shutil.copy(tiny_root / "grid_sampler" / "host" / "tokenizer.json", ckpt)
    shutil.copy(tiny_root / "grid_sampler" / "norm_stats.json", ckpt)
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


def test_exported_host_assets_reproduce_the_bundle(tiny_root, tmp_path):
    ckpt, table = _checkpoint(tiny_root, tmp_path)
    bundle = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", bundle,
                    ignore=shutil.ignore_patterns("ctx", "host"))
    (bundle / "host").mkdir()
    shutil.copy(tiny_root / "grid_sampler" / "host" / "conventions.json", bundle / "host")
    assert cli_main(["export-host", str(ckpt), str(bundle)]) == 0
    np.testing.assert_array_equal(np.load(bundle / "host" / "embeddings.npy"), table)
    with Policy.load(bundle) as policy:
        rows = e2e_parity(policy, bundle / "golden" / "e2e_trace.npz")
    assert all(r.passed for r in rows), rows


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
