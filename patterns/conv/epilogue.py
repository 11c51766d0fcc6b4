"""FuseConvActivation: a Relu that only a convolution feeds runs on the conv's PSUM eviction.

In: the Graph after FoldConvLayoutBridges. Out: each fusable Relu removed, its convolution
writing the Relu's output with the activation recorded on the conv (`fused_activation`); a
finding per fused pair (`nodes`, `host`: the conv, which `validate --localize` then charges with
the Relu's output) and per conv whose Relu could not be fused (`node`, `reason`).

Every conv lowering that accumulates in PSUM evicts each output tile with one ScalarE
`Activation`, `func(psum + bias)`, so a following Relu costs nothing there, where on its own it
is a pass over the whole tensor: through DRAM for a large map, a read and a write of it
(docs/conv_selection.md#fused-activations). Relu is the one function fused: it commutes with
every rounding, so the value the device writes is the one the Relu node would have computed
from the conv's rounded output.

Pattern: Conv (generic, or a NativeKernel whose eviction takes a function) → Relu. Check:
the conv's result has no other reader and is not a graph output, both are fp32. Rewrite: drop
the Relu, the conv writes its output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen.lower.conv import FUSED_ACTIVATION
from onnx2bir.graph import Graph
from onnx2bir.kernels.conv.column_packing import (
    COLUMN_PACKING,
    COLUMN_PACKING_1,
    COLUMN_PACKING_IO10,
)
from onnx2bir.kernels.conv.depthwise import CONV2D_DEPTHWISE
from onnx2bir.kernels.conv.rep_nhwc import REP_NHWC
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult, Statistic

# The conv kernels that evict through one ScalarE activation (the 1-D depthwise kernel does
# not).
EVICTING_KERNELS = frozenset(
    {COLUMN_PACKING, COLUMN_PACKING_1, COLUMN_PACKING_IO10, REP_NHWC, CONV2D_DEPTHWISE}
)
FUSABLE = {"Relu": "relu"}  # ONNX op → ScalarE function (bir.enums.ActFunc)


@dataclass(frozen=True)
class FuseConvActivation:
    name: str = "FuseConvActivation"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        fused, findings = 0, []
        for node in graph.topological_order():
            if node not in graph.nx or not evicts_through_activation(graph, node):
                continue
            activation = _sole_activation(graph, node)
            if activation is None:
                continue
            reason = fusion_refusal(graph, node, activation)
            if reason is not None:
                findings.append({"node": node, "activation": activation, "reason": reason})
                continue
            _fuse(graph, node, activation)
            findings.append({"nodes": [node, activation], "host": node, "fused": activation})
            fused += 1
        stats = [Statistic(self.name, "fused", "Relus fused into conv evictions", fused)]
        return PassResult(bool(fused), stats, findings)


def evicts_through_activation(graph: Graph, node: str) -> bool:
    """Whether `node` is a conv whose lowering evicts PSUM through one ScalarE activation:
    a generic Conv, or a NativeKernel conv of EVICTING_KERNELS."""
    data = graph.node(node)
    if data["op_type"] == "Conv" and not data["domain"]:
        return True
    return data["op_type"] == "NativeKernel" and data["attrs"].get("func_name") in (
        EVICTING_KERNELS
    )


def _sole_activation(graph: Graph, node: str) -> str | None:
    """The Relu-like node reading the conv's result, when one does."""
    result = graph.node(node)["outputs"][0]
    for consumer, _ in graph.consumers(result):
        if graph.node(consumer)["op_type"] in FUSABLE:
            return consumer
    return None


def fusion_refusal(graph: Graph, node: str, activation: str) -> str | None:
    """Why the activation cannot run on the conv's eviction; None when it can."""
    data = graph.node(node)
    result = data["outputs"][0]
    if FUSED_ACTIVATION in _conv_attrs(data):
        return "the conv already applies an activation"
    if result in graph.outputs:
        return f"the conv's result {result!r} is a graph output"
    readers = graph.consumers(result)
    if len(readers) != 1:
        return f"the conv's result {result!r} has {len(readers)} readers"
    output = graph.node(activation)["outputs"][0]
    for tensor in (result, output):
        if graph.tensors[tensor].dtype is not Dtype.FP32:
            return f"{tensor!r} is {graph.tensors[tensor].dtype}, not fp32"
    return None


def _conv_attrs(data: dict) -> dict:
    if data["op_type"] == "NativeKernel":
        return json.loads(data["attrs"]["attrs"])
    return data["attrs"]


def _fuse(graph: Graph, node: str, activation: str) -> None:
    data = graph.node(node)
    function = FUSABLE[graph.node(activation)["op_type"]]
    result = data["outputs"][0]
    output = graph.node(activation)["outputs"][0]
    graph.remove_node(activation)
    graph.rename_output(result, output)
    del graph.tensors[result]
    if data["op_type"] == "NativeKernel":
        attrs = json.loads(data["attrs"]["attrs"])
        attrs[FUSED_ACTIVATION] = function
        data["attrs"]["attrs"] = json.dumps(attrs)
    else:
        data["attrs"][FUSED_ACTIVATION] = function
