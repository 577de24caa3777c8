"""The reference seed workspace (ctx/ golden/ golden/norm_stats.json qnn_libs/ dsp_libs/ + host/)
works as a bundle as it is laid out; its goldens are read as they are."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from htp_helpers import ensure_contexts, fake_env

from molmoact2_ros.cli.app import main

pytest.importorskip("onnxruntime")

RUNTIME = "2.51.40.260930230134"  # the fake wheel's QNN runtime version string


@pytest.fixture
def seed(tiny_root, tmp_path, monkeypatch):
    """lp_vtp_sd rearranged like the seed workspace: no bundle.json, no onnx/."""
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    root = tmp_path / "ws"
    src = tiny_root / "lp_vtp_sd"
    for name in ("ctx", "golden", "host"):
        shutil.copytree(src / name, root / name)
    shutil.copy(src / "norm_stats.json", root / "golden" / "norm_stats.json")
    for folder, lib in (("qnn_libs", "libQnnHtp.so"), ("dsp_libs", "libQnnHtpV73Skel.so")):
        (root / folder).mkdir()
        (root / folder / lib).write_text(f"stand-in, QAIRT v{RUNTIME}\n")
    return root


def test_seed_workspace_passes_parity_as_laid_out(seed, capsys):
    code = main(["parity", str(seed), "--variant", "lp_vtp_sd", "--backend", "htp",
                 "--suffix", "llm=_w4a16", "--suffix", "action=_w4a16"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "30/30 rows pass" in out


def test_golden_keys_that_do_not_fit_are_listed_with_shapes(seed, capsys):
    path = seed / "golden" / "vision_io.npz"
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["pixels"] = arrays.pop("pixel_values")  # a seed export naming the input differently
    np.savez(path, **arrays)
    code = main(["parity", str(seed), "--variant", "lp_vtp_sd", "--backend", "htp"])
    err = capsys.readouterr().err
    assert code == 2
    assert "lacks ['pixel_values'] needed for vision parity" in err
    shape = "x".join(str(d) for d in arrays["pixels"].shape)
    assert f"pixels{list(arrays['pixels'].shape)}" in err, shape
