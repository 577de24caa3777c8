"""norm_stats.json (``molmoact2_norm_stats.v1``): state normalisation, action de-normalisation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BundleError
from .schema import Field, check_fields, check_list, read_json_object

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
        cls, path: Path, *, tag: str = "libero", action_dim: int = 7, state_dim: int = 8,
        horizon: int | None = None,
    ) -> NormStats:
        path = Path(path)
        data = read_json_object(path, "norm_stats.json (molmoact2_norm_stats.v1)")
        top = check_fields(path, data, (
            Field("format", str, choices=(FORMAT,)),
            Field("norm_mode", str, choices=("q01_q99",)),
            Field("metadata_by_tag", dict, required=True),
        ))
        tags = top["metadata_by_tag"]
        if tag not in tags:
            raise BundleError(f"{path}: no tag {tag!r} in metadata_by_tag (has {sorted(tags)})")
        where = f"metadata_by_tag.{tag}."
        meta = tags[tag]
        if not isinstance(meta, dict):
            raise BundleError(f"{path}: {where[:-1]} must be an object")
        fields = check_fields(path, meta, (
            Field("action_horizon", int, minimum=1),
            Field("n_action_steps", int, minimum=1),
            Field("setup_type", str),
            Field("control_mode", str),
            Field("action_stats", dict, required=True),
            Field("state_stats", dict, required=True),
        ), where=where)
        action_horizon = fields.get("action_horizon", 10)
        if horizon is not None and action_horizon != horizon:
            raise BundleError(
                f"{path}: {where}action_horizon is {action_horizon} but the variant's action "
                f"horizon is {horizon}; use the norm stats of the checkpoint the bundle was "
                "exported from")
        return cls(
            action=_feature(meta, "action_stats", action_dim, path, where),
            state=_feature(meta, "state_stats", state_dim, path, where),
            action_horizon=action_horizon,
            setup_type=fields.get("setup_type", "single franka robotic arm in libero"),
            control_mode=fields.get("control_mode", "delta end-effector pose"),
        )


def _feature(meta: dict, key: str, width: int, path: Path, where: str = "") -> FeatureStats:
    stats = meta[key]
    where = f"{where}{key}."
    check_fields(path, stats, (Field("q01", list, required=True), Field("q99", list, required=True),
                               Field("mask", list), Field("names", list)), where=where)
    arrays = {name: np.asarray(check_list(path, stats[name], name, float, where=where),
                               dtype=np.float32) for name in ("q01", "q99")}
    mask = np.asarray(check_list(path, stats.get("mask", [True] * width), "mask", bool,
                                 where=where), dtype=bool)
    names = check_list(path, stats.get("names", [f"{key[:-6]}_{i}" for i in range(width)]),
                       "names", str, where=where)
    for name, arr in (*arrays.items(), ("mask", mask)):
        if arr.shape != (width,):
            raise BundleError(
                f"{path}: {key}.{name} has {arr.size} values but this policy needs {width}; "
                "use the norm stats of the checkpoint the bundle was exported from"
            )
    if not np.all(np.isfinite(arrays["q01"])) or not np.all(np.isfinite(arrays["q99"])):
        raise BundleError(f"{path}: {key} q01/q99 contain NaN or inf")
    inverted = np.flatnonzero(mask & (arrays["q01"] > arrays["q99"]))
    if inverted.size:
        raise BundleError(
            f"{path}: {where}q01 > q99 at index {inverted.tolist()}; the quantiles are swapped "
            "or corrupt (q01 must be <= q99), which would mirror the actions")
    return FeatureStats(names=tuple(names), q01=arrays["q01"], q99=arrays["q99"], mask=mask)
