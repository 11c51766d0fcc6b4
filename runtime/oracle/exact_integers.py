"""MatMulInteger as the oracle runs it: exact integer arithmetic on every CPU.

onnxruntime's MatMulInteger of uint8 by int8 (what `quantize_dynamic` writes: uint8
activations from DynamicQuantizeLinear, int8 weights) goes through MLAS's u8s8 GEMM. On an
x86-64 CPU without VNNI, that kernel forms pair sums a[k]·b[k] + a[k+1]·b[k+1] of the raw
operands in int16 with saturation (`vpmaddubsw`), so an output whose pair of products passes
32767 comes out short — measured on distilbert-style encoders under an emulated Haswell:
1 to 65 elements of half the MatMulIntegers, off by up to 4183. With VNNI (`vpdpbusd`) the
same kernel is exact. ONNX asks for exact int32 products and sums, so the oracle must not
depend on which CPU it runs on (docs/quantization.md#oracle-integers).

In: a model. Out: the same model with every MatMulInteger (subgraphs included) replaced by

    Cast(A, double) − Cast(a_zero_point, double)          each within ±255
    Cast(B, double) − Cast(b_zero_point, double)
    Cast(MatMul(·, ·), int32)                              writes the node's own output

Every product is an integer of magnitude below 2^16 and every partial sum below 2^53 for any
reduction shorter than 2^37, so double arithmetic computes the exact integer result in any
summation order, and the Cast to int32 is exact (ONNX lets only the int32 accumulation
overflow; a sum past 2^31 needs K > 33,000 at the extreme operands). A node whose A zero
point is not known to hold one value (per-row, which onnxruntime refuses anyway) is left as
it is. ConvInteger is left as it is too: onnxruntime computes it exactly with and without
VNNI (measured on the same emulated CPU, every product at its largest).
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx
from onnx import TensorProto, helper

SUFFIX = "::exact"  # names of the tensors and nodes a replacement adds: <output>::exact/<part>
_OP = "MatMulInteger"
_MARKER = _OP.encode()


def needs_rewrite(data: bytes) -> bool:
    """Whether serialised model `data` may hold a MatMulInteger (a byte search: a model
    without one is never parsed)."""
    return _MARKER in data


def exact_matmul_integers(model: onnx.ModelProto) -> int:
    """Replace every MatMulInteger of `model`, in place, by its exact double form (module
    docstring). Out: how many were replaced."""
    return _rewrite_graph(model.graph)


def prepared(
    model: onnx.ModelProto | bytes | str | Path,
) -> tuple[onnx.ModelProto | bytes | str | Path, Path | None]:
    """In: a model as onnxruntime sessions take it. Out: the model to run — a rewritten copy
    when it holds a MatMulInteger, else the model itself — and, for a rewritten file, its
    folder (where its external data stays)."""
    if isinstance(model, onnx.ModelProto):
        if not any(_holds_op(g) for g in _graphs(model.graph)):
            return model, None
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        exact_matmul_integers(copy)
        return copy, None
    if isinstance(model, bytes):
        if not needs_rewrite(model):
            return model, None
        proto = onnx.load_from_string(model)
        exact_matmul_integers(proto)
        return proto, None
    path = Path(model)
    if not needs_rewrite(path.read_bytes()):
        return model, None
    proto = onnx.load(str(path), load_external_data=False)
    exact_matmul_integers(proto)
    return proto, path.resolve().parent


def _graphs(graph: onnx.GraphProto):
    """`graph` and every subgraph in it, depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


def _holds_op(graph: onnx.GraphProto) -> bool:
    return any(node.op_type == _OP and node.domain in ("", "ai.onnx") for node in graph.node)


def _rewrite_graph(graph: onnx.GraphProto, outer: dict[str, int | None] | None = None) -> int:
    """Replace the MatMulIntegers of `graph` and of its subgraphs (which also see `graph`'s
    tensors, and `outer`'s: the enclosing scopes'); returns the count."""
    sizes = {**(outer or {}), **_static_sizes(graph)}
    count = 0
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                count += _rewrite_graph(attr.g, sizes)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                count += sum(_rewrite_graph(sub, sizes) for sub in attr.graphs)
    rebuilt: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == _OP and node.domain in ("", "ai.onnx") and _one_a_zero(node, sizes):
            rebuilt.extend(_exact_nodes(node))
            count += 1
        else:
            rebuilt.append(node)
    del graph.node[:]
    graph.node.extend(rebuilt)
    return count


def _static_sizes(graph: onnx.GraphProto) -> dict[str, int | None]:
    """Element count of each tensor whose shape the graph states (initializers, inputs, value
    infos; a DynamicQuantizeLinear's zero point is a scalar by the spec); None when a
    dimension is symbolic."""
    sizes: dict[str, int | None] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        shape = value.type.tensor_type.shape
        if value.type.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]
            sizes[value.name] = None if None in dims else math.prod(dims)
    for init in graph.initializer:
        sizes[init.name] = math.prod(init.dims)
    for node in graph.node:
        if node.op_type == "DynamicQuantizeLinear" and len(node.output) > 2:
            sizes[node.output[2]] = 1
    return sizes


def _one_a_zero(node: onnx.NodeProto, sizes: dict[str, int | None]) -> bool:
    """A's zero point is absent or known to be one value (per tensor)."""
    zero = node.input[2] if len(node.input) > 2 else ""
    return not zero or sizes.get(zero) == 1


def _exact_nodes(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The double form of one MatMulInteger (module docstring), writing its output."""
    output = node.output[0]
    base = f"{output}{SUFFIX}"
    inputs = list(node.input) + ["", ""]
    nodes: list[onnx.NodeProto] = []
    centred = [
        _centred(nodes, f"{base}/{side}", inputs[index], inputs[index + 2])
        for side, index in (("a", 0), ("b", 1))
    ]
    product = f"{base}/product"
    nodes.append(helper.make_node("MatMul", centred, [product], name=product))
    nodes.append(
        helper.make_node("Cast", [product], [output], name=f"{base}/int32", to=TensorProto.INT32)
    )
    return nodes


def _centred(nodes: list[onnx.NodeProto], base: str, tensor: str, zero: str) -> str:
    """Append Cast(tensor, double) [− Cast(zero, double)]; returns the centred tensor."""
    wide = f"{base}/double"
    nodes.append(helper.make_node("Cast", [tensor], [wide], name=wide, to=TensorProto.DOUBLE))
    if not zero:
        return wide
    zero_wide, centred = f"{base}/zero_point", f"{base}/centred"
    nodes.append(
        helper.make_node("Cast", [zero], [zero_wide], name=zero_wide, to=TensorProto.DOUBLE)
    )
    nodes.append(helper.make_node("Sub", [wide, zero_wide], [centred], name=centred))
    return centred
