"""Shared fixtures: the tiny synthetic bundle (built once per session, or taken from make)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """Folder with one tiny bundle per variant (``MOLMOACT2_TINY_BUNDLE`` or built here)."""
    env = os.environ.get("MOLMOACT2_TINY_BUNDLE")
    if env and (Path(env) / "grid_sampler" / "bundle.json").is_file():
        return Path(env)
    pytest.importorskip("onnx")
    from molmoact2_ros.synth import write_tiny_bundles

    out = tmp_path_factory.mktemp("tiny-bundle")
    write_tiny_bundles(out)
    return out


@pytest.fixture(params=["grid_sampler", "lp_vtp_sd", "fused"])
def variant_name(request) -> str:
    return request.param
