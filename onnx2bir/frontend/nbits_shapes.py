"""The output shape of com.microsoft MatMulNBits, which onnx's shape inference cannot give.

Y = A · dequantize(B): A [..., K] gives Y [..., N] in A's element type, N the node's attribute
(onnxruntime's contrib schema, docs/quantization.md#nbits). `add_nbits_shapes` writes that type
into the model's value_info for every MatMulNBits output that has none yet, so the next round
of inference carries it on (`vendor_shapes.add_vendor_shapes` calls it each round).
"""

from __future__ import annotations

import onnx

MS_DOMAIN = "com.microsoft"


def matmul_nbits_type(node: onnx.NodeProto, a_type: onnx.TypeProto) -> onnx.TypeProto | None:
    """Y's type for A's type `a_type`; None when A has no rank or the node has no N."""
    n = next((attr.i for attr in node.attribute if attr.name == "N"), None)
    tensor = a_type.tensor_type
    if n is None or not tensor.HasField("shape") or not tensor.shape.dim:
        return None
    out = onnx.TypeProto()
    out.CopyFrom(a_type)
    dims = out.tensor_type.shape.dim
    dims[len(dims) - 1].Clear()
    dims[len(dims) - 1].dim_value = int(n)
    return out


def add_nbits_shapes(model: onnx.ModelProto, types: dict[str, onnx.TypeProto]) -> bool:
    """Give each unshaped MatMulNBits output its type (module docstring); `types` (tensor →
    known type) is updated with them. True if any."""
    changed = False
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.domain != MS_DOMAIN or not node.output:
            continue
        out = node.output[0]
        if out in types or not node.input or node.input[0] not in types:
            continue
        found = matmul_nbits_type(node, types[node.input[0]])
        if found is None:
            continue
        model.graph.value_info.append(onnx.helper.make_value_info(out, found))
        types[out] = found
        changed = True
    return changed
