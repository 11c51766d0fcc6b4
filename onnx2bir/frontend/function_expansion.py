"""Ops with no lowering of their own, replaced by the function body the ONNX standard defines.

Many standard ops are defined by a function of other ops (the losses, Attention-23,
CausalConvWithState, Swish, MeanVarianceNormalization, ...): onnx's schema carries the body,
fixed or built for the node's attributes and input types (a context-dependent function). A
node of such an op that no lowering takes (`lowered`) is replaced by that body, its internal
tensors renamed under the node's name, before constants fold (docs/input_contracts.md#
function-bodies). onnxruntime runs its own kernel for the op: the validation compares the
two, so the expansion is checked like any lowering.

A body is used only when it reads the same under the model's opset as under the opset it was
written for (each op in it has the same definition at both), and has no subgraphs. A node
whose op has no usable body is left for the compiler to refuse by name.
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import AttributeProto, FunctionProto, NodeProto

from onnx2bir.frontend.opset_upgrade import default_opset

MAX_DEPTH = 4  # a body may use ops that have bodies themselves (losses use LogSoftmax, ...)


# Ops with a body that a pass consumes whole and must keep: the integer matmul raise
# (patterns/quant) and the attention raise and decomposition (patterns/attention).
KEPT_FOR_PASSES = frozenset({"DynamicQuantizeLinear", "Attention"})


# The op types the code generator lowers: its table registers them here when it is built
# (`onnx2bir.codegen.lower`), since the front end sits below it. None: nothing is expanded.
_LOWERED: frozenset[str] | None = None


def register_lowered(op_types) -> None:
    global _LOWERED
    _LOWERED = frozenset(op_types)


def kept_ops() -> frozenset[str] | None:
    """The ai.onnx ops never expanded: those lowered, folded or consumed by a pass (None
    when no code generator registered its ops)."""
    if _LOWERED is None:
        return None
    return _LOWERED | {"Constant", "Shape", "Size"} | KEPT_FOR_PASSES


def expansion_note(expanded: Counter) -> str | None:
    if not expanded:
        return None
    listing = ", ".join(f"{op} x{n}" for op, n in sorted(expanded.items()))
    return (
        f"{listing} replaced by the function body the ONNX standard defines (no lowering of "
        "its own; onnxruntime runs its own kernel, so the validation checks the body)"
    )


def expand_functions(model: onnx.ModelProto, lowered: frozenset[str] | None = None) -> Counter:
    """Replace (in place) each top-level ai.onnx node whose op is not in `lowered` (default
    `kept_ops()`) and has a usable function body; return the op types expanded, with counts."""
    lowered = kept_ops() if lowered is None else lowered
    if lowered is None:
        return Counter()
    opset = default_opset(model)
    expanded: Counter = Counter()
    for _ in range(MAX_DEPTH):
        pending = [
            n for n in model.graph.node if n.domain in ("", "ai.onnx") and n.op_type not in lowered
        ]
        if not pending:
            break
        types = _input_types(model) if pending else {}
        nodes, changed = [], False
        for node in model.graph.node:
            body = _body(node, opset, types) if node in pending else None
            if body is None:
                nodes.append(node)
                continue
            schema = onnx.defs.get_schema(node.op_type, opset, "")
            nodes.extend(_inlined(_with_default_attributes(node, schema), body))
            expanded[node.op_type] += 1
            changed = True
        if not changed:
            break
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return expanded


def _input_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}
    for init in graph.initializer:
        value = onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims)
        types.setdefault(init.name, value.type)
    return types


def _body(node: NodeProto, opset: int, types: dict[str, onnx.TypeProto]) -> FunctionProto | None:
    """The node's function body at the model's opset, or None when there is none usable."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None
    body = FunctionProto()
    plain = [v for v in schema.function_opset_versions if v <= opset]
    contextual = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if plain:
        body.ParseFromString(schema.get_function_with_opset_version(max(plain)))
    elif contextual:
        if any(name and name not in types for name in node.input):
            return None
        input_types = [
            (types[name] if name else onnx.TypeProto()).SerializeToString() for name in node.input
        ]
        try:
            built = schema.get_context_dependent_function_with_opset_version(
                max(contextual),
                _with_default_attributes(node, schema).SerializeToString(),
                input_types,
            )
        except Exception:  # the builder refuses these attributes or types
            return None
        body.ParseFromString(built)
    else:
        return None
    if not body.node or not _reads_alike(body, opset):
        return None
    return body


def _with_default_attributes(node: NodeProto, schema) -> NodeProto:
    copy = NodeProto()
    copy.CopyFrom(node)
    present = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in present and attr.default_value.name:
            copy.attribute.append(attr.default_value)
    return copy


def _reads_alike(body: FunctionProto, opset: int) -> bool:
    """Every body op has the same definition at the model's opset as at the body's own, and
    no body node has a subgraph."""
    written = next((e.version for e in body.opset_import if e.domain in ("", "ai.onnx")), opset)
    for inner in body.node:
        if inner.domain not in ("", "ai.onnx"):
            return False
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in inner.attribute):
            return False
        try:
            here = onnx.defs.get_schema(inner.op_type, opset, "").since_version
            there = onnx.defs.get_schema(inner.op_type, written, "").since_version
        except onnx.defs.SchemaError:
            return False
        if here != there:
            return False
    return True


def _inlined(node: NodeProto, body: FunctionProto) -> list[NodeProto]:
    """The body's nodes bound to the node: formal inputs and outputs to the node's tensors,
    internal tensors and node names under the node's name, attribute references resolved."""
    prefix = f"{node.name or node.op_type}/"
    names = {formal: "" for formal in body.input}
    names.update(zip(body.input, node.input, strict=False))
    for formal, actual in zip(body.output, node.output, strict=False):
        if actual:
            names[formal] = actual
    attributes = {a.name: a for a in node.attribute}

    def rename(tensor: str) -> str:
        if tensor == "":
            return ""
        return names.get(tensor, prefix + tensor)

    nodes = []
    for index, inner in enumerate(body.node):
        copy = NodeProto()
        copy.CopyFrom(inner)
        copy.name = prefix + (inner.name or f"{inner.op_type}_{index}")
        copy.domain = ""
        del copy.input[:], copy.output[:], copy.attribute[:]
        copy.input.extend(rename(t) for t in inner.input)
        copy.output.extend(rename(t) for t in inner.output)
        for attr in inner.attribute:
            if attr.ref_attr_name:
                if attr.ref_attr_name not in attributes:
                    continue  # the caller did not set it: the inner op's default applies
                bound = AttributeProto()
                bound.CopyFrom(attributes[attr.ref_attr_name])
                bound.name = attr.name
                copy.attribute.append(bound)
            else:
                copy.attribute.append(attr)
        nodes.append(copy)
    return nodes
