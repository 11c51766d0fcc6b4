"""The emulating model raised to opset 13, where Cast reaches bfloat16.

Before opset 13 Cast has no bfloat16, so the oracle would round every bf16 activation with the
arithmetic form of `emulating.arithmetic_rounding` (two dozen elementwise ops, three of them
Pow). From opset 13 it is onnxruntime's own Cast pair, which rounds to nearest, ties to even,
bit for bit as the arithmetic form and the machine do (every float32 bit pattern checked,
docs/validation.md#rounding-cost). So when a model older than 13 rounds to bfloat16 in its
graph, the oracle's copy of it is raised to opset 13 first — only when every node means the
same there, one node for one node (the emulating model pairs its nodes with the graph's by
position):

- an op whose schema is the same at both opsets, or whose newer versions only add types or
  optional inputs and attributes whose defaults are the old behaviour (`SAME_AT_13`);
- Softmax, LogSoftmax and Hardmax, whose meaning changed at 13 (they coerced their input to 2-D
  at `axis`), where `axis` is the last axis: the same computation, the axis written out;
- Squeeze, Unsqueeze and ReduceSum, whose `axes` became an input at 13, and Split's `split`:
  the attribute moved to a constant input.

Anything else (Upsample, Pad-2, Clip-6, Slice-1, Dropout with a ratio attribute, a Softmax over
another axis, a shape not known) keeps the model at its own opset, and the arithmetic rounding.
Subgraphs (Loop, If, Scan bodies) are raised with the same rules.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper

CAST_OPSET = 13  # the first opset whose Cast takes bfloat16
IR_VERSION = 7  # the first IR version that may import opset 13

# op → the older schema versions whose nodes mean the same at opset 13, unchanged: the versions
# between add types (bfloat16 at 13, integers at 12), negative axes or indices, or optional
# inputs and attributes whose defaults are the older behaviour (ceil_mode, dilations, C of Gemm,
# select_last_index, DepthToSpace's mode, Resize's optional roi and scales, Clip's integer
# types, ...). onnxruntime computes each with the same kernel over those versions.
SAME_AT_13: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        (
            "Abs",
            "Ceil",
            "Exp",
            "Floor",
            "Log",
            "Neg",
            "Reciprocal",
            "Relu",
            "Sigmoid",
            "Sqrt",
            "Tanh",
            "Identity",
            "LRN",
            "Shape",
            "Size",
            "SpaceToDepth",
            "Tile",
            "Transpose",
            "Reshape",
            "Add",
            "Sub",
            "Mul",
            "Div",
        ),
        (1, 5, 6, 7),
    ),
    "Cast": (6, 9),
    "Clip": (11, 12),
    "Concat": (4, 11),
    "Constant": (9, 11, 12),
    "Conv": (1,),
    "ConvTranspose": (1,),
    "AveragePool": (7, 10),
    "MaxPool": (8, 10, 11),
    "DepthToSpace": (1, 11),
    "DequantizeLinear": (10,),
    "QuantizeLinear": (10,),
    "Dropout": (12,),
    "Equal": (7, 11),
    "Greater": (7, 9),
    "Less": (7, 9),
    "Erf": (9,),
    "Expand": (8,),
    "Flatten": (9, 11),
    "Gather": (1, 11),
    "GatherElements": (11,),
    "GatherND": (11, 12),
    "Gemm": (9, 11),
    "IsNaN": (9,),
    "MatMul": (9,),
    "Max": (8, 12),
    "Min": (8, 12),
    "Mean": (8,),
    "Sum": (8,),
    "MeanVarianceNormalization": (9,),
    "Mod": (10,),
    "NonZero": (9,),
    "Pad": (11,),
    "Pow": (7, 12),
    "Sign": (9,),
    "Slice": (10, 11),
    "ArgMax": (1, 11, 12),
    "ArgMin": (1, 11, 12),
    "ReduceL1": (1, 11),
    "ReduceL2": (1, 11),
    "ReduceLogSum": (1, 11),
    "ReduceLogSumExp": (1, 11),
    "ReduceMax": (1, 11, 12),
    "ReduceMean": (1, 11),
    "ReduceMin": (1, 11, 12),
    "ReduceProd": (1, 11),
    "ReduceSumSquare": (1, 11),
    "Resize": (11,),
    "ScatterElements": (11,),
    "ScatterND": (11,),
    "TopK": (10,),
    "Scan": (9,),
    "If": (11,),
    "Loop": (11,),
}
_LAST_AXIS = ("Softmax", "LogSoftmax", "Hardmax")  # axis = the last: the same at 13
_AXES_INPUT = {"Squeeze": "axes", "Unsqueeze": "axes", "ReduceSum": "axes", "Split": "split"}


def _since(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset, "").since_version
    except Exception:  # no such op at that opset
        return None


def raised_to_cast_opset(
    model: onnx.ModelProto, rank: Callable[[str], int | None]
) -> onnx.ModelProto | None:
    """A copy of `model` importing opset 13, every node meaning what it meant (module
    docstring), or None when some node would not. `rank(tensor)`: a tensor's rank, None when
    not known (a Softmax's input)."""
    opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), 0)
    if not 0 < opset < CAST_OPSET:
        return None
    raised = onnx.ModelProto()
    raised.CopyFrom(model)
    if not _raise_graph(raised.graph, opset, rank):
        return None
    for entry in raised.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = CAST_OPSET
    raised.ir_version = max(raised.ir_version, IR_VERSION)
    return raised


def _raise_graph(graph: onnx.GraphProto, opset: int, rank) -> bool:
    """Raise `graph`'s nodes in place (module docstring); False at the first that cannot be."""
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                if not _raise_graph(sub, opset, rank):
                    return False
        if node.domain not in ("", "ai.onnx"):
            continue
        old, new = _since(node.op_type, opset), _since(node.op_type, CAST_OPSET)
        if old is None or new is None:
            return False
        if old == new or old in SAME_AT_13.get(node.op_type, ()):
            continue
        if node.op_type in _LAST_AXIS:
            if not _last_axis(node, rank):
                return False
        elif node.op_type in _AXES_INPUT:
            _attribute_to_input(graph, node, _AXES_INPUT[node.op_type])
        else:
            return False
    return True


def _last_axis(node: onnx.NodeProto, rank) -> bool:
    """Whether a Softmax-like node (opset < 13, default axis 1) normalises over its input's
    last axis; if so its axis is written out (the default at 13 is -1)."""
    size = rank(node.input[0]) if node.input else None
    if size is None or size < 1:
        return False
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    axis = axis + size if axis < 0 else axis
    if axis != size - 1:
        return False
    kept = [a for a in node.attribute if a.name != "axis"]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("axis", axis)])
    return True


def _attribute_to_input(graph: onnx.GraphProto, node: onnx.NodeProto, name: str) -> None:
    """An int-list attribute that became input 1 at opset 13 (the node's only input before),
    moved there as a constant."""
    found = next((a for a in node.attribute if a.name == name), None)
    if found is None:  # absent: the input is left out, which means the same
        return
    values = np.array(list(found.ints), np.int64)
    tensor = numpy_helper.from_array(values, f"{node.output[0]}::{name}")
    graph.initializer.append(tensor)
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.input.append(tensor.name)
