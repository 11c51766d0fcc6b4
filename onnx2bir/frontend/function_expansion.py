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

A node a pass kept whole (`KEPT_FOR_PASSES`) and then could not take is expanded after the
import, in the Graph: `graph_node_body` is the check (the node's body, folded at the graph's
static shapes, or the reason there is none) and `splice_body` the rewrite. The attention
passes call them for an `Attention` that neither the raise nor the decomposition takes
(patterns/attention/decompose.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, FunctionProto, NodeProto, numpy_helper

from onnx2bir.bir.enums import Dtype
from onnx2bir.errors import UserError
from onnx2bir.frontend.attributes import attr_value
from onnx2bir.frontend.folding import drop_dead_nodes, fold_constants, static_shapes
from onnx2bir.frontend.opset_upgrade import default_opset
from onnx2bir.graph import Graph, TensorInfo

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


def inlined_body(
    node: NodeProto, opset: int, types: dict[str, onnx.TypeProto]
) -> list[NodeProto] | None:
    """The nodes of `node`'s function body at `opset`, bound to its tensors and named under
    its name (as `expand_functions` inlines it, one level deep), or None when it has no usable
    body; `types` gives its inputs' types (a context-dependent body is built for them)."""
    body = _body(node, opset, types)
    return None if body is None else _inlined(node, body)


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


# --- one node of a Graph -----------------------------------------------------------------------
@dataclass
class NodeBody:
    """A Graph node's function body, folded at the graph's shapes and ready to splice: nodes
    as (name, op type, inputs, outputs, attrs), every name under "<node>/", and the tensors
    the body adds (its intermediates and folded constants)."""

    node: str
    nodes: list[tuple[str, str, list[str], list[str], dict]] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    def op_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(op for _, op, _, _, _ in self.nodes).items()))


def graph_node_body(
    graph: Graph, node: str, lowered: frozenset[str] | None = None
) -> tuple[NodeBody | None, str | None]:
    """In: a Graph (static shapes, constants folded) and one of its ai.onnx nodes. Out:
    (its body, None), or (None, the reason it has no usable one). The body is the one
    `expand_functions` inlines, with the ops it uses expanded in turn unless in `lowered`
    (default `kept_ops()`), then folded like the import folds (shape arithmetic becomes
    constants). Nothing in the graph changes: `splice_body` does that."""
    data = graph.node(node)
    op = data["op_type"]
    lowered = kept_ops() if lowered is None else lowered
    if lowered is None:
        return None, "no code generator registered its ops"
    try:
        model, weights = _one_node_model(graph, data)
    except (ValueError, TypeError) as exc:
        return None, f"the node cannot be written back as ONNX ({exc})"
    expand_functions(model, lowered - {op})
    if any(n.op_type == op and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return None, f"{op} has no function body usable at opset {graph.opset}"
    try:
        model = drop_dead_nodes(fold_constants(model, weights))
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (UserError, onnx.shape_inference.InferenceError) as exc:
        return None, f"its function body does not infer: {exc}"
    return _graph_body(graph, node, inferred, weights)


def splice_body(graph: Graph, body: NodeBody) -> None:
    """Replace (in place) the body's node by the body, in the node's place in the order; the
    node's inputs that nothing reads any more (a constant folded into another) go."""
    data = graph.node(body.node)
    inputs = [t for t in data["inputs"] if t]
    with graph.in_place_of(body.node):
        graph.remove_node(body.node)
        graph.tensors.update(body.tensors)
        for name, op_type, ins, outs, attrs in body.nodes:
            graph.add_node(name, op_type, ins, outs, attrs)
    unread = [t for t in inputs if not graph.uses.get(t) and t not in graph.outputs]
    graph.remove_dead_producers(unread)
    for tensor in unread:
        if tensor not in graph.producers and tensor not in graph.inputs:
            graph.tensors.pop(tensor, None)


def _elem_type(dtype: Dtype) -> int:
    if dtype is Dtype.BF16:
        return onnx.TensorProto.BFLOAT16
    return onnx.helper.np_dtype_to_tensor_dtype(dtype.numpy)


def _one_node_model(graph: Graph, data) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The node alone as a model: its runtime inputs as graph inputs of their static shapes,
    its constant inputs as weights held aside (as the import holds them), the outputs the
    graph reads as graph outputs."""
    weights: dict[str, np.ndarray] = {}
    inputs = []
    for tensor in dict.fromkeys(t for t in data["inputs"] if t):
        info = graph.tensors[tensor]
        if info.const is not None:
            weights[tensor] = np.asarray(info.const)
        inputs.append(
            onnx.helper.make_tensor_value_info(tensor, _elem_type(info.dtype), list(info.shape))
        )
    outputs = [
        onnx.helper.make_tensor_value_info(
            t, _elem_type(graph.tensors[t].dtype), list(graph.tensors[t].shape)
        )
        for t in data["outputs"]
        if t
    ]
    proto = onnx.helper.make_node(
        data["op_type"],
        list(data["inputs"]),
        list(data["outputs"]),
        name=data["name"],
        domain=data["domain"],
        **{k: _attr_proto_value(v) for k, v in data["attrs"].items()},
    )
    body = onnx.helper.make_graph([proto], data["name"], inputs, outputs)
    opset = [onnx.helper.make_opsetid("", graph.opset)]
    return onnx.helper.make_model(body, opset_imports=opset), weights


def _attr_proto_value(value):
    return numpy_helper.from_array(value) if isinstance(value, np.ndarray) else value


def _graph_body(
    graph: Graph, node: str, model: onnx.ModelProto, weights: dict[str, np.ndarray]
) -> tuple[NodeBody | None, str | None]:
    """The folded one-node model's nodes and new tensors, checked against the graph: every
    tensor has a static shape and a dtype the machine has, no name is taken, and each output
    the graph reads is written by a body node."""
    body = NodeBody(node)
    shapes = static_shapes(model)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]
    }
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    constants.update(weights)
    written = {t for n in model.graph.node for t in n.output if t}
    missing = [t for t in graph.node(node)["outputs"] if t and t not in written]
    if missing:
        return None, f"its function body computes {', '.join(missing)} at compile time"
    own = set(graph.node(node)["outputs"])
    for inner in model.graph.node:
        if inner.name in graph.nx:
            return None, f"node name {inner.name!r} of its function body is taken"
        taken = [t for t in inner.output if t in graph.tensors and t not in own]
        if taken:
            return None, f"tensor name {taken[0]!r} of its function body is taken"
        for tensor in [*inner.input, *inner.output]:
            if not tensor or tensor in graph.tensors or tensor in body.tensors:
                continue
            info, reason = _tensor_info(tensor, constants, shapes, types)
            if info is None:
                return None, reason
            body.tensors[tensor] = info
        attrs = {a.name: attr_value(a) for a in inner.attribute}
        body.nodes.append((inner.name, inner.op_type, list(inner.input), list(inner.output), attrs))
    return body, None


def _tensor_info(tensor, constants, shapes, types) -> tuple[TensorInfo | None, str | None]:
    """A body tensor as the Graph holds it, or the reason it cannot be held."""
    value = constants.get(tensor)
    if value is not None:
        np_dtype = np.asarray(value).dtype
    elif tensor in shapes and types.get(tensor):
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(types[tensor])
    else:
        return None, f"its function body gives {tensor!r} no static shape and type"
    try:
        dtype = Dtype.from_numpy(np_dtype)
    except ValueError:
        return None, (
            f"its function body computes {tensor!r} in {np_dtype}, which the machine has no "
            "dtype for"
        )
    if value is not None:
        return TensorInfo(tensor, tuple(np.shape(value)), dtype, value), None
    return TensorInfo(tensor, shapes[tensor], dtype), None
