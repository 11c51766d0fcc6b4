"""Output shapes of the vendor ops onnx2bir lowers, which onnx's shape inference cannot give.

onnx knows no `com.microsoft` schema, so the output of such a node has no inferred shape and
neither has anything downstream of it. For the vendor ops with a lowering whose output has the
type and shape of their first input (com.microsoft RotaryEmbedding), `add_vendor_shapes` writes
that shape into the model's value_info, so the next round of inference carries it on
(`folding._infer` alternates the two until nothing changes).
"""

from __future__ import annotations

import onnx

from onnx2bir.frontend.nbits_shapes import add_nbits_shapes
from onnx2bir.op_traits import op_key, traits


def _typed(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    graph = model.graph
    types = {
        value.name: value.type
        for value in [*graph.input, *graph.value_info, *graph.output]
        if value.type.tensor_type.HasField("shape")
    }
    for init in graph.initializer:
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, init.dims))
    return types


def add_vendor_shapes(model: onnx.ModelProto) -> bool:
    """Give each unshaped output of a node whose op's output is like its first input (the op
    traits' `output_like_input`) that input's type; True if any."""
    types = _typed(model)
    changed = add_nbits_shapes(model, types)  # com.microsoft MatMulNBits: A [.., K] → [.., N]
    for node in model.graph.node:
        if not traits(op_key(node.op_type, node.domain)).output_like_input or not node.output:
            continue
        out = node.output[0]
        if out in types or not node.input or node.input[0] not in types:
            continue
        value = onnx.ValueInfoProto(name=out)
        value.type.CopyFrom(types[node.input[0]])
        model.graph.value_info.append(value)
        types[out] = value.type
        changed = True
    return changed
