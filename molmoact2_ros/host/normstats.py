"""norm_stats.json (``molmoact2_norm_stats.v1``): state normalisation, action de-normalisation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BundleError

FORMAT = "molmoact2_norm_stats.v1"


@dataclass(frozen=True)
class FeatureStats:
    """Quantile statistics of one feature vector; ``mask`` marks the normalised dims."""

    names: tuple[str, ...]
    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray

    @property
    def width(self) -> int:
        return int(self.q01.shape[0])

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """q01/q99 → [−1, 1] on masked dims; unmasked dims pass through raw (host_glue §3.2)."""
        x = np.asarray(x, dtype=np.float32)
        denom = np.maximum(self.q99 - self.q01, np.float32(1e-6))
        scaled = np.float32(2.0) * (x - self.q01) / denom - np.float32(1.0)
        out = np.where(self.mask, scaled, x)
        return np.clip(out, -1.0, 1.0).astype(np.float32)

    def denormalize(self, a: np.ndarray) -> np.ndarray:
        """Clip to [−1, 1] first, then q01/q99 on masked dims; gripper passes through (§9)."""
        a = np.clip(np.asarray(a, dtype=np.float32), -1.0, 1.0)
        scaled = (a + np.float32(1.0)) * (self.q99 - self.q01) / np.float32(2.0) + self.q01
        return np.where(self.mask, scaled, a).astype(np.float32)


@dataclass(frozen=True)
class NormStats:
    """The ``libero`` tag of a norm_stats.json file."""

    action: FeatureStats
    state: FeatureStats
    action_horizon: int
    setup_type: str
    control_mode: str

    @classmethod
    def from_json(
        cls, path: Path, *, tag: str = "libero", action_dim: int = 7, state_dim: int = 8
    ) -> NormStats:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise BundleError(f"{path} is missing; the bundle must ship norm_stats.json") from None
        except json.JSONDecodeError as exc:
            raise BundleError(f"{path} is not valid JSON ({exc}); re-download it") from None
        if data.get("format", FORMAT) != FORMAT:
            raise BundleError(f"{path}: format {data.get('format')!r}, expected {FORMAT!r}")
        mode = data.get("norm_mode", "q01_q99")
        if mode != "q01_q99":
            raise BundleError(f"{path}: norm_mode {mode!r} is not supported (only q01_q99)")
        tags = data.get("metadata_by_tag", {})
        if tag not in tags:
            raise BundleError(f"{path}: no tag {tag!r} in metadata_by_tag (has {sorted(tags)})")
        meta = tags[tag]
        return cls(
            action=_feature(meta, "action_stats", action_dim, path),
            state=_feature(meta, "state_stats", state_dim, path),
            action_horizon=int(meta.get("action_horizon", 10)),
            setup_type=str(meta.get("setup_type", "single franka robotic arm in libero")),
            control_mode=str(meta.get("control_mode", "delta end-effector pose")),
        )


def _feature(meta: dict, key: str, width: int, path: Path) -> FeatureStats:
    if key not in meta:
        raise BundleError(f"{path}: {key} is missing from the libero tag")
    stats = meta[key]
    arrays = {}
    for field in ("q01", "q99"):
        if field not in stats:
            raise BundleError(f"{path}: {key}.{field} is missing")
        arrays[field] = np.asarray(stats[field], dtype=np.float32)
    mask = np.asarray(stats.get("mask", [True] * width), dtype=bool)
    for name, arr in (*arrays.items(), ("mask", mask)):
        if arr.shape != (width,):
            raise BundleError(
                f"{path}: {key}.{name} has {arr.size} values but this policy needs {width}; "
                "use the norm stats of the checkpoint the bundle was exported from"
            )
    if not np.all(np.isfinite(arrays["q01"])) or not np.all(np.isfinite(arrays["q99"])):
        raise BundleError(f"{path}: {key} q01/q99 contain NaN or inf")
    names = tuple(stats.get("names", [f"{key[:-6]}_{i}" for i in range(width)]))
    return FeatureStats(names=names, q01=arrays["q01"], q99=arrays["q99"], mask=mask)
