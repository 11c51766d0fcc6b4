"""Compile-time folding of an ONNX model: constants and shape arithmetic become values.

In: a checked ModelProto whose runtime inputs have static shapes, and the weights the importer
held aside (`importer.split_weights`). Out, from `fold_constants`: a copy in which every node
whose inputs are known at compile time (constants, Shape and Size of static shapes, Gather on
shapes, ConstantOfShape, Range, Concat of shapes, …) — except a DequantizeLinear of integer
weights, which the quantized matmuls read as integers — is evaluated and dropped, its value an
initializer, or a weight held aside when large. Shape nodes fold from the inferred static
shape; any other node is run, one at a time, by onnx's reference evaluator. A large
ConstantOfShape is never materialised: its consumers fold against a zero-stride view of its one
value, and the node stays for the code generator (a Memset) if anything reads it at run time.
`normalize_pool_ceil_mode` rewrites ceil_mode pools so that onnx's shape inference agrees with
PyTorch and onnxruntime; `static_shapes` reads every fully static shape of a model;
`drop_dead_nodes` removes nodes whose outputs nothing reads; `drop_identity_nodes` removes the
nodes that return their input as it is (Identity, a Cast to the input's own type, an inference
Dropout, a Reshape to the input's own shape). A failure of
shape inference becomes a `UserError` with its first line.
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx2bir.errors import UserError
from onnx2bir.frontend.vendor_shapes import add_vendor_shapes
from onnx2bir.op_traits import ELEMENT_MOVES

# Ops whose outputs vary between runs: never folded even with constant inputs.
_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}
_FOLD_MAX_ELEMENTS = 1 << 24
_LOG = logging.getLogger(__name__)  # `--verbose` shows why a node with constant inputs stays
# Initializers this large are held aside as numpy arrays while onnx checks and infers the rest
# (importer.split_weights); a folded value this large joins them.
WEIGHT_ELEMENTS = 4096


def normalize_pool_ceil_mode(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite ceil_mode=1 pools as ceil_mode=0 with extra high padding.

    With ceil_mode, PyTorch and onnxruntime drop a last window that would start inside the
    high padding; onnx's shape inference keeps it, so it disagrees with the shape PyTorch
    exports declare. Padding the high side enough for the floor formula to give the same
    count is exact for MaxPool (the pad is -inf) and for AveragePool without
    count_include_pad (padding is not counted); other pools are left alone.
    """
    pools = [
        n
        for n in model.graph.node
        if n.op_type in ("MaxPool", "AveragePool")
        and any(a.name == "ceil_mode" and a.i == 1 for a in n.attribute)
    ]
    if not pools:
        return model
    shapes = static_shapes(onnx.shape_inference.infer_shapes(model, strict_mode=False))
    for node in pools:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.input[0] not in shapes or attrs.get("auto_pad", "NOTSET") != "NOTSET":
            continue
        if node.op_type == "AveragePool" and attrs.get("count_include_pad", 0):
            continue
        spatial = shapes[node.input[0]][2:]
        rank = len(spatial)
        kernel = attrs["kernel_shape"]
        strides = attrs.get("strides") or [1] * rank
        dilations = attrs.get("dilations") or [1] * rank
        pads = list(attrs.get("pads") or [0] * (2 * rank))
        out_dims = list(shapes[node.input[0]][:2])
        for i in range(rank):
            span = (kernel[i] - 1) * dilations[i] + 1
            padded = spatial[i] + pads[i] + pads[i + rank]
            out = -(-(padded - span) // strides[i]) + 1
            if (out - 1) * strides[i] >= spatial[i] + pads[i]:
                out -= 1  # the last window would start in the high padding
            pads[i + rank] += max(0, (out - 1) * strides[i] + span - padded)
            out_dims.append(out)
        for value in model.graph.output:
            if value.name == node.output[0]:
                dims = value.type.tensor_type.shape.dim
                del dims[:]
                for size in out_dims:
                    dims.add().dim_value = size
        for attr in list(node.attribute):
            if attr.name in ("ceil_mode", "pads"):
                node.attribute.remove(attr)
        node.attribute.extend(
            [onnx.helper.make_attribute("pads", pads), onnx.helper.make_attribute("ceil_mode", 0)]
        )
    for value in list(model.graph.value_info):
        if value.name in {n.output[0] for n in pools}:
            model.graph.value_info.remove(value)
    return model


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference, alternated with the vendor ops' shapes it cannot give
    (`vendor_shapes.add_vendor_shapes`) until those stop changing."""
    for _ in range(len(model.graph.node) + 1):
        try:
            model = onnx.shape_inference.infer_shapes(
                model, check_type=True, strict_mode=True, data_prop=True
            )
        except Exception as exc:
            text = str(exc).strip()
            first_line = text.splitlines()[0] if text else type(exc).__name__
            raise UserError(f"shape inference failed: {first_line}") from exc
        if not add_vendor_shapes(model):
            break
    return model


def static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    shapes = {}
    graph = model.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            continue
        dims = tensor_type.shape.dim
        if all(dim.HasField("dim_value") for dim in dims):
            shapes[value.name] = tuple(dim.dim_value for dim in dims)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


MAX_FOLD_ROUNDS = 8


def fold_constants(
    model: onnx.ModelProto, weights: dict[str, np.ndarray] | None = None
) -> onnx.ModelProto:
    """Fold, re-infer shapes, and fold again until nothing changes.

    A Shape node whose input only gets a static shape once earlier values are folded (e.g. a
    Split by folded sizes) folds in the next round.
    """
    weights = {} if weights is None else weights
    for _ in range(MAX_FOLD_ROUNDS):
        model, changed = _fold_once(model, weights)
        if not changed:
            break
    return model


def _fold_once(
    model: onnx.ModelProto, weights: dict[str, np.ndarray]
) -> tuple[onnx.ModelProto, bool]:
    """Evaluate every node whose inputs are known at compile time; drop it from the graph.

    Shape nodes fold from the inferred static shape; other nodes are run, one at a time, by
    onnx's reference evaluator. Folded values become initializers. Returns the shape-inferred
    model and whether anything folded.
    """
    model = _infer(model)
    graph = model.graph
    opsets = {entry.domain or "": entry.version for entry in model.opset_import}
    shapes = static_shapes(model)
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    constants.update(weights)
    kept = []
    fills: set[str] = set()
    for node in _inline_constant_ifs(graph, constants):
        fill = _large_fill(node, constants)
        if fill is not None:
            # Consumers fold against a zero-stride view; the node itself stays (a Memset on
            # the machine) unless nothing at run time reads its output.
            constants[node.output[0]] = fill
            fills.add(node.output[0])
            kept.append(node)
            continue
        values = _fold_node(node, constants, shapes, opsets)
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, values, strict=False):
            if name:
                constants[name] = value
    outputs = {out.name for out in graph.output}
    readers = {name for node in kept if node.output[0] not in fills for name in _names_read(node)}
    kept = [n for n in kept if n.output[0] not in fills or n.output[0] in readers | outputs]
    if kept == list(graph.node):
        return model, False
    # An If or Loop body may read an initializer of the enclosing graph by name: keep it too.
    used = {name for node in kept for name in _names_read(node)} | outputs
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    # IR < 4 ignores initializers that are not also graph inputs; folded values are not inputs.
    folded.ir_version = max(folded.ir_version, 4)
    del folded.graph.node[:]
    folded.graph.node.extend(kept)
    del folded.graph.initializer[:]
    del folded.graph.value_info[:]
    runtime = [value for value in folded.graph.input if value.name not in constants]
    del folded.graph.input[:]
    folded.graph.input.extend(runtime)
    for name, value in constants.items():
        if name not in used or name in fills:
            continue
        value = np.asarray(value)
        if value.size >= WEIGHT_ELEMENTS:  # a large folded value joins the weights held aside
            weights[name] = value
            folded.graph.input.append(
                onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)
                )
            )
        else:
            folded.graph.initializer.append(numpy_helper.from_array(value, name))
    return _infer(folded), True


def _dequantizes_integers(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """A DequantizeLinear of an integer constant (a quantized weight or bias): kept, so the
    quantized matmuls can multiply the integers themselves and the weights stay integers in
    DRAM (docs/quantization.md#weights)."""
    if node.op_type != "DequantizeLinear" or not node.input or node.input[0] not in constants:
        return False
    return np.asarray(constants[node.input[0]]).dtype.kind in "iu"


def _large_fill(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> np.ndarray | None:
    """A ConstantOfShape of constant shape and at least WEIGHT_ELEMENTS elements, as a
    read-only zero-stride view of its one value (never materialised); else None."""
    if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
        return None
    if not node.input or node.input[0] not in constants:
        return None
    shape = tuple(int(d) for d in np.asarray(constants[node.input[0]]).reshape(-1))
    if math.prod(shape) < WEIGHT_ELEMENTS:
        return None
    value = np.zeros(1, np.float32)
    for attr in node.attribute:
        if attr.name == "value":
            value = numpy_helper.to_array(attr.t).reshape(-1)[:1]
    return np.broadcast_to(value.reshape(()), shape)


def _fold_node(node, constants, shapes, opsets) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC:
        return None
    if _dequantizes_integers(node, constants):
        return None
    if node.op_type == "Shape" and node.input[0] in shapes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        shape = shapes[node.input[0]]
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return [np.array(shape[start:end], dtype=np.int64)]
    if node.op_type == "Size" and node.input[0] in shapes:
        return [np.array(int(np.prod(shapes[node.input[0]])), dtype=np.int64)]
    if any(name and name not in constants for name in node.input):
        return None
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return None
    # A large value is folded only when it moves a constant's elements (a weight's Transpose,
    # a tied embedding read as the head's weight): computing a broadcast or an arange this
    # size would hold a tensor no initializer did; moving one holds one more copy of a weight,
    # which the device then reads laid out, instead of laying it out on every run.
    if not _moves_stored_elements(node, constants):
        for name in node.output:
            if name in shapes and int(np.prod(shapes[name])) > _FOLD_MAX_ELEMENTS:
                return None
    feeds = {name: constants[name] for name in node.input if name}
    try:
        evaluator = ReferenceEvaluator(_one_node_model(node, feeds, opsets))
        # log(0) = -inf and the like are values here, not problems worth a warning.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [np.asarray(value) for value in evaluator.run(None, feeds)]
    except Exception as exc:
        # Left to the code generator, which reports the node if nothing lowers it.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _LOG.info("node %r (%s) not folded: %s", node.name, node.op_type, first[:300])
        return None


def _moves_stored_elements(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    """Whether `node` only moves the elements of a constant that holds them (not a fill's
    zero-stride view, which a moved copy would materialise)."""
    if node.op_type not in ELEMENT_MOVES or not node.input:
        return False
    data = np.asarray(constants[node.input[0]])
    return 0 not in data.strides or data.size <= 1


def _one_node_model(node: onnx.NodeProto, feeds: dict, opsets: dict[str, int]):
    """`node` as a model at the model's own opsets, so the reference evaluator runs the
    operator version the model means (a bare node would get the newest: Unsqueeze-13, whose
    axes are an input, for an opset-12 Unsqueeze with an `axes` attribute)."""
    inputs = [
        onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), None
        )
        for name, value in feeds.items()
    ]
    outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in node.output if name]
    graph = onnx.helper.make_graph([node], "fold", inputs, outputs)
    imports = [onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=onnx.IR_VERSION)


def _inline_constant_ifs(graph: onnx.GraphProto, constants: dict[str, np.ndarray]):
    """The graph's nodes, lazily, with every If whose condition is a compile-time constant by
    the time it is reached replaced by the nodes of the branch it takes (their initializers
    join `constants`)."""
    for node in graph.node:
        cond = constants.get(node.input[0]) if node.op_type == "If" and node.input else None
        if node.domain not in ("", "ai.onnx") or cond is None or np.asarray(cond).size != 1:
            yield node
            continue
        branch_name = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == branch_name)
        yield from _inlined_branch(node, branch, constants)


def _inlined_branch(node: onnx.NodeProto, branch: onnx.GraphProto, constants) -> list:
    """The branch's nodes, writing the If's outputs instead of the branch's. Names inside a
    branch are unique in the whole model (ONNX's SSA rule), so its nodes move out unchanged;
    an output the branch takes straight from outside (or from its initializer) becomes an
    Identity."""
    for init in branch.initializer:
        constants[init.name] = numpy_helper.to_array(init)
    produced = {name for inner in branch.node for name in inner.output}
    renames: dict[str, str] = {}
    tail = []
    for value, target in zip(branch.output, node.output, strict=True):
        if not target:
            continue
        if value.name in produced and value.name not in renames:
            renames[value.name] = target
        else:
            tail.append(onnx.helper.make_node("Identity", [renames.get(value.name, value.name)],
                                              [target], name=f"{node.name}/{target}"))  # fmt: skip
    moved = []
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        for index, name in enumerate(copy.output):
            copy.output[index] = renames.get(name, name)
        _rename_reads(copy, renames)
        moved.append(copy)
    return moved + tail


def _rename_reads(node: onnx.NodeProto, renames: dict[str, str]) -> None:
    """Rename the node's inputs, and the reads of its subgraphs, by `renames` (in place)."""
    for index, name in enumerate(node.input):
        node.input[index] = renames.get(name, name)
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            for inner in graph.node:
                _rename_reads(inner, renames)
            for value in graph.output:
                value.name = renames.get(value.name, value.name)


def drop_dead_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove nodes none of whose outputs is read by another node or is a graph output
    (ONNX ops have no side effects); repeated, so a dead chain goes entirely."""
    nodes = list(model.graph.node)
    while True:
        read = {name for node in nodes for name in _names_read(node)}
        read |= {value.name for value in model.graph.output}
        live = [node for node in nodes if any(name and name in read for name in node.output)]
        if len(live) == len(nodes):
            break
        nodes = live
    if len(nodes) == len(model.graph.node):
        return model
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _names_read(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and every name read inside its subgraphs (If, Loop, Scan bodies may
    read outer values)."""
    names = set(node.input)
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            for inner in graph.node:
                names |= _names_read(inner)
            names |= {value.name for value in graph.output}
    return names


def drop_zero_adds(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Remove every Add of a constant that is exactly zero to a runtime tensor of the output's
    shape and dtype (an attention mask of zeros, a zero bias): its consumers read the other
    input instead. x + 0 is x for every x but -0, which becomes +0 (equal as values). An Add
    that broadcasts the runtime input to a bigger shape, writes a graph output or is read
    inside a subgraph stays. Constants nothing reads any more are dropped with it. Returns the
    model (changed in place)."""
    graph = model.graph
    shapes = static_shapes(model)
    types = {
        value.name: value.type.tensor_type.elem_type
        for value in [*graph.input, *graph.value_info, *graph.output]
    }
    constants = {init.name: init for init in graph.initializer}
    keep_names = {value.name for value in graph.output}
    for node in graph.node:
        keep_names |= _names_read(node) - set(node.input)
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = renamed.get(name, name)
        other = _zero_add_operand(node, constants, weights, shapes, types)
        if other is not None and node.output[0] not in keep_names:
            renamed[node.output[0]] = other
            continue
        kept.append(node)
    if not renamed:
        return model
    del graph.node[:]
    graph.node.extend(kept)
    read = {name for node in kept for name in _names_read(node)}
    unused = [init for init in graph.initializer if init.name not in read]
    for init in unused:
        graph.initializer.remove(init)
    for value in [value for value in graph.input if value.name in weights]:
        if value.name not in read:
            graph.input.remove(value)
            del weights[value.name]
    return model


def drop_identity_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove every node that returns its runtime input as it is: an Identity, a Cast or
    CastLike to the type the input has already (the TorchScript exporter writes
    `Cast(to=FLOAT)` of a float softmax, for `softmax(x, dtype=float32).to(x.dtype)`), a
    Dropout in inference mode whose mask nothing reads, a Reshape (Expand, Flatten, Squeeze,
    Unsqueeze) whose output has the input's shape, a Transpose that keeps every axis in place
    (the TorchScript exporter's `Reshape(x, [1, -1, S, D])` of a [1, H, S, D] tensor). Its
    readers read the input instead. One writing a graph output or read inside a subgraph
    stays. Returns the model (changed in place)."""
    graph = model.graph
    types = {
        value.name: value.type.tensor_type.elem_type
        for value in [*graph.input, *graph.value_info, *graph.output]
    }
    keep_names = {value.name for value in graph.output}
    for node in graph.node:
        keep_names |= _names_read(node) - set(node.input)
    read = {name for node in graph.node for name in node.input}
    shapes = static_shapes(model)
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = renamed.get(name, name)
        reason = identity_refusal(node, types, read, shapes)
        if reason is None and node.output[0] not in keep_names:
            renamed[node.output[0]] = node.input[0]
            continue
        kept.append(node)
    if renamed:
        del graph.node[:]
        graph.node.extend(kept)
    return model


# Ops that only view their input anew: one whose output has the input's shape returns it.
_VIEWS = frozenset({"Reshape", "Expand", "Flatten", "Squeeze", "Unsqueeze"})


def identity_refusal(
    node: onnx.NodeProto,
    types: dict[str, int],
    read: set[str],
    shapes: dict[str, tuple[int, ...]],
) -> str | None:
    """In: a node, the elem type of every typed value, the names nodes read, the static
    shapes. Out: None when the node returns its first input unchanged as its only output read,
    else why not."""
    if node.domain not in ("", "ai.onnx") or not node.input or not node.input[0]:
        return "not a standard op with an input"
    source = types.get(node.input[0])
    if source is None:
        return f"{node.input[0]!r} has no known type"
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Identity":
        return None
    if node.op_type in _VIEWS or node.op_type == "Transpose":
        source_shape = shapes.get(node.input[0])
        if source_shape is None or source_shape != shapes.get(node.output[0]):
            return f"a {node.op_type} that changes the shape"
        perm = attrs.get("perm", range(len(source_shape))[::-1])
        if node.op_type == "Transpose" and list(perm) != list(range(len(source_shape))):
            return "a Transpose that moves axes"
        return None
    if node.op_type == "Cast":
        return None if attrs.get("to") == source else "a Cast to another type"
    if node.op_type == "CastLike" and len(node.input) == 2:
        return None if types.get(node.input[1]) == source else "a CastLike to another type"
    if node.op_type == "Dropout":
        if len(node.input) > 2 and node.input[2]:
            return "a Dropout whose training_mode is an input"
        if any(name and name in read for name in node.output[1:]):
            return "a Dropout whose mask is read"
        return None
    return f"{node.op_type} is not an identity"


def _zero_add_operand(node, constants, weights, shapes, types) -> str | None:
    """The runtime input of an Add whose other input is a constant of zeros that neither
    widens the output beyond the runtime input's shape nor changes its dtype; else None."""
    if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    out = node.output[0]
    for const, other in (node.input[1], node.input[0]), (node.input[0], node.input[1]):
        if const in weights:
            value = weights[const]
        elif const in constants:
            value = numpy_helper.to_array(constants[const])
        else:
            continue
        if other in weights or other in constants or other not in shapes:
            continue
        if shapes[other] != shapes.get(out) or types.get(other) != types.get(out):
            continue
        if value.size and np.all(value == 0):
            return other
    return None
