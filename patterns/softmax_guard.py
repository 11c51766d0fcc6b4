"""FuseSoftmaxNanGuard: the NaN guard after a softmax runs in the softmax's last step.

In: the Graph after the kernel raises (a raised attention takes its guard as `nan_to_zero`).
Out: each fusable guard removed, its Softmax writing the guard's output and carrying the fill
value (`NAN_ROW_FILL`, onnx2bir/codegen/lower/softmax.py); a finding per fused guard
(`nodes`, `host`: the Softmax) and per guard that stays (`node`, `reason`).

PyTorch's exporters write `scaled_dot_product_attention` with `Where(IsNaN(P), 0, P)` after
its softmax, so a fully masked row gives zeros instead of NaN. As separate nodes the guard is
four passes over every head's scores (IsNaN's comparison and negation, Where's copy and
predicated copy). A softmax row is NaN whole or not at all (a NaN or +inf in the row, or a
row of −inf, makes the row's sum NaN and every element is divided by it), so the guard is a
per-row test of the sum and a fill of the rows that fail, in the softmax's own loop.

Pattern: Softmax → IsNaN → Where(·, c, P) with c a one-element constant and P the Softmax's
output. Check (`guard_refusal`): P is read only by the IsNaN and the Where and is not a graph
output, the IsNaN's result only by the Where, the Where writes P's shape and dtype (float),
the rows are at most ROW_CHUNK long, the Softmax has no fill yet. Rewrite: drop the IsNaN and
the Where; the Softmax writes the Where's output with c as its row fill.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnx2bir.codegen.lower.softmax import NAN_ROW_FILL, ROW_CHUNK
from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult, Statistic


@dataclass(frozen=True)
class FuseSoftmaxNanGuard:
    name: str = "FuseSoftmaxNanGuard"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        fused, findings = 0, []
        for node in graph.topological_order():
            if node not in graph.nx or not _is_op(graph, node, "Softmax"):
                continue
            guard = _guard_after(graph, node)
            if guard is None:
                continue
            isnan, where = guard
            reason = guard_refusal(graph, node, isnan, where)
            if reason is not None:
                findings.append({"node": where, "softmax": node, "reason": reason})
                continue
            _fuse(graph, node, isnan, where)
            findings.append({"nodes": [node, isnan, where], "host": node, "fused": where})
            fused += 1
        stats = [Statistic(self.name, "fused", "NaN guards fused into Softmax rows", fused)]
        return PassResult(bool(fused), stats, findings)


def _is_op(graph: Graph, node: str, op_type: str) -> bool:
    data = graph.node(node)
    return data["op_type"] == op_type and not data["domain"]


def _guard_after(graph: Graph, softmax: str) -> tuple[str, str] | None:
    """In: a Softmax. Out: (IsNaN, Where) of a guard `Where(IsNaN(P), c, P)` on its output."""
    probs = graph.node(softmax)["outputs"][0]
    for reader, _ in graph.consumers(probs):
        if not _is_op(graph, reader, "IsNaN"):
            continue
        test = graph.node(reader)["outputs"][0]
        for where, index in graph.consumers(test):
            inputs = graph.node(where)["inputs"]
            if _is_op(graph, where, "Where") and index == 0 and inputs[2] == probs:
                return reader, where
    return None


def _fill_value(graph: Graph, tensor: str) -> float | None:
    info = graph.tensors.get(tensor)
    if info is None or not info.is_const or math.prod(info.shape) != 1:
        return None
    return float(np.asarray(info.const).reshape(()))


def guard_refusal(graph: Graph, softmax: str, isnan: str, where: str) -> str | None:
    """Why the guard cannot run in the Softmax's rows; None when it can."""
    data = graph.node(softmax)
    probs, test = data["outputs"][0], graph.node(isnan)["outputs"][0]
    out = graph.node(where)["outputs"][0]
    if NAN_ROW_FILL in data["attrs"]:
        return "the Softmax fills its NaN rows already"
    if _fill_value(graph, graph.node(where)["inputs"][1]) is None:
        return "the value the Where puts in a NaN's place is not a one-element constant"
    if probs in graph.outputs or test in graph.outputs:
        return f"{probs!r} or {test!r} is a graph output"
    if {r for r, _ in graph.consumers(probs)} != {isnan, where}:
        return f"the Softmax's result {probs!r} has other readers"
    if [r for r, _ in graph.consumers(test)] != [where]:
        return f"the IsNaN's result {test!r} has other readers"
    source, result = graph.tensors[probs], graph.tensors[out]
    if tuple(source.shape) != tuple(result.shape) or source.dtype is not result.dtype:
        return "the Where writes another shape or dtype than the Softmax's"
    if not source.dtype.is_float:
        return f"{probs!r} is {source.dtype}"
    if source.shape and source.shape[-1] > ROW_CHUNK:
        return f"rows of {source.shape[-1]} are longer than {ROW_CHUNK}"
    return None


def _fuse(graph: Graph, softmax: str, isnan: str, where: str) -> None:
    data = graph.node(softmax)
    probs = data["outputs"][0]
    out = graph.node(where)["outputs"][0]
    fill = _fill_value(graph, graph.node(where)["inputs"][1])
    test = graph.node(isnan)["outputs"][0]
    graph.remove_node(where)
    graph.remove_node(isnan)
    graph.rename_output(probs, out)
    graph.tensors.pop(probs, None)
    graph.tensors.pop(test, None)
    data["attrs"][NAN_ROW_FILL] = fill
