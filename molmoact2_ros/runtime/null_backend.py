"""Null sessions: no compute, outputs of the real tensor sizes (for host-overhead benchmarks)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..bundle.variants import VariantSpec
from .session import TensorInfo

#: Real MolmoAct2-LIBERO geometry (host_glue.md §1): the sizes a null session pretends to have.
REAL_GEOMETRY = {
    "H": 2560, "KV": 1024, "L0": 9, "L1": 9, "L2": 9, "L3": 9, "L": 36, "AH": 8, "AD": 96
}


class NullSession:
    """Returns preallocated zero outputs of the contract's shapes; validates input names."""

    def __init__(self, name: str, inputs, outputs, dtype: str = "float32") -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self._out = {o.name: np.zeros(o.shape, np.dtype(o.dtype)) for o in self.outputs}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [i.name for i in self.inputs if i.name not in feeds]
        if missing:
            raise KeyError(f"{self.name}: missing inputs {missing}")
        return dict(self._out)

    def close(self) -> None:
        self._out = {}


def null_sessions(
    variant: VariantSpec,
    *,
    euler_in_graph: bool = True,
    geometry: Mapping[str, int] = REAL_GEOMETRY,
    dtype: str = "float32",
) -> dict[str, NullSession]:
    """One null session per component with fully bound real shapes."""
    dims = {**variant.expected_dims(), **geometry}
    sessions = {}
    for name, contract in variant.contracts(euler_in_graph=euler_in_graph).items():
        def concrete(specs):
            return [
                TensorInfo(
                    s.name,
                    tuple(d if isinstance(d, int) else dims[d] for d in s.shape),
                    dtype,
                )
                for s in specs
            ]

        sessions[name] = NullSession(name, concrete(contract.inputs), concrete(contract.outputs))
    return sessions
