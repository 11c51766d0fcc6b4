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
reader and is not a graph output, both tensors are fp32 and of one shape. Rewrite: drop the
Mul, the MatMul writes its output and carries the factor (times any factor it has already).

The same factor may come on the operands instead: PyTorch's `scaled_dot_product_attention`,
as both exporters write it, scales q and kᵀ by √(1/√d) each before the product, and some
models divide q by √d. (a·c₁)(b·c₂) = (a b)·c₁c₂, so the second rule hoists them.
Pattern: a MatMul operand written by a Mul by (or a Div by) a one-element fp32 constant.
Check: the MatMul is the scaled operand's only reader, it is not a graph output, the Mul
does not broadcast it, all fp32. Rewrite: the MatMul reads the Mul's other input, the Mul
goes, and the factor (c, or 1/c) joins the MatMul's eviction factor. The product then differs
from the model's by fp32 rounding only, and under the matmul autocast the operand rounded to
bf16 is the unscaled one, as in an export that scales the scores.
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
        fused, hoisted, findings = 0, 0, []
        for node in graph.topological_order():
            if node not in graph.nx or not _is_matmul(graph, node):
                continue
            for scale_node, factor in _operand_scales(graph, node):
                reason = hoist_refusal(graph, node, scale_node)
                if reason is not None:
                    findings.append({"node": node, "scale": scale_node, "reason": reason})
                    continue
                _hoist(graph, node, scale_node, factor)
                findings.append({"nodes": [node, scale_node], "host": node, "fused": scale_node})
                hoisted += 1
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
        stats = [
            Statistic(self.name, "fused", "Scalar Muls fused into MatMul evictions", fused),
            Statistic(self.name, "hoisted", "Operand scales moved onto MatMul evictions", hoisted),
        ]
        return PassResult(bool(fused or hoisted), stats, findings)


def _is_matmul(graph: Graph, node: str) -> bool:
    data = graph.node(node)
    return data["op_type"] == "MatMul" and not data["domain"]


def _scalar_constant(graph: Graph, tensor: str | None) -> float | None:
    """In: a tensor name. Out: its value when it is a one-element fp32 constant, else None."""
    info = graph.tensors.get(tensor) if tensor else None
    if info is None or not info.is_const or math.prod(info.shape) != 1:
        return None
    value = np.asarray(info.const)
    return float(value.reshape(())) if value.dtype == np.float32 else None


def _operand_scales(graph: Graph, node: str) -> list[tuple[str, float]]:
    """In: a MatMul. Out: (the Mul or Div, its factor on the product) for each operand that a
    Mul by, or a Div by, a one-element fp32 constant writes."""
    found = []
    for operand in dict.fromkeys(graph.node(node)["inputs"][:2]):
        producer = graph.producer(operand)
        data = graph.node(producer) if producer else None
        if data is None or data["domain"] or len(data["inputs"]) != 2:
            continue
        first, second = data["inputs"]
        if data["op_type"] == "Mul":
            for const, other in ((second, first), (first, second)):
                value = _scalar_constant(graph, const)
                if value is not None and _scalar_constant(graph, other) is None:
                    found.append((producer, value))
                    break
        elif data["op_type"] == "Div":
            value = _scalar_constant(graph, second)
            if value and _scalar_constant(graph, first) is None:
                found.append((producer, 1.0 / value))
    return found


def _scaled_input(graph: Graph, scale_node: str) -> str:
    """The runtime input of a scalar Mul or Div (the one that is not the constant)."""
    first, second = graph.node(scale_node)["inputs"]
    return first if _scalar_constant(graph, first) is None else second


def hoist_refusal(graph: Graph, node: str, scale_node: str) -> str | None:
    """Why the operand scale cannot move onto the MatMul's eviction; None when it can."""
    scaled = graph.node(scale_node)["outputs"][0]
    source = _scaled_input(graph, scale_node)
    if scaled in graph.outputs:
        return f"the scaled operand {scaled!r} is a graph output"
    readers = graph.consumers(scaled)
    if [reader for reader, _ in readers] != [node]:
        return f"the scaled operand {scaled!r} has {len(readers)} reads"
    for tensor in (source, scaled, graph.node(node)["outputs"][0]):
        if graph.tensors[tensor].dtype is not Dtype.FP32:
            return f"{tensor!r} is {graph.tensors[tensor].dtype}, not fp32"
    if tuple(graph.tensors[source].shape) != tuple(graph.tensors[scaled].shape):
        return f"the {graph.node(scale_node)['op_type']} broadcasts {source!r} to another shape"
    return None


def _hoist(graph: Graph, node: str, scale_node: str, factor: float) -> None:
    scaled = graph.node(scale_node)["outputs"][0]
    source = _scaled_input(graph, scale_node)
    graph.remove_node(scale_node)
    graph.redirect_uses(scaled, source)
    graph.tensors.pop(scaled, None)
    attrs = graph.node(node)["attrs"]
    attrs[MATMUL_SCALE] = float(np.float32(attrs.get(MATMUL_SCALE, 1.0) * factor))


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
    data["attrs"][MATMUL_SCALE] = float(np.float32(data["attrs"].get(MATMUL_SCALE, 1.0) * factor))
