"""Convolutions and matmuls on 8-bit integers, exact on the PE array (docs/quantization.md)."""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult

INTEGER_VENDOR_OPS: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RaiseIntegerMatmuls:
    name: str = "RaiseIntegerMatmuls"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        return PassResult(False)
