"""The runtime seam: a Session protocol and the validated set of seven sessions."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..bundle.variants import (
    ACTION_CONTEXT,
    ACTION_STEP,
    COMPONENTS,
    VISION,
    ComponentContract,
    TensorSpec,
    VariantSpec,
)
from ..errors import ContractError


@dataclass(frozen=True)
class TensorInfo:
    """A concrete tensor as a loaded session declares it."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        return f"{self.name}[{','.join(str(d) for d in self.shape)}] {self.dtype}"


@runtime_checkable
class Session(Protocol):
    """One loaded graph: named inputs in, named outputs out."""

    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; ``feeds`` holds every input by name, in the declared dtype."""

    def close(self) -> None:
        """Release the session; idempotent."""


@dataclass(frozen=True)
class Geometry:
    """Model dimensions bound from the loaded sessions (after the chain check)."""

    dims: Mapping[str, int]
    layers_per_split: tuple[int, ...]
    #: how action_context's k_ctx/v_ctx were taken (5-D as declared, or flat and reshaped)
    kv_ctx_shape: str = ""

    def __getitem__(self, symbol: str) -> int:
        return self.dims[symbol]

    @property
    def seq_len(self) -> int:
        return self.dims["S"]

    @property
    def hidden(self) -> int:
        return self.dims["H"]

    @property
    def kv_width(self) -> int:
        return self.dims["KV"]

    @property
    def num_layers(self) -> int:
        return self.dims["L"]

    @property
    def image_tokens(self) -> int:
        return self.dims["IMG"]


def _where(component: str, kind: str, info: TensorInfo) -> str:
    return f"{component} {kind} {info.describe()}"


def bind_contracts(
    sessions: Mapping[str, Session],
    contracts: Mapping[str, ComponentContract],
    variant: VariantSpec,
) -> Geometry:
    """Check names, ranks, dtypes and chaining of all sessions; return the bound geometry.

    Every failure names the tensors that disagree (both of them for chain failures) and
    says what to do about it.
    """
    bound: dict[str, tuple[int, str]] = {}
    flat: list[tuple[str, str, TensorInfo]] = []
    for component in COMPONENTS:
        if component not in sessions:
            raise ContractError(f"session {component!r} is missing from the set")
        session, contract = sessions[component], contracts[component]
        for kind, specs, infos in (
            ("input", contract.inputs, session.inputs),
            ("output", contract.outputs, session.outputs),
        ):
            by_name = {i.name: i for i in infos}
            for spec in specs:
                info = by_name.get(spec.name)
                if info is None:
                    raise ContractError(
                        f"{component} has no {kind} named {spec.name!r} (it has: "
                        f"{', '.join(by_name) or 'none'}); the graph does not match the "
                        f"{variant.name} contract"
                    )
                if spec.name in KV_CTX and len(info.shape) != len(spec.shape):
                    flat.append((component, kind, info))  # checked once L, S (AH, AD) bind
                    continue
                _bind_tensor(component, kind, spec, info, bound)
        if component == "llm_split0":
            _check_image_tokens_fit(bound)
    kv_ctx_shape = _bind_flat_kv_ctx(flat, bound)
    _check_relations(bound, variant)
    dims = {k: v for k, (v, _) in bound.items()}
    layers = tuple(dims[f"L{i}"] for i in range(len(variant.llm_splits)))
    return Geometry(dims=dims, layers_per_split=layers, kv_ctx_shape=kv_ctx_shape)


#: action_context → action_step tensors that may come flat (the reference runtime reshapes)
KV_CTX = ("k_ctx", "v_ctx")
#: (heads, head dim) the reference runtime reshapes a flat k_ctx/v_ctx with: [L, 1, S, 8, 96]
REFERENCE_KV_CTX_HEADS = (8, 96)


def _bind_flat_kv_ctx(flat: list[tuple[str, str, TensorInfo]],
                      bound: dict[str, tuple[int, str]]) -> str:
    """Accept k_ctx/v_ctx flat ([N] or [L, 1, S, AH*AD]) as the reference runtime does.

    The element count must be L*S*AH*AD with AH, AD from a 5-D side when one exists, else the
    reference runtime's (8, 96). Returns how the shape was taken, for the contract check's
    report ("" when every side is 5-D).
    """
    if not flat:
        return ""
    length, seq = bound["L"][0], bound["S"][0]
    if "AH" not in bound:
        heads, head_dim = REFERENCE_KV_CTX_HEADS
        bound["AH"] = (heads, "the reference runtime's reshape of a flat k_ctx")
        bound["AD"] = (head_dim, "the reference runtime's reshape of a flat k_ctx")
        source = "the reference runtime's heads"
    else:
        heads, head_dim = bound["AH"][0], bound["AD"][0]
        source = "the 5-D side's heads"
    want = length * seq * heads * head_dim
    notes = []
    for component, kind, info in flat:
        size = int(np.prod(info.shape, dtype=np.int64))
        where = _where(component, kind, info)
        if size != want:
            raise ContractError(
                f"{where} has {size} elements but [L,1,S,AH,AD] = [{length},1,{seq},{heads},"
                f"{head_dim}] needs {want}; this action_context does not chain with the "
                "action_step and LLM contexts"
            )
        notes.append(f"{component} {kind} {info.name}{list(info.shape)}")
    return (f"flat k_ctx/v_ctx ({'; '.join(notes)}) reshaped to [{length},1,{seq},{heads},"
            f"{head_dim}] ({source})")


def _bind_tensor(
    component: str,
    kind: str,
    spec: TensorSpec,
    info: TensorInfo,
    bound: dict[str, tuple[int, str]],
) -> None:
    where = _where(component, kind, info)
    if info.dtype not in spec.dtypes:
        raise ContractError(
            f"{where}: dtype {info.dtype} is not one of {sorted(spec.dtypes)}; re-export "
            "the graph with a supported dtype"
        )
    if len(info.shape) != len(spec.shape):
        raise ContractError(
            f"{where}: rank {len(info.shape)} but the contract wants {spec.describe()}"
        )
    for axis, (want, got) in enumerate(zip(spec.shape, info.shape)):
        if isinstance(want, int):
            if want != got:
                raise ContractError(
                    f"{where}: dim {axis} is {got}, the contract wants {spec.describe()}"
                )
            continue
        if want not in bound:
            bound[want] = (got, where)
        elif bound[want][0] != got:
            first, first_where = bound[want]
            raise ContractError(
                f"{where} has {want}={got} but {first_where} has {want}={first}; these "
                "sessions do not chain (were they compiled for different variants?)"
            )


def _check_image_tokens_fit(bound: dict[str, tuple[int, str]]) -> None:
    img, img_where = bound["IMG"]
    seq, seq_where = bound["S"]
    if img >= seq:
        raise ContractError(
            f"{img_where} emits {img} image tokens but {seq_where} holds only {seq} positions; "
            f"the LLM contexts were compiled for seq {seq}, the vision context for a longer "
            "prompt. Use LLM contexts compiled for this vision graph's sequence length."
        )


def _check_relations(bound: dict[str, tuple[int, str]], variant: VariantSpec) -> None:
    layers = sum(bound[f"L{i}"][0] for i in range(len(variant.llm_splits)))
    total, total_where = bound["L"]
    if layers != total:
        raise ContractError(
            f"the LLM splits emit {layers} layers of keys/values but {total_where} expects "
            f"{total}; the action contexts belong to a different LLM"
        )
    for symbol, want in variant.expected_dims().items():
        got, where = bound[symbol]
        if got != want:
            raise ContractError(
                f"{where} has {symbol}={got} but variant {variant.name} needs {want}; "
                f"load the {variant.name} bundle or choose the variant these contexts were "
                "compiled for"
            )


class SessionSet:
    """The seven sessions of one variant, validated to chain, closed together."""

    def __init__(
        self,
        sessions: Mapping[str, Session],
        variant: VariantSpec,
        *,
        euler_in_graph: bool = True,
    ) -> None:
        self.variant = variant
        self.sessions = dict(sessions)
        self.contracts = variant.contracts(euler_in_graph=euler_in_graph)
        try:
            self.geometry = bind_contracts(self.sessions, self.contracts, variant)
        except Exception:
            self.close()
            raise

    def __getitem__(self, component: str) -> Session:
        return self.sessions[component]

    def __iter__(self) -> Iterator[str]:
        return iter(COMPONENTS)

    @property
    def step_output(self) -> str:
        return self.contracts[ACTION_STEP].outputs[0].name

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()

    def __enter__(self) -> SessionSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


NUMPY_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "bool": np.bool_,
}


def cast_feeds(
    feeds: Mapping[str, np.ndarray], inputs: Sequence[TensorInfo]
) -> dict[str, np.ndarray]:
    """Cast feeds to the dtypes a session declares, checking element counts."""
    out = {}
    for info in inputs:
        if info.name not in feeds:
            raise ContractError(f"missing input {info.name!r} for this session")
        arr = np.asarray(feeds[info.name])
        if arr.size != int(np.prod(info.shape)):
            raise ContractError(
                f"input {info.describe()} got an array of shape {arr.shape}"
            )
        out[info.name] = np.ascontiguousarray(
            arr.reshape(info.shape), dtype=NUMPY_DTYPES[info.dtype]
        )
    return out


__all__ = [
    "ACTION_CONTEXT",
    "ACTION_STEP",
    "VISION",
    "Geometry",
    "Session",
    "SessionSet",
    "TensorInfo",
    "bind_contracts",
    "cast_feeds",
]
