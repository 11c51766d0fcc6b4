"""com.microsoft MatMulNBits as a dequantization and a MatMul (docs/quantization.md#nbits)."""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult

NBITS_VENDOR_OPS: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ExpandMatMulNBits:
    name: str = "ExpandMatMulNBits"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        return PassResult(False)
