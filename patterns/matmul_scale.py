"""FuseMatMulScale: a product's multiplication by a constant runs on its PSUM eviction.

In: the Graph after the kernel raises (an attention the raise takes keeps its own scale).
Out: each fusable Mul removed, its MatMul writing the Mul's output with the factor recorded on
the MatMul (`MATMUL_SCALE`); a finding per fused pair (`nodes`, `host`: the MatMul, which
`validate --localize` charges with the Mul's output) and per MatMul whose Mul could not be
fused (`node`, `reason`).

Exported attention scales its scores after the product: `MatMul(q, kᵀ) → Mul(·, 1/√d)`
(docs/attention.md). Every MatMul lowering evicts each output tile from PSUM with one ScalarE
`Activation` whose `scale` operand multiplies for free, where the Mul on its own is a pass
over all the heads' scores (a VectorE instruction per head and row tile). The result is the
same number: the eviction computes the fp32 product of the fp32 accumulator and the fp32
factor, as the Mul did with the evicted value.

Pattern: MatMul → Mul by a one-element fp32 constant. Check: the product has no other
reader and is not a graph output, both tensors are fp32 and of one shape, the MatMul has no
factor yet. Rewrite: drop the Mul, the MatMul writes its output and carries the factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen.lower.matmul import MATMUL_SCALE
from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult, Statistic


@dataclass(frozen=True)
class FuseMatMulScale:
    name: str = "FuseMatMulScale"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        fused, findings = 0, []
        for node in graph.topological_order():
            if node not in graph.nx or not _is_matmul(graph, node):
                continue
            scale = _sole_scale(graph, node)
            if scale is None:
                continue
            mul, factor = scale
            reason = fusion_refusal(graph, node, mul)
            if reason is not None:
                findings.append({"node": node, "scale": mul, "reason": reason})
                continue
            _fuse(graph, node, mul, factor)
            findings.append({"nodes": [node, mul], "host": node, "fused": mul})
            fused += 1
        stats = [Statistic(self.name, "fused", "Scalar Muls fused into MatMul evictions", fused)]
        return PassResult(bool(fused), stats, findings)


def _is_matmul(graph: Graph, node: str) -> bool:
    data = graph.node(node)
    return data["op_type"] == "MatMul" and not data["domain"]


def _sole_scale(graph: Graph, node: str) -> tuple[str, float] | None:
    """(the Mul, its factor) when a Mul reads the product and a one-element constant."""
    product = graph.node(node)["outputs"][0]
    for consumer, _ in graph.consumers(product):
        data = graph.node(consumer)
        if data["op_type"] != "Mul" or data["domain"] or len(data["inputs"]) != 2:
            continue
        (other,) = [t for t in data["inputs"] if t != product] or [None]
        info = graph.tensors.get(other) if other else None
        if info is None or not info.is_const or math.prod(info.shape) != 1:
            continue
        value = np.asarray(info.const)
        if value.dtype != np.float32:
            continue
        return consumer, float(value.reshape(()))
    return None


def fusion_refusal(graph: Graph, node: str, mul: str) -> str | None:
    """Why the Mul cannot run on the MatMul's eviction; None when it can."""
    data = graph.node(node)
    product = data["outputs"][0]
    output = graph.node(mul)["outputs"][0]
    if MATMUL_SCALE in data["attrs"]:
        return "the MatMul already scales its product"
    if product in graph.outputs:
        return f"the MatMul's result {product!r} is a graph output"
    readers = graph.consumers(product)
    if len(readers) != 1:
        return f"the MatMul's result {product!r} has {len(readers)} readers"
    for tensor in (product, output):
        if graph.tensors[tensor].dtype is not Dtype.FP32:
            return f"{tensor!r} is {graph.tensors[tensor].dtype}, not fp32"
    if tuple(graph.tensors[product].shape) != tuple(graph.tensors[output].shape):
        return f"the Mul broadcasts {product!r} to another shape"
    return None


def _fuse(graph: Graph, node: str, mul: str, factor: float) -> None:
    data = graph.node(node)
    product = data["outputs"][0]
    output = graph.node(mul)["outputs"][0]
    graph.remove_node(mul)
    graph.rename_output(product, output)
    del graph.tensors[product]
    data["attrs"][MATMUL_SCALE] = factor
