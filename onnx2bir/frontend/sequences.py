"""Sequence and optional values whose contents are known at compile time, replaced by tensors.

The machine has tensors only. An ONNX sequence whose length and every position are known at
compile time (the usual case: positions are constants) is a list of tensor names, and an
optional whose presence is known is a tensor name or nothing. This pass walks the top-level
graph in order, keeps that list for each sequence value and that name for each optional, and
rewrites every node that makes or reads one into tensor ops (docs/input_contracts.md#
sequences-and-optionals):

    SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceErase   the list changes, no node
    SequenceAt, OptionalGetElement, Identity of a tensor              Identity of the element
    SequenceLength, OptionalHasElement                                a Constant
    SplitToSequence        Split (+ Squeeze per part when keepdims=0 and no split is given)
    ConcatFromSequence     Concat (Unsqueeze per element first when new_axis=1)
    SequenceMap            the body inlined once per element

It runs on the ModelProto before function bodies are expanded and constants fold. onnxruntime
runs the original model, so the validation checks the rewrite.

Each rule is a pattern (the op type), a check that returns the reason it cannot apply, and a
rewrite. A model with any reason left is not rewritten: it is refused as before (exit 1,
`refuse_unsupported_types`) with the reasons added. A graph input or output that is itself a
sequence or an optional is such a reason: the program's interface is tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, NodeProto, helper, numpy_helper

from onnx2bir.errors import CompileError
from onnx2bir.frontend.opset_upgrade import default_opset

SEQUENCE_OPS = frozenset(
    {
        "SequenceEmpty",
        "SequenceConstruct",
        "SequenceInsert",
        "SequenceErase",
        "SequenceAt",
        "SequenceLength",
        "SplitToSequence",
        "ConcatFromSequence",
        "SequenceMap",
    }
)
OPTIONAL_OPS = frozenset({"Optional", "OptionalHasElement", "OptionalGetElement"})
MAX_CONE = 64  # nodes evaluated to find one position's value


class Unknown(Exception):
    """A rule's check failed: the message is the reason, naming the node."""


@dataclass
class _State:
    """In: the model's constants, static shapes and opset. Out: the emitted nodes and
    initializers, the list of every sequence and the element of every optional."""

    opset: int
    constants: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...] | None]
    producers: dict[str, NodeProto]
    used: set[str]
    seqs: dict[str, list[str]] = field(default_factory=dict)
    opts: dict[str, str | None] = field(default_factory=dict)
    nodes: list[NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    emitted: set[str] = field(default_factory=set)  # node names this pass made
    unmade: dict[str, str] = field(default_factory=dict)  # element: why no node makes it

    def fresh(self, base: str) -> str:
        name, suffix = base, 1
        while name in self.used:
            name, suffix = f"{base}_{suffix}", suffix + 1
        self.used.add(name)
        return name

    def emit(self, op: str, inputs, outputs, name: str, **attrs) -> None:
        node = helper.make_node(op, list(inputs), list(outputs), name=self.fresh(name), **attrs)
        self.nodes.append(node)
        self.emitted.add(node.name)

    def constant_input(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(value, name))
        self.constants[name] = value
        return name

    def alias(self, source: str, target: str, node: NodeProto) -> None:
        """`target` is the same value as `source`: a sequence, an optional or a tensor."""
        if source in self.seqs:
            self.seqs[target] = list(self.seqs[source])
        elif source in self.opts:
            self.opts[target] = self.opts[source]
        else:
            self.emit("Identity", [source], [target], f"{node.name}/identity")


def rewrite_static_sequences(model: onnx.ModelProto) -> str | None:
    """In: a checked model with static input shapes. Out: the model rewritten in place with
    no sequence or optional value, and the note that says what was replaced (None when the
    model has none). Raises CompileError (exit 1) with every reason when some value is not
    known at compile time; the model is then left as it was."""
    graph = model.graph
    if not _has_sequences(model):
        return None
    reasons = _interface_reasons(graph)
    state = None
    if not reasons:
        state = _state(model)
        try:
            _walk(list(graph.node), state)
        except Unknown as exc:
            reasons.append(str(exc))
    if reasons:
        _refuse(model, reasons)
    seq_names, opt_names = list(state.seqs), list(state.opts)
    live = _live(state, {o.name for o in graph.output})
    read = {t for n in live for t in n.input} | {o.name for o in graph.output}
    if unmade := [reason for t, reason in state.unmade.items() if t in read]:
        _refuse(model, unmade[:1])
    del graph.node[:]
    graph.node.extend(live)
    graph.initializer.extend(state.initializers)
    gone = set(seq_names) | set(opt_names)
    kept_info = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return _note(state)


def _has_sequences(model: onnx.ModelProto) -> bool:
    graph = model.graph
    if any(n.op_type in SEQUENCE_OPS | OPTIONAL_OPS for n in graph.node):
        return True
    return any(v.type.WhichOneof("value") != "tensor_type" for v in [*graph.input, *graph.output])


def _interface_reasons(graph: onnx.GraphProto) -> list[str]:
    """Graph inputs and outputs that are sequences or optionals: they stay."""
    reasons = []
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            which = value.type.WhichOneof("value")
            if which == "sequence_type":
                what = "the tensors it holds are not known until run time"
            elif which == "optional_type":
                what = "whether it holds a value is not known until run time"
            else:
                continue
            if kind == "output":
                what = "the program's outputs are tensors"
            label = which.removesuffix("_type")
            reasons.append(f"{label} graph {kind} {value.name!r}: {what}")
    return reasons


def _refuse(model: onnx.ModelProto, reasons: list[str]) -> None:
    """The refusal of the types as before, with the reasons the rewrite does not apply."""
    from onnx2bir.frontend.importer import refuse_unsupported_types

    listing = "; ".join(reasons)
    try:
        refuse_unsupported_types(model)
    except CompileError as exc:
        raise CompileError(f"{exc}; not rewritten into tensors: {listing}") from exc
    raise CompileError(f"sequence or optional values not rewritten into tensors: {listing}")


def _state(model: onnx.ModelProto) -> _State:
    graph = model.graph
    constants = {}
    for init in graph.initializer:
        try:
            constants[init.name] = numpy_helper.to_array(init)
        except Exception:  # an external or odd initializer: not a position
            continue
    inferred = onnx.shape_inference.infer_shapes(model).graph
    shapes = {}
    for value in [*inferred.input, *inferred.value_info, *inferred.output]:
        if value.type.WhichOneof("value") != "tensor_type":
            continue
        tensor_type = value.type.tensor_type
        dims = tensor_type.shape.dim if tensor_type.HasField("shape") else None
        static = dims is not None and all(d.HasField("dim_value") for d in dims)
        shapes[value.name] = tuple(d.dim_value for d in dims) if static else None
    for name, value in constants.items():
        shapes[name] = tuple(value.shape)
    producers = {out: node for node in graph.node for out in node.output if out}
    used = {t for node in graph.node for t in [*node.input, *node.output, node.name]}
    used |= {v.name for v in [*graph.input, *graph.output]} | set(constants)
    return _State(default_opset(model), constants, shapes, producers, used)


def _walk(nodes: list[NodeProto], state: _State) -> None:
    """Apply each node's rule in graph order; raise Unknown with the first reason."""
    for node in nodes:
        rule = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is not None:
            rule(node, state)
        elif node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            state.alias(node.input[0], node.output[0], node)
        else:
            held = [t for t in node.input if t in state.seqs or t in state.opts]
            if held:
                raise Unknown(
                    f"node {node.name!r} ({node.op_type}) reads {held[0]!r}, which holds "
                    "tensors only its op can take apart"
                )
            if node.op_type == "Constant":
                _record_constant(node, state)
            state.nodes.append(node)


# --- compile-time values --------------------------------------------------------------------


def _record_constant(node: NodeProto, state: _State) -> None:
    attr = node.attribute[0] if len(node.attribute) == 1 else None
    if attr is None:
        return
    value = helper.get_attribute_value(attr)
    if attr.name == "value":
        value = numpy_helper.to_array(value)
    elif attr.name in ("value_int", "value_ints"):
        value = np.array(value, np.int64)
    else:
        return
    state.constants[node.output[0]] = value
    state.shapes[node.output[0]] = tuple(value.shape)


def _value(name: str, state: _State) -> np.ndarray | None:
    """The tensor's value when it is known at compile time: a constant, or computed from
    constants and static shapes only (evaluated with onnx's reference runtime)."""
    if name in state.constants:
        return state.constants[name]
    cone, pending, leaves = [], [name], set()
    while pending:
        tensor = pending.pop()
        if tensor in state.constants or tensor in leaves:
            leaves.add(tensor)
            continue
        node = state.producers.get(tensor)
        if node is None or len(cone) >= MAX_CONE:
            return None
        if node in cone:
            continue
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            return None
        if any(t in state.seqs or t in state.opts for t in node.input):
            return None
        cone.append(node)
        if node.op_type == "Shape" and state.shapes.get(node.input[0]) is not None:
            continue  # its value is the static shape: the input's values are not read
        pending.extend(t for t in node.input if t)
    try:
        value = _evaluate(name, cone, leaves, state)
    except Exception:
        return None
    state.constants[name] = value
    return value


def _evaluate(name: str, cone: list[NodeProto], leaves: set[str], state: _State) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    order = [n for n in state.nodes if n in cone] or list(reversed(cone))
    inits = [numpy_helper.from_array(np.asarray(state.constants[t]), t) for t in sorted(leaves)]
    feeds, inputs = {}, []
    for node in order:  # a Shape's input: zeros of its static shape
        if node.op_type == "Shape" and node.input[0] not in leaves:
            tensor = node.input[0]
            feeds[tensor] = np.zeros(state.shapes[tensor], np.float32)
            inputs.append(helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    cone_graph = helper.make_graph(
        order, "cone", inputs, [helper.make_value_info(name, onnx.TypeProto())], inits
    )
    cone_model = helper.make_model(cone_graph, opset_imports=[helper.make_opsetid("", state.opset)])
    return np.asarray(ReferenceEvaluator(cone_model).run(None, feeds)[0])


def _position(node: NodeProto, index: int, state: _State, default: int | None) -> int:
    """The node's position input (`default` when absent), known at compile time or Unknown."""
    if len(node.input) <= index or not node.input[index]:
        if default is None:
            raise Unknown(f"node {node.name!r} ({node.op_type}) has no position")
        return default
    value = _value(node.input[index], state)
    if value is None:
        raise Unknown(
            f"node {node.name!r} ({node.op_type}): position {node.input[index]!r} is not known "
            "until run time"
        )
    return int(np.asarray(value).reshape(()))


def _elements(node: NodeProto, index: int, state: _State) -> list[str]:
    name = node.input[index]
    if name not in state.seqs:
        raise Unknown(
            f"node {node.name!r} ({node.op_type}): sequence {name!r} is not built in the graph"
        )
    return state.seqs[name]


def _in_range(node: NodeProto, pos: int, low: int, high: int) -> int:
    """`pos` checked against [low, high], negative positions counted from the end."""
    if not low <= pos <= high:
        raise Unknown(
            f"node {node.name!r} ({node.op_type}): position {pos} is outside [{low}, {high}]"
        )
    return pos - low if pos < 0 else pos


# --- the rules ------------------------------------------------------------------------------


def _sequence_empty(node: NodeProto, state: _State) -> None:
    state.seqs[node.output[0]] = []


def _sequence_construct(node: NodeProto, state: _State) -> None:
    state.seqs[node.output[0]] = list(node.input)


def _sequence_insert(node: NodeProto, state: _State) -> None:
    elements = list(_elements(node, 0, state))
    n = len(elements)
    pos = _in_range(node, _position(node, 2, state, n), -n, n)
    elements.insert(pos, node.input[1])
    state.seqs[node.output[0]] = elements


def _sequence_erase(node: NodeProto, state: _State) -> None:
    elements = list(_elements(node, 0, state))
    n = len(elements)
    pos = _in_range(node, _position(node, 1, state, -1), -n, n - 1)
    del elements[pos]
    state.seqs[node.output[0]] = elements


def pick(elements: list[str], pos: int) -> str:
    """The element at `pos` (already in range): the one place SequenceAt indexes."""
    return elements[pos]


def _sequence_at(node: NodeProto, state: _State) -> None:
    elements = _elements(node, 0, state)
    n = len(elements)
    pos = _in_range(node, _position(node, 1, state, None), -n, n - 1)
    state.alias(pick(elements, pos), node.output[0], node)


def _sequence_length(node: NodeProto, state: _State) -> None:
    n = len(_elements(node, 0, state))
    value = np.array(n, np.int64)
    state.emit(
        "Constant",
        [],
        [node.output[0]],
        f"{node.name}/length",
        value=numpy_helper.from_array(value),
    )
    state.constants[node.output[0]] = value


def _split_to_sequence(node: NodeProto, state: _State) -> None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    shape = state.shapes.get(node.input[0])
    if shape is None:
        raise Unknown(f"node {node.name!r} (SplitToSequence): the shape of its input is unknown")
    axis = attrs.get("axis", 0)
    axis = axis + len(shape) if axis < 0 else axis
    size = shape[axis]
    split_name = node.input[1] if len(node.input) > 1 and node.input[1] else None
    squeeze = split_name is None and not attrs.get("keepdims", 1)
    split_input = None
    if split_name is None:
        sizes = [1] * size
    else:
        split = _value(split_name, state)
        if split is None:
            split_shape = state.shapes.get(split_name)
            if split_shape is None or len(split_shape) != 1:
                raise Unknown(
                    f"node {node.name!r} (SplitToSequence): split {split_name!r} is not known "
                    "until run time, nor how many parts it makes"
                )
            sizes, split_input = [None] * split_shape[0], split_name
        elif split.ndim == 0:
            step = int(split)
            sizes = [step] * (size // step) + ([size % step] if size % step else [])
        else:
            sizes = [int(s) for s in split]
    parts = [state.fresh(f"{node.name}/part_{i}") for i in range(len(sizes))]
    state.seqs[node.output[0]] = parts
    if not parts:
        return
    pieces = [state.fresh(f"{p}/kept") for p in parts] if squeeze else parts
    if split_input is None:
        if state.opset >= 13:
            split_input = state.constant_input(f"{node.name}/split", np.array(sizes, np.int64))
        else:
            state.emit("Split", [node.input[0]], pieces, f"{node.name}/split", axis=axis,
                       split=sizes)  # fmt: skip
            split_input = ""
    elif state.opset < 13:  # no Split can make the parts: a reason if any is read
        reason = (
            f"node {node.name!r} (SplitToSequence): split {split_name!r} is not known until run "
            f"time, and Split-{state.opset} takes its sizes as an attribute"
        )
        state.unmade.update(dict.fromkeys(parts, reason))
        return
    if split_input:
        state.emit("Split", [node.input[0], split_input], pieces, f"{node.name}/split", axis=axis)
    if squeeze:
        for piece, part in zip(pieces, parts, strict=True):
            _squeeze_like("Squeeze", piece, part, axis, node, state)


def _squeeze_like(op: str, source: str, target: str, axis: int, node, state: _State) -> None:
    """Squeeze or Unsqueeze one axis, written for the model's opset."""
    if state.opset >= 13:
        axes = state.constant_input(f"{node.name}/axes", np.array([axis], np.int64))
        state.emit(op, [source, axes], [target], f"{node.name}/{op.lower()}")
    else:
        state.emit(op, [source], [target], f"{node.name}/{op.lower()}", axes=[axis])


def _concat_from_sequence(node: NodeProto, state: _State) -> None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    elements = _elements(node, 0, state)
    if not elements:
        raise Unknown(f"node {node.name!r} (ConcatFromSequence): the sequence is empty")
    axis = attrs["axis"]
    if attrs.get("new_axis", 0):
        lifted = []
        for element in elements:
            target = state.fresh(f"{node.name}/{element}/lifted")
            _squeeze_like("Unsqueeze", element, target, axis, node, state)
            lifted.append(target)
        elements = lifted
    state.emit("Concat", elements, [node.output[0]], f"{node.name}/concat", axis=axis)


def _sequence_map(node: NodeProto, state: _State) -> None:
    body = helper.get_attribute_value(next(a for a in node.attribute if a.name == "body"))
    lengths = {len(state.seqs[t]) for t in node.input if t in state.seqs}
    if node.input[0] not in state.seqs or len(lengths) != 1:
        raise Unknown(
            f"node {node.name!r} (SequenceMap): its sequences are not built in the graph or "
            "differ in length"
        )
    n = lengths.pop()
    for inner in body.node:
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in inner.attribute):
            raise Unknown(f"node {node.name!r} (SequenceMap): its body has subgraphs")
    outputs: list[list[str]] = [[] for _ in body.output]
    for i in range(n):
        names = {}
        for formal, actual in zip(body.input, node.input, strict=False):
            names[formal.name] = state.seqs[actual][i] if actual in state.seqs else actual
        prefix = f"{node.name}/{i}/"
        for init in body.initializer:
            value = numpy_helper.to_array(init)
            names[init.name] = state.constant_input(prefix + init.name, value)
        local = {t for inner in body.node for t in inner.output if t}
        for t in local:
            names[t] = state.fresh(prefix + t)

        def rename(t: str, names=names) -> str:
            return names.get(t, t) if t else ""

        copies = []
        for index, inner in enumerate(body.node):
            copy = NodeProto()
            copy.CopyFrom(inner)
            copy.name = state.fresh(prefix + (inner.name or f"{inner.op_type}_{index}"))
            del copy.input[:], copy.output[:]
            copy.input.extend(rename(t) for t in inner.input)
            copy.output.extend(rename(t) for t in inner.output)
            state.producers.update({t: copy for t in copy.output if t})
            copies.append(copy)
        _walk(copies, state)
        state.emitted.update(c.name for c in copies)
        for k, formal in enumerate(body.output):
            outputs[k].append(rename(formal.name))
    for k, out in enumerate(node.output):
        if out:
            state.seqs[out] = outputs[k]


def _optional(node: NodeProto, state: _State) -> None:
    source = node.input[0] if node.input and node.input[0] else None
    state.opts[node.output[0]] = source


def _has_element(node: NodeProto, state: _State) -> bool:
    source = node.input[0] if node.input and node.input[0] else None
    if source is None:
        return False
    if source in state.opts:
        return state.opts[source] is not None
    return True  # a tensor or a sequence


def _optional_has_element(node: NodeProto, state: _State) -> None:
    value = np.array(_has_element(node, state))
    state.emit(
        "Constant",
        [],
        [node.output[0]],
        f"{node.name}/present",
        value=numpy_helper.from_array(value),
    )
    state.constants[node.output[0]] = value


def _optional_get_element(node: NodeProto, state: _State) -> None:
    source = node.input[0]
    if source in state.opts:
        if state.opts[source] is None:
            raise Unknown(
                f"node {node.name!r} (OptionalGetElement): optional {source!r} is empty, and "
                "reading it is an error at run time"
            )
        source = state.opts[source]
    state.alias(source, node.output[0], node)


RULES = {
    "SequenceEmpty": _sequence_empty,
    "SequenceConstruct": _sequence_construct,
    "SequenceInsert": _sequence_insert,
    "SequenceErase": _sequence_erase,
    "SequenceAt": _sequence_at,
    "SequenceLength": _sequence_length,
    "SplitToSequence": _split_to_sequence,
    "ConcatFromSequence": _concat_from_sequence,
    "SequenceMap": _sequence_map,
    "Optional": _optional,
    "OptionalHasElement": _optional_has_element,
    "OptionalGetElement": _optional_get_element,
}


# --- the result -----------------------------------------------------------------------------


def _live(state: _State, outputs: set[str]) -> list[NodeProto]:
    """The nodes, less those this pass made whose results nothing reads (a Split whose parts
    only a SequenceLength counted)."""
    nodes = list(state.nodes)
    while True:
        read = {t for n in nodes for t in n.input} | outputs
        kept = [n for n in nodes if n.name not in state.emitted or any(o in read for o in n.output)]
        if len(kept) == len(nodes):
            return nodes
        nodes = kept


def _note(state: _State) -> str:
    parts = []
    if state.seqs:
        tensors = {t for elements in state.seqs.values() for t in elements}
        parts.append(
            f"sequence values {_listing(state.seqs)} replaced by their {len(tensors)} "
            "tensors (static positions)"
        )
    if state.opts:
        parts.append(
            f"optional values {_listing(state.opts)} replaced by their tensors or nothing "
            "(presence known at compile time)"
        )
    return "; ".join(parts)


def _listing(names) -> str:
    names = list(names)
    return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
