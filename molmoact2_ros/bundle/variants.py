"""Variant contracts as data: sequence lengths, token counts, tensor specs, file names.

Variant differences live in the ``VARIANTS`` table, never in ``if variant == ...`` branches.
Tensor shapes mix fixed sizes (from the variant) with symbols (``"H"``, ``"KV"``...) that are
bound from the loaded sessions and must agree across all seven of them (see runtime/session.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

from ..errors import ContractError

Dim = Union[int, str]

VISION = "vision"
LLM_SPLITS = ("llm_split0", "llm_split1", "llm_split2", "llm_split3")
ACTION_CONTEXT = "action_context"
ACTION_STEP = "action_step"
COMPONENTS = (VISION, *LLM_SPLITS, ACTION_CONTEXT, ACTION_STEP)

#: Components grouped the way the per-component context suffix parameters address them. As in
#: the reference runtime (``ACTION_CTX_SUFFIX``), ``action`` selects action_step only:
#: action_context has its own group, "" (fp16) unless a quantised context is named for it.
SUFFIX_GROUPS: Mapping[str, tuple[str, ...]] = {
    "vision": (VISION,),
    "llm": LLM_SPLITS,
    "action": (ACTION_STEP,),
    # action_context loads its fp16 context unless a quantised one is named explicitly
    "action_context": (ACTION_CONTEXT,),
}
#: The groups a quantised context set covers (the reference runtime's VISION_, LLM_ and
#: ACTION_CTX_SUFFIX switches); ``action_context`` is never part of a set.
SET_GROUPS: tuple[str, ...] = ("vision", "llm", "action")

FLOAT_DTYPES = frozenset({"float32", "float16"})
#: Masks and flags are numeric 0/1 tensors in every export we know of; bool/int also accepted.
MASK_DTYPES = frozenset({"float32", "float16", "bool", "int32", "int64", "uint8"})


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, shape (ints or symbols) and accepted dtypes."""

    name: str
    shape: tuple[Dim, ...]
    dtypes: frozenset[str] = FLOAT_DTYPES

    def describe(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.name}[{dims}]"


@dataclass(frozen=True)
class ComponentContract:
    """The I/O contract of one session."""

    component: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, self.component, "input")

    def output(self, name: str) -> TensorSpec:
        return _by_name(self.outputs, name, self.component, "output")


def _by_name(specs: Sequence[TensorSpec], name: str, component: str, kind: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    names = ", ".join(s.name for s in specs)
    raise ContractError(f"{component} has no {kind} named {name!r} (it has: {names})")


@dataclass(frozen=True)
class VariantSpec:
    """Everything that differs between the published bundles, as data."""

    name: str
    seq_len: int
    image_tokens_per_camera: int
    default_flow_steps: int
    description: str
    num_cameras: int = 2
    image_size: int = 378
    patch_size: int = 14
    horizon: int = 10
    action_dim: int = 7
    max_action_dim: int = 32
    state_dim: int = 8
    llm_splits: tuple[str, ...] = LLM_SPLITS
    soc_id: int = 77
    dsp_arch: str = "v73"
    onnx_dirs: Mapping[str, str] = field(default_factory=dict)

    @property
    def patches_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def patch_dim(self) -> int:
        return self.patch_size * self.patch_size * 3

    @property
    def image_tokens(self) -> int:
        return self.num_cameras * self.image_tokens_per_camera

    def context_file(self, component: str, suffix: str = "") -> str:
        """Context binary name: ``{component}{suffix}_socid77_archv73.bin``."""
        _check_component(component)
        return f"{component}{suffix}_socid{self.soc_id}_arch{self.dsp_arch}.bin"

    def onnx_dir(self, component: str) -> str:
        """Folder under ``onnx/`` that holds this component's graph."""
        _check_component(component)
        return self.onnx_dirs.get(component, component)

    def expected_dims(self) -> dict[str, int]:
        """Values the variant fixes for the contract symbols."""
        return {
            "S": self.seq_len,
            "IMG": self.image_tokens,
            "C": self.num_cameras,
            "P": self.patches_per_image,
            "PD": self.patch_dim,
            "T": self.horizon,
            "A": self.max_action_dim,
        }

    def contracts(self, *, euler_in_graph: bool = True) -> dict[str, ComponentContract]:
        """Per-component contracts; every dim is a symbol bound from the loaded sessions.

        ``expected_dims()`` gives the symbols the variant fixes; the rest (``H``, ``KV``,
        ``L0..L3``, ``L``, ``AH``, ``AD``) are model geometry that only has to chain.
        """
        contracts = {
            VISION: ComponentContract(
                VISION,
                (TensorSpec("pixel_values", (1, "C", "P", "PD")),),
                (TensorSpec("image_embeds", ("IMG", "H")),),
            )
        }
        for i, split in enumerate(self.llm_splits):
            contracts[split] = ComponentContract(
                split,
                (
                    TensorSpec("hidden_states", (1, "S", "H")),
                    TensorSpec("attention_bias", (1, 1, "S", "S")),
                ),
                (
                    TensorSpec("hidden_out", (1, "S", "H")),
                    TensorSpec("keys", (f"L{i}", 1, "S", "KV")),
                    TensorSpec("values", (f"L{i}", 1, "S", "KV")),
                ),
            )
        ctx = ("L", 1, "S", "AH", "AD")
        contracts[ACTION_CONTEXT] = ComponentContract(
            ACTION_CONTEXT,
            (TensorSpec("keys", ("L", 1, "S", "KV")), TensorSpec("values", ("L", 1, "S", "KV"))),
            (TensorSpec("k_ctx", ctx), TensorSpec("v_ctx", ctx)),
        )
        traj = (1, "T", "A")
        out_name = "next_trajectory" if euler_in_graph else "velocity"
        contracts[ACTION_STEP] = ComponentContract(
            ACTION_STEP,
            (
                TensorSpec("trajectory", traj),
                TensorSpec("timestep", (1,)),
                TensorSpec("k_ctx", ctx),
                TensorSpec("v_ctx", ctx),
                TensorSpec("encoder_attention_mask", (1, "S"), MASK_DTYPES),
                TensorSpec("action_dim_is_pad", (1, "A"), MASK_DTYPES),
            ),
            (TensorSpec(out_name, traj),),
        )
        return contracts


def _check_component(component: str) -> None:
    if component not in COMPONENTS:
        raise ContractError(
            f"unknown component {component!r}; expected one of {', '.join(COMPONENTS)}"
        )


VARIANTS: Mapping[str, VariantSpec] = {
    v.name: v
    for v in (
        VariantSpec(
            name="grid_sampler",
            seq_len=128,
            image_tokens_per_camera=16,
            default_flow_steps=10,
            description="Grid Sampler token pruning: 16 image tokens per camera, seq 128",
        ),
        VariantSpec(
            name="lp_vtp_sd",
            seq_len=130,
            image_tokens_per_camera=16,
            default_flow_steps=2,
            description="LP-VTP self-distilled: 16 tokens per camera, seq 130, 2 flow steps",
        ),
        VariantSpec(
            name="fused",
            seq_len=488,
            image_tokens_per_camera=196,
            default_flow_steps=10,
            description="original path with fused vision/action_step graphs: seq 488",
            onnx_dirs={VISION: "vision_fused", ACTION_STEP: "action_step_fused"},
        ),
    )
}


#: Where each variant's published bundle is (Hugging Face model repositories; several GB each).
BUNDLE_REPOS: Mapping[str, str] = {
    "grid_sampler": "xpuenabler/molmoact2-libero_grid_sampler_qnn",
    "lp_vtp_sd": "xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD",
    "fused": "xpuenabler/molmoact2-libero_grid_sampler_qnn-visfused-actstepfused",
}
#: The checkpoint each variant's host/ comes from (``molmoact2 export-host``); lp_vtp_sd's
#: bundle names only a "MolmoAct2-LIBERO-ViT10L" base, which is not published.
HOST_CHECKPOINTS: Mapping[str, str | None] = {
    "grid_sampler": "xpuenabler/molmoact2-libero_grid_sampler_fine_tuned",
    "lp_vtp_sd": None,
    "fused": "allenai/MolmoAct2-LIBERO",
}


def download_hint(variant: str | None = None, what: str = "the bundle") -> str:
    """How to (re-)download a variant's bundle, naming the repository (every variant's when
    the variant is not known)."""
    if variant in BUNDLE_REPOS:
        return (f"download {what} again: hf download {BUNDLE_REPOS[variant]} "
                f"--local-dir DIR/{variant} (docs/iq9075.md)")
    repos = ", ".join(f"{v}: {r}" for v, r in BUNDLE_REPOS.items())
    return f"download {what} from Hugging Face ({repos}; docs/iq9075.md)"


def checkpoint_hint(what: str = "it") -> str:
    """How to (re-)download a checkpoint, naming the repositories host/ comes from."""
    repos = ", ".join(f"{v}: {r}" for v, r in HOST_CHECKPOINTS.items() if r)
    return (f"download {what} again (hf download REPO --local-dir CHECKPOINT; "
            f"{repos})")


def get_variant(name: str) -> VariantSpec:
    """Look a variant up by name, with the list of valid names on failure."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise ContractError(
            f"unknown variant {name!r}; choose one of: {', '.join(VARIANTS)}"
        ) from None
