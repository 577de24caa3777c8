"""norm_stats.json (``molmoact2_norm_stats.v1``): state normalisation, action de-normalisation.

Nothing downstream can tell wrong stats from right ones (every check compares normalised
values), so a file is refused unless it says what it means: its mode (the HF model's default
is min/max, LeRobot fine-tunes use quantiles), which dimensions pass through raw (a missing mask
follows LeRobot's rule: names containing ``gripper``), finite values of the policy's width with
low <= high. A dimension whose min equals its max maps to 0, as the HF normaliser does. The
top-level ``source`` records where the stats came from (export-host writes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BundleError
from .schema import Field, check_fields, check_list, read_json_object

FORMAT = "molmoact2_norm_stats.v1"
#: Modes and the statistics each reads (the HF model's names; LeRobot: QUANTILES, MIN_MAX,
#: QUANTILE10).
MODES = {"q01_q99": ("q01", "q99"), "min_max": ("min", "max"), "q10_q90": ("q10", "q90")}
_NO_MODE = ("norm_mode is missing, and a guess rescales every action if it is wrong (the HF "
            "model's default is min_max, LeRobot fine-tunes use q01_q99): name it, e.g. "
            "\"norm_mode\": \"q01_q99\" at the top of the file, or molmoact2 export-host "
            "--norm-mode q01_q99")


@dataclass(frozen=True)
class FeatureStats:
    """One feature's low/high statistics (q01/q99 or min/max, by the file's mode); ``mask``
    marks the normalised dims, ``zero`` those whose min equals their max (they map to 0)."""

    names: tuple[str, ...]
    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray
    zero: np.ndarray | None = None
    #: where the mask came from: "file", or "names" (LeRobot's gripper rule)
    mask_source: str = "file"

    @property
    def width(self) -> int:
        return int(self.q01.shape[0])

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """low/high → [−1, 1] on masked dims; unmasked dims pass through raw (host_glue §3.2);
        min == max dims map to 0 (the HF normaliser)."""
        x = np.asarray(x, dtype=np.float32)
        denom = np.maximum(self.q99 - self.q01, np.float32(1e-6))
        scaled = np.float32(2.0) * (x - self.q01) / denom - np.float32(1.0)
        out = np.clip(np.where(self.mask, scaled, x), -1.0, 1.0)
        if self.zero is not None:
            out = np.where(self.zero, np.float32(0.0), out)
        return out.astype(np.float32)

    def denormalize(self, a: np.ndarray) -> np.ndarray:
        """Clip to [−1, 1] first, then low/high on masked dims; gripper passes through (§9)."""
        a = np.clip(np.asarray(a, dtype=np.float32), -1.0, 1.0)
        scaled = (a + np.float32(1.0)) * (self.q99 - self.q01) / np.float32(2.0) + self.q01
        return np.where(self.mask, scaled, a).astype(np.float32)

    def describe_mask(self) -> str:
        raw = [n for n, m in zip(self.names, self.mask) if not m]
        how = "from the names (LeRobot's gripper rule)" if self.mask_source == "names" else \
            "from the file"
        return f"raw: {', '.join(raw) or 'none'} ({how})"


@dataclass(frozen=True)
class NormStats:
    """The ``libero`` tag of a norm_stats.json file, with its mode and where it came from."""

    action: FeatureStats
    state: FeatureStats
    action_horizon: int
    setup_type: str
    control_mode: str
    mode: str = "q01_q99"
    #: where the stats came from (the file's ``source``, else "unrecorded")
    source: str = "unrecorded"
    path: str = ""

    def describe(self) -> str:
        """Provenance, mode and masks in one line (the report and the node's startup log)."""
        return (f"norm stats {self.path}: from {self.source}; mode {self.mode}; state "
                f"{self.state.describe_mask()}; action {self.action.describe_mask()}")

    @classmethod
    def from_json(
        cls, path: Path, *, tag: str = "libero", action_dim: int = 7, state_dim: int = 8,
        horizon: int | None = None,
    ) -> NormStats:
        path = Path(path)
        data = read_json_object(path, "norm_stats.json (molmoact2_norm_stats.v1)")
        top = check_fields(path, data, (
            Field("format", str, choices=(FORMAT,)),
            Field("norm_mode", str, choices=tuple(MODES)),
            Field("source", str),
            Field("metadata_by_tag", dict, required=True),
        ))
        if "norm_mode" not in top:
            raise BundleError(f"{path}: {_NO_MODE}")
        mode = top["norm_mode"]
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
            action=_feature(meta, "action_stats", action_dim, path, where, mode),
            state=_feature(meta, "state_stats", state_dim, path, where, mode),
            action_horizon=action_horizon,
            setup_type=fields.get("setup_type", "single franka robotic arm in libero"),
            control_mode=fields.get("control_mode", "delta end-effector pose"),
            mode=mode, source=top.get("source", "unrecorded"), path=str(path),
        )


def mask_from_names(names) -> list[bool]:
    """LeRobot's rule without a mask: a dimension whose name contains ``gripper`` is raw."""
    return ["gripper" not in str(n).lower() for n in names]


def _feature(meta: dict, key: str, width: int, path: Path, where: str = "",
             mode: str = "q01_q99") -> FeatureStats:
    stats = meta[key]
    where = f"{where}{key}."
    low, high = MODES[mode]
    check_fields(path, stats, (Field(low, list, required=True), Field(high, list, required=True),
                               Field("min", list), Field("max", list),
                               Field("mask", list), Field("names", list)), where=where)
    arrays = {name: np.asarray(check_list(path, stats[name], name, float, where=where),
                               dtype=np.float32)
              for name in dict.fromkeys((low, high, "min", "max")) if name in stats}
    names = stats.get("names")
    if names is not None:
        names = check_list(path, names, "names", str, where=where)
    if "mask" in stats:
        mask = np.asarray(check_list(path, stats["mask"], "mask", bool, where=where), dtype=bool)
        mask_source = "file"
    elif names is not None and len(names) == width:
        mask, mask_source = np.asarray(mask_from_names(names), dtype=bool), "names"
    else:
        raise BundleError(
            f"{path}: {where}mask is missing and there are no {width} names to derive it from "
            "(LeRobot passes dimensions named 'gripper' through raw); add the mask, e.g. "
            f"{[True] * (width - 1) + [False]} for a raw last dimension")
    if names is None:
        names = [f"{key[:-6]}_{i}" for i in range(width)]
    for name, arr in (*arrays.items(), ("mask", mask), ("names", np.asarray(names))):
        if arr.shape != (width,):
            raise BundleError(
                f"{path}: {where}{name} has {arr.size} values but this policy needs {width}; "
                "use the norm stats of the checkpoint the bundle was exported from"
            )
    for name, arr in arrays.items():
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise BundleError(f"{path}: {where}{name} has NaN or inf at index {bad.tolist()}; "
                              "the file is corrupt: re-export it from the checkpoint")
    inverted = np.flatnonzero(mask & (arrays[low] > arrays[high]))
    if inverted.size:
        raise BundleError(
            f"{path}: {where}{low} > {high} at index {inverted.tolist()}; the statistics are "
            f"swapped or corrupt ({low} must be <= {high}), which would mirror the actions")
    zero = None
    if "min" in arrays and "max" in arrays:
        zero = arrays["min"] == arrays["max"]
    return FeatureStats(names=tuple(names), q01=arrays[low], q99=arrays[high], mask=mask,
                        zero=zero if zero is not None and zero.any() else None,
                        mask_source=mask_source)
