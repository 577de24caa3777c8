"""Deterministic tiny synthetic bundles: ONNX graphs plus goldens from a numpy reference."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

DEFAULT_VARIANTS = ("grid_sampler", "lp_vtp_sd", "fused")


def write_tiny_bundles(
    out_dir: Path, variants: Sequence[str] = DEFAULT_VARIANTS, seed: int = 0
) -> dict[str, Path]:
    """Write one bundle folder per variant (``out_dir/<variant>/``); same seed, same bytes.

    Needs ``onnx`` (graph building); the goldens come only from the numpy reference. The
    ``ctx/`` binaries (fp16 and ``_w4a16`` names) load only in the test fake of qai_appbuilder.
    """
    from ..bundle.variants import get_variant
    from .contexts import write_fake_contexts
    from .writer import write_variant

    out = {}
    for name in variants:
        variant = get_variant(name)  # fail early, listing the valid names
        out[name] = write_variant(Path(out_dir), name, seed)
        write_fake_contexts(out[name], variant)
    return out


__all__ = ["DEFAULT_VARIANTS", "write_tiny_bundles"]
