"""The QOperator ops that are not matmuls, and DynamicQuantizeLinear, as standard ops
(docs/quantization.md#qoperator)."""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult

QLINEAR_VENDOR_OPS: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ExpandQLinearOps:
    name: str = "ExpandQLinearOps"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        return PassResult(False)
