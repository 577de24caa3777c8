"""Arena layout: which tensors live in shared memory, in which dtype, and who reads/writes them.

Inputs the host writes take the dtype of the session that reads them; a split's
``hidden_out`` takes the dtype of the next split's ``hidden_states`` (fp16 stays fp16) and is
its hand-off output (written first; the next split may start before the K/V copy is done);
the last split's ``hidden_out`` feeds nothing and gets no region. Split *i* writes its
keys/values into layers ``[L0+..+L(i-1), +Li)`` of the ``[L,1,S,KV]`` buffers that
action_context reads. ``x0``/``x_out`` are float32 (the host's flow state), ``status``
holds the session each worker is running (failure reports); ``inpaint_prefix``/``inpaint_weights``
carry the previous actions and per-row weights for inpainting (weights all 0 = off),
``inpaint_options`` its method and the ΠGDM cap β.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..bundle.variants import ACTION_CONTEXT, ACTION_STEP, VISION, VariantSpec
from ..errors import ContractError
from .arena import ArenaLayout
from .protocol import Binding, Slot
from .session import Geometry, TensorInfo

Declared = Mapping[str, tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]]


def _find(infos: tuple[TensorInfo, ...], name: str) -> TensorInfo:
    for info in infos:
        if info.name == name:
            return info
    raise ContractError(f"no tensor named {name!r}")


def plan_arena(
    declared: Declared, variant: VariantSpec, geometry: Geometry, num_workers: int
) -> tuple[ArenaLayout, dict[str, Binding]]:
    """Arena regions (in the dtype the consuming session declares) and each session's slots."""

    def inp(component: str, name: str) -> TensorInfo:
        return _find(declared[component][0], name)

    def out(component: str, name: str) -> TensorInfo:
        return _find(declared[component][1], name)

    tensors: list[tuple[str, tuple[int, ...], str]] = []

    def add(region: str, info: TensorInfo, dtype: str | None = None) -> Slot:
        tensors.append((region, info.shape, dtype or info.dtype))
        return Slot(region)

    bindings = {
        VISION: Binding(
            VISION,
            {"pixel_values": add("pixel_values", inp(VISION, "pixel_values"))},
            {"image_embeds": add("image_embeds", out(VISION, "image_embeds"))},
        )
    }
    splits = variant.llm_splits
    hidden = add("hidden_states", inp(splits[0], "hidden_states"))
    bias = add("attention_bias", inp(splits[0], "attention_bias"))
    add("keys", inp(ACTION_CONTEXT, "keys"))
    add("values", inp(ACTION_CONTEXT, "values"))
    first = 0
    for i, split in enumerate(splits):
        layers = (first, first + geometry.layers_per_split[i])
        first = layers[1]
        inputs = {"hidden_states": hidden, "attention_bias": bias}
        outputs = {"keys": Slot("keys", layers), "values": Slot("values", layers)}
        if i + 1 < len(splits):  # the last split's hidden_out feeds nothing: no region, no copy
            consumer = inp(splits[i + 1], "hidden_states").dtype
            hidden = add(f"hidden_out{i}", out(split, "hidden_out"), consumer)
            outputs["hidden_out"] = hidden
        handoff = ("hidden_out",) if "hidden_out" in outputs else ()
        bindings[split] = Binding(split, inputs, outputs, handoff)
    bindings[ACTION_CONTEXT] = Binding(
        ACTION_CONTEXT, {"keys": Slot("keys"), "values": Slot("values")}
    )
    bindings[ACTION_STEP] = Binding(
        ACTION_STEP,
        {
            name: add(name, inp(ACTION_STEP, name))
            for name in ("encoder_attention_mask", "action_dim_is_pad")
        },
    )
    trajectory = inp(ACTION_STEP, "trajectory")
    tensors += [
        ("x0", trajectory.shape, "float32"),
        ("x_out", trajectory.shape, "float32"),
        ("inpaint_prefix", trajectory.shape, "float32"),
        ("inpaint_weights", (trajectory.shape[1],), "float32"),
        ("inpaint_options", (2,), "float32"),  # method index (INPAINT_METHODS), ΠGDM β
        ("status", (num_workers,), "int32"),
    ]
    return ArenaLayout.plan(tensors), bindings
