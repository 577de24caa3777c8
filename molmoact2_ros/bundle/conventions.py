"""The host-glue choices a bundle decides, in one record loaded from ``conventions.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..errors import BundleError
from .schema import Field, check_fields, read_json_object

PADDING_SIDES = ("right", "left")
#: ``padding_only``: the action expert sees every valid prompt position.
#: ``exclude_eos``: also hides positions whose id is the EOS id (BOS = EOS in Qwen) — the
#: HF "both" checkpoints (host_glue.md §8.3).
ENCODER_MASK_POLICIES = ("padding_only", "exclude_eos")


@dataclass(frozen=True)
class Conventions:
    """Host-side choices that must match how the bundle's graphs and goldens were made."""

    mask_value: float = -30000.0
    padding_side: str = "right"
    bidirectional_image_attention: bool = True
    encoder_mask: str = "padding_only"
    euler_in_graph: bool = True
    #: With in-graph Euler, the dt the export baked in is ``1 / euler_baked_steps``.
    euler_baked_steps: int = 10
    image_embeds_include_patch_embedding: bool = False
    flip_images_180: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not (-65504.0 <= self.mask_value < 0):
            problems.append(
                f"mask_value {self.mask_value} must be finite, negative and fp16-representable "
                "(use -30000 or -1e4)"
            )
        if self.padding_side not in PADDING_SIDES:
            problems.append(f"padding_side {self.padding_side!r} must be one of {PADDING_SIDES}")
        if self.encoder_mask not in ENCODER_MASK_POLICIES:
            problems.append(
                f"encoder_mask {self.encoder_mask!r} must be one of {ENCODER_MASK_POLICIES}"
            )
        if self.euler_baked_steps < 1:
            problems.append(f"euler_baked_steps {self.euler_baked_steps} must be >= 1")
        if problems:
            raise BundleError("invalid conventions: " + "; ".join(problems))

    @classmethod
    def from_json(cls, path: Path) -> Conventions:
        data = read_json_object(path, "host/conventions.json (molmoact2 export-host writes it)")
        kinds = {"float": float, "str": str, "bool": bool, "int": int}
        schema = tuple(
            Field(f.name, kinds[f.type],
                  choices={"padding_side": PADDING_SIDES,
                           "encoder_mask": ENCODER_MASK_POLICIES}.get(f.name, ()))
            for f in fields(cls)
        )
        values = check_fields(path, data, schema, allow_unknown=False)
        try:
            return cls(**values)
        except BundleError as exc:
            raise BundleError(f"{path}: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)
