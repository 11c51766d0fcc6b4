"""FoldConvLayoutBridges: a conv kernel reads and writes the framework's tensors directly.

In: the Graph after TransformConvOp, whose NativeKernel convs are bridged to their kernels'
layouts by Transpose nodes (`<conv>/input_transpose`, `<conv>/output_transpose`,
docs/conv_selection.md#attributes). Out: each bridge folded into the kernel's attributes where
it can be: the kernel reads the Transpose's input (or writes its output) itself, its `in_perm`
(or `out_perm`) and shape now describing the framework's layout, and the Transpose is gone.

Every conv kernel addresses its tensors through the element strides of the canonical axes in
their stored layout (`kernels/conv/common.py`, `ConvKernelArgs.x_strides`/`y_strides`), so a
layout is a matter of strides to it; what a bridge costs is a whole tensor moved through DRAM
in small pieces (docs/conv_selection.md#bridges). An input bridge folds when the kernel is its
only reader and the input's rows and columns stay innermost (as every kernel's band loads
expect); an output bridge folds when the Transpose is the kernel result's only reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.op import Perm, invert_perm
from onnx2bir.patterns.conv.selection import KERNEL_NAMES
from onnx2bir.patterns.passes import PassResult, Statistic


@dataclass(frozen=True)
class FoldConvLayoutBridges:
    name: str = "FoldConvLayoutBridges"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        inputs = outputs = 0
        for node in graph.topological_order():
            if node not in graph.nx:  # a bridge folded already
                continue
            data = graph.node(node)
            if data["op_type"] != "NativeKernel" or data["attrs"].get("func_name") not in (
                KERNEL_NAMES
            ):
                continue
            inputs += _fold_input(graph, node)
            outputs += _fold_output(graph, node)
        stats = [
            Statistic(self.name, "folded_input_bridges", "Conv input transposes folded", inputs),
            Statistic(self.name, "folded_output_bridges", "Conv output transposes folded", outputs),
        ]
        return PassResult(bool(inputs or outputs), stats)


def _bridge(graph: Graph, tensor: str, name: str) -> dict | None:
    """The Transpose node `name` if it exists and is a plain 4-D transpose."""
    if name not in graph.nx:
        return None
    data = graph.node(name)
    if data["op_type"] != "Transpose" or len(data["attrs"].get("perm") or ()) != 4:
        return None
    return data


def _fold_input(graph: Graph, node: str) -> int:
    data = graph.node(node)
    x = data["inputs"][0]
    bridge = _bridge(graph, x, f"{node}/input_transpose")
    if bridge is None or graph.producer(x) != f"{node}/input_transpose":
        return 0
    if len(graph.consumers(x)) != 1 or x in graph.outputs:
        return 0
    attrs = json.loads(data["attrs"]["attrs"])
    perm: Perm = tuple(bridge["attrs"]["perm"])
    # Canonical axis i is axis in_perm[i] of the transposed tensor, which is axis
    # perm[in_perm[i]] of the source.
    in_perm = [perm[axis] for axis in attrs["in_perm"]]
    if in_perm[2:] != [2, 3]:
        return 0  # rows and columns must stay innermost
    source = bridge["inputs"][0]
    attrs["in_perm"] = in_perm
    attrs["input_shape"] = list(graph.tensors[source].shape)
    graph.remove_node(f"{node}/input_transpose")
    graph.redirect_uses(x, source)
    del graph.tensors[x]
    data["attrs"]["attrs"] = json.dumps(attrs)
    return 1


def _fold_output(graph: Graph, node: str) -> int:
    data = graph.node(node)
    result = data["outputs"][0]
    uses = graph.consumers(result)
    name = f"{node}/output_transpose"
    if len(uses) != 1 or uses[0][0] != name or result in graph.outputs:
        return 0
    bridge = _bridge(graph, result, name)
    if bridge is None:
        return 0
    attrs = json.loads(data["attrs"]["attrs"])
    inverse = invert_perm(tuple(bridge["attrs"]["perm"]))
    # Canonical axis i is axis out_perm[i] of the result; the Transpose puts result axis a at
    # axis inverse[a] of its output.
    attrs["out_perm"] = [inverse[axis] for axis in attrs["out_perm"]]
    final = bridge["outputs"][0]
    attrs["result_shape"] = list(graph.tensors[final].shape)
    graph.remove_node(name)
    graph.rename_output(result, final)
    del graph.tensors[result]
    data["attrs"]["attrs"] = json.dumps(attrs)
    return 1
