"""A small, deterministic ``onnx.helper`` graph builder with the few blocks the tiny model needs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = ("molmoact2_ros.synth", "1")


class GraphBuilder:
    """Accumulates nodes and initializers; every generated name is deterministic."""

    def __init__(self, name: str, eps: float = 1e-6) -> None:
        self.name = name
        self.eps = eps
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0
        self._consts: dict[tuple, str] = {}

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    # -- primitives ------------------------------------------------------------------------------
    def const(self, value: np.ndarray | float | Sequence[int], name: str | None = None,
              dtype: type = np.float32) -> str:
        """An initializer; scalars and int vectors are shared by value."""
        arr = np.asarray(value, dtype=dtype)
        key = None
        if name is None and arr.size <= 8:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key in self._consts:
                return self._consts[key]
        tname = name or self._fresh("const")
        self.initializers.append(numpy_helper.from_array(arr.copy(order="C"), tname))
        if key is not None:
            self._consts[key] = tname
        return tname

    def ints(self, values: Sequence[int]) -> str:
        return self.const(list(values), dtype=np.int64)

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        """One node with one fresh output name."""
        return self.ops(op_type, *inputs, n_out=1, **attrs)[0]

    def ops(self, op_type: str, *inputs: str, n_out: int, **attrs) -> list[str]:
        """One node with ``n_out`` fresh output names (e.g. Split)."""
        outs = [self._fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs,
                                           name=self._fresh("n_" + op_type), **attrs))
        return outs

    def output(self, op_type: str, name: str, *inputs: str, **attrs) -> str:
        """A node whose output is a named graph output."""
        self.nodes.append(helper.make_node(op_type, list(inputs), [name],
                                           name=self._fresh("n_" + op_type), **attrs))
        return name

    # -- blocks ----------------------------------------------------------------------------------
    def matmul(self, x: str, weight: np.ndarray, name: str, bias: np.ndarray | None = None) -> str:
        y = self.op("MatMul", x, self.const(weight, name))
        return self.op("Add", y, self.const(bias, name + "_bias")) if bias is not None else y

    def rms(self, x: str, weight: np.ndarray | None = None, name: str = "") -> str:
        """RMSNorm over the last axis: ``x · 1/sqrt(mean(x²)+eps) [· w]``."""
        ms = self.op("ReduceMean", self.op("Mul", x, x), axes=[-1], keepdims=1)
        inv = self.op("Reciprocal", self.op("Sqrt", self.op("Add", ms, self.const(self.eps))))
        y = self.op("Mul", x, inv)
        return self.op("Mul", y, self.const(weight, name)) if weight is not None else y

    def silu(self, x: str) -> str:
        return self.op("Mul", x, self.op("Sigmoid", x))

    def swiglu(self, x: str, gate: np.ndarray, up: np.ndarray, down: np.ndarray, name: str) -> str:
        g = self.silu(self.matmul(x, gate, name + ".gate"))
        u = self.matmul(x, up, name + ".up")
        return self.matmul(self.op("Mul", g, u), down, name + ".down")

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.op("Reshape", x, self.ints(shape))

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        return self.op("Transpose", x, perm=list(perm))

    def rope(self, x: str, cos: str, sin: str, head_dim: int) -> str:
        """Half-split rotation ``x·cos + [−x2, x1]·sin`` over the last axis."""
        half = head_dim // 2
        x1 = self.op("Slice", x, self.ints([0]), self.ints([half]), self.ints([-1]))
        x2 = self.op("Slice", x, self.ints([half]), self.ints([head_dim]), self.ints([-1]))
        rot = self.op("Concat", self.op("Neg", x2), x1, axis=-1)
        return self.op("Add", self.op("Mul", x, cos), self.op("Mul", rot, sin))

    def attention(self, q: str, k: str, v: str, scale: float, bias: str | None = None,
                  rank: int = 4) -> str:
        """softmax(q·kᵀ·scale + bias)·v on rank-``rank`` [..., T, d] tensors."""
        k_t = self.transpose(k, [*range(rank - 2), rank - 1, rank - 2])
        scores = self.op("Mul", self.op("MatMul", q, k_t), self.const(scale))
        if bias is not None:
            scores = self.op("Add", scores, bias)
        return self.op("MatMul", self.op("Softmax", scores, axis=-1), v)

    # -- model -----------------------------------------------------------------------------------
    def model(self, inputs: Sequence[tuple[str, Sequence[int]]],
              outputs: Sequence[tuple[str, Sequence[int]]]) -> onnx.ModelProto:
        """A checked float32 model with fixed producer fields (byte-stable serialisation)."""
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name=PRODUCER[0], producer_version=PRODUCER[1])
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model
