"""Packed projections split at import: one MatMul by a constant weight whose columns the model
reads apart (q, k and v of a packed in-projection) becomes one MatMul per block of columns.

In: a folded ModelProto with inferred static shapes, and the weights the importer holds aside
(`importer.split_weights`; new weight blocks join them). Out: the same model, each splittable
projection replaced by a MatMul (and bias Add) per block, each followed by the canonical views
(`view_chains.canonical_views`: a Reshape, then a Transpose) that give the tensor the model
read. The blocks' tensors keep the names of the tensors the model's other nodes read.

`torch.nn.MultiheadAttention` (torchvision's ViT) projects q, k and v with one [D, 3D] weight
and takes them apart with `Reshape → Unsqueeze → Transpose → Squeeze → Gather`; exporters of
GPT-2's `c_attn` write a `Split`. Kept packed, the projection's [S, 3D] result goes through a
Transpose and three Gathers before the heads are split, passes over the tensor that a model
with three projections (BERT's, transformers' ViT's) never makes, and no matmul can write a
head in the layout its reader wants.

Pattern: a MatMul whose second input is a constant [K, N] weight, optionally followed by the
Add of an [N] constant bias, whose result is read only through views and selections (Reshape,
Transpose, Squeeze, Unsqueeze, Flatten, and Gather, Slice or Split with constant indices).
Check (`split_refusal`): every tensor where that subgraph ends (read by another node, or a
graph output) holds exactly one block of columns [c0, c1), narrower than N, the blocks are
disjoint, and each is its block split into heads: a Reshape then a Transpose (a fused MLP's
gate and up projection, read as they are, stays packed: the MLP kernel takes it so).
Rewrite: per block, MatMul(x, W[:, c0:c1]), the Add of bias[c0:c1], the views; the
projection and the subgraph go.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2bir.frontend.folding import WEIGHT_ELEMENTS, static_shapes
from onnx2bir.frontend.view_chains import canonical_views

_VIEWS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
_SELECTIONS = frozenset({"Gather", "Slice", "Split"})
_MAX_ELEMENTS = 1 << 24  # the subgraph is checked on arrays of the result's element indices


def split_packed_projections(
    model: onnx.ModelProto, weights: dict[str, np.ndarray]
) -> onnx.ModelProto:
    """In: a folded model and its held-aside weights. Out: the model (changed in place, new
    weight blocks added to `weights`), each packed projection split by column blocks."""
    graph = model.graph
    context = _Context(model, weights)
    plans = [
        (node, plan)
        for node in graph.node
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx")
        for plan in [_plan(node, context)]
        if plan is not None
    ]
    if not plans:
        return model
    removed, inserted = set(), {}
    for node, plan in plans:
        removed |= {
            id(n) for n in [node, *plan["members"], *([plan["add"]] if plan["add"] else [])]
        }
        inserted[id(node)] = _block_nodes(node, plan, context)
    nodes = []
    for node in graph.node:
        nodes.extend(inserted.get(id(node), []))
        if id(node) not in removed:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    for node, plan in plans:
        _drop_unread(context, [node.input[1], *([plan["bias_name"]] if plan["add"] else [])])
    return model


class _Context:
    """What the rules read: static shapes, constants, each tensor's readers and dtype."""

    def __init__(self, model: onnx.ModelProto, weights: dict[str, np.ndarray]):
        graph = model.graph
        self.model, self.weights = model, weights
        self.shapes = static_shapes(model)
        self.constants = {init.name: init for init in graph.initializer}
        self.readers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                if name:
                    self.readers.setdefault(name, []).append(node)
        self.keep = {value.name for value in graph.output}
        for node in graph.node:
            for attr in node.attribute:
                for inner in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    self.keep |= {name for n in inner.node for name in n.input}
        self.types = {
            value.name: value.type.tensor_type.elem_type
            for value in [*graph.input, *graph.value_info, *graph.output]
        }

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.weights:
            return self.weights[name]
        if name in self.constants:
            return numpy_helper.to_array(self.constants[name])
        return None


def _plan(node: onnx.NodeProto, context: _Context) -> dict | None:
    """In: a MatMul. Out: the split (weight, bias, blocks of (c0, c1, leaf, views)), or None
    when the projection is not a packed one (`split_refusal`)."""
    weight = context.constant(node.input[1])
    if weight is None or weight.ndim != 2 or node.input[0] not in context.shapes:
        return None
    result, bias, add, bias_name = _with_bias(node, weight.shape[1], context)
    if result not in context.shapes or math.prod(context.shapes[result]) > _MAX_ELEMENTS:
        return None
    leaves, members = _selections(result, context)
    if not leaves:
        return None
    blocks = _blocks(leaves, context.shapes[result], context)
    if split_refusal(blocks, weight.shape[1]) is not None:
        return None
    return {
        "weight": weight,
        "bias": bias,
        "bias_name": bias_name,
        "add": add,
        "members": members,
        "blocks": blocks,
    }


def _with_bias(node: onnx.NodeProto, width: int, context: _Context):
    """(the tensor the projection ends in, the bias values, the Add, the bias's name), the last
    three None without a bias Add."""
    product = node.output[0]
    readers = context.readers.get(product, [])
    if len(readers) != 1 or readers[0].op_type != "Add" or product in context.keep:
        return product, None, None, None
    add = readers[0]
    other = add.input[1] if add.input[0] == product else add.input[0]
    bias = context.constant(other)
    if bias is None or bias.shape != (width,):
        return product, None, None, None
    return add.output[0], bias, add, other


def _selections(root: str, context: _Context) -> tuple[dict[str, np.ndarray], list]:
    """In: the projection's result. Out: (the tensors where the subgraph of views and
    selections read from it ends, each with the element indices of the result it holds; the
    subgraph's nodes). Empty when the result itself is read otherwise."""
    values = {root: np.arange(math.prod(context.shapes[root])).reshape(context.shapes[root])}
    leaves: dict[str, np.ndarray] = {}
    members: list = []
    queue = [root]
    while queue:
        tensor = queue.pop(0)
        readers = context.readers.get(tensor, [])
        if (
            tensor in context.keep
            or not readers
            or not all(
                _selects(r, context) and list(r.input).count(tensor) == 1 and r.input[0] == tensor
                for r in readers
            )
        ):
            if tensor == root:
                return {}, []
            leaves[tensor] = values[tensor]
            continue
        for reader in readers:
            if any(reader is m for m in members):
                continue
            outputs = _apply(reader, values[reader.input[0]], context)
            if outputs is None:
                return {}, []
            members.append(reader)
            for name, value in zip(reader.output, outputs, strict=True):
                if name:
                    values[name] = value
                    queue.append(name)
    return leaves, members


def _selects(node: onnx.NodeProto, context: _Context) -> bool:
    """Whether a node only views or selects elements of its first input (constant indices)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in _VIEWS | _SELECTIONS:
        return False
    constant_inputs = node.input[1:]
    if node.op_type in ("Reshape", "Squeeze", "Unsqueeze"):
        return all(name in context.shapes for name in node.output)
    return all(not name or context.constant(name) is not None for name in constant_inputs)


def _apply(node: onnx.NodeProto, values: np.ndarray, context: _Context) -> list | None:
    """The node applied to an array of element indices; None when it cannot be."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Transpose":
        return [np.transpose(values, attrs.get("perm"))]
    if node.op_type in _VIEWS:
        shape = context.shapes.get(node.output[0])
        return None if shape is None else [values.reshape(shape)]
    if node.op_type == "Gather":
        indices = context.constant(node.input[1])
        return [np.take(values, indices, axis=attrs.get("axis", 0))]
    if node.op_type == "Slice":
        return [_slice(node, values, context)]
    return _split(node, values, attrs, context)


def _slice(node: onnx.NodeProto, values: np.ndarray, context: _Context) -> np.ndarray:
    inputs = [context.constant(name) if name else None for name in node.input[1:]]
    starts, ends = inputs[0], inputs[1]
    axes = inputs[2] if len(inputs) > 2 and inputs[2] is not None else range(len(starts))
    steps = inputs[3] if len(inputs) > 3 and inputs[3] is not None else [1] * len(starts)
    index = [slice(None)] * values.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return values[tuple(index)]


def _split(node: onnx.NodeProto, values: np.ndarray, attrs: dict, context: _Context) -> list:
    axis = attrs.get("axis", 0)
    sizes = context.constant(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    if sizes is None:
        sizes = attrs.get("split")
    if sizes is None:
        count = len(node.output)
        extent = values.shape[axis]
        step = -(-extent // count)
        sizes = [min(step, extent - i * step) for i in range(count)]
    cuts = np.cumsum([int(s) for s in sizes])[:-1]
    return np.split(values, cuts, axis=axis)


def _blocks(leaves: dict[str, np.ndarray], shape, context: _Context) -> list | None:
    """Per leaf: (c0, c1, leaf, the views from its block's product), or None for a leaf that
    is not one block of columns, each element once, in Reshape-then-Transpose order."""
    width = shape[-1]
    blocks = []
    for leaf, indices in leaves.items():
        if leaf not in context.shapes or not indices.size:
            return None
        columns = indices % width
        c0, c1 = int(columns.min()), int(columns.max()) + 1
        rows = indices // width
        inside = rows * (c1 - c0) + (columns - c0)
        block = (*shape[:-1], c1 - c0)
        if inside.size != math.prod(block):
            return None
        if not np.array_equal(np.sort(inside.ravel()), np.arange(inside.size)):
            return None
        views = canonical_views(tuple(block), inside)
        if views is None:
            return None
        blocks.append((c0, c1, leaf, views))
    return blocks


def split_refusal(blocks: list | None, width: int) -> str | None:
    """Why the projection stays packed; None when its blocks split it."""
    if blocks is None:
        return "a tensor read from the projection is not one block of its columns"
    if any(c1 - c0 >= width for c0, c1, _, _ in blocks):
        return "a reader takes every column"
    spans = sorted((c0, c1) for c0, c1, _, _ in blocks)
    if any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
        return "two readers take overlapping columns"
    if not all(any(kind == "Transpose" for kind, _ in views) for _, _, _, views in blocks):
        # a fused MLP's gate and up, read as they are: the MLP kernel takes them packed
        return "a block is read without being split into heads"
    return None


def _block_nodes(node: onnx.NodeProto, plan: dict, context: _Context) -> list:
    """The nodes that replace a packed projection: per block its MatMul, bias Add, views."""
    elem = context.types.get(node.output[0], onnx.TensorProto.FLOAT)
    shape = context.shapes[node.output[0]]
    new_nodes = []
    for c0, c1, leaf, views in plan["blocks"]:
        tag = f"cols{c0}-{c1}"
        block_shape = [*shape[:-1], c1 - c0]
        weight = _add_constant(context, f"{node.input[1]}/{tag}", plan["weight"][:, c0:c1])
        current = _value(context, f"{node.output[0]}/{tag}", elem, block_shape)
        matmul = helper.make_node("MatMul", [node.input[0], weight], [current])
        matmul.name = f"{node.name}/{tag}"
        new_nodes.append(matmul)
        if plan["bias"] is not None:
            add = plan["add"]
            bias = _add_constant(context, f"{add.output[0]}/bias/{tag}", plan["bias"][c0:c1])
            added = _value(context, f"{add.output[0]}/{tag}", elem, block_shape)
            bias_add = helper.make_node("Add", [current, bias], [added], name=f"{add.name}/{tag}")
            new_nodes.append(bias_add)
            current = added
        new_nodes += _views(context, current, leaf, views, elem, f"{node.name}/{tag}")
    return new_nodes


def _drop_unread(context: _Context, names: list[str]) -> None:
    """Remove the packed weight and bias when nothing reads them any more."""
    graph = context.model.graph
    read = {name for node in graph.node for name in node.input}
    for name in names:
        if name in read:
            continue
        for value in [v for v in graph.input if v.name == name]:
            graph.input.remove(value)
        for init in [i for i in graph.initializer if i.name == name]:
            graph.initializer.remove(init)
        context.weights.pop(name, None)


def _views(context: _Context, source: str, leaf: str, views: list, elem: int, name: str) -> list:
    """The canonical views from a block's product to the tensor the model reads."""
    if not views:
        views = [("Reshape", tuple(context.shapes[leaf]))]
    nodes = []
    for index, (kind, value) in enumerate(views):
        last = index == len(views) - 1
        out = leaf if last else _value(context, f"{leaf}/{kind.lower()}", elem, list(value))
        if kind == "Transpose":
            nodes.append(helper.make_node("Transpose", [source], [out], name=f"{name}/transpose"))
            nodes[-1].attribute.append(helper.make_attribute("perm", list(value)))
        else:
            shape = _add_constant(context, f"{out}/shape", np.asarray(value, np.int64))
            reshape = helper.make_node("Reshape", [source, shape], [out], name=f"{name}/reshape")
            nodes.append(reshape)
        source = out
    return nodes


def _value(context: _Context, name: str, elem: int, shape: list) -> str:
    context.model.graph.value_info.append(helper.make_tensor_value_info(name, elem, list(shape)))
    return name


def _add_constant(context: _Context, name: str, value: np.ndarray) -> str:
    """A new constant: a held-aside weight (typed graph input) when large, else an
    initializer."""
    value = np.ascontiguousarray(value)
    graph = context.model.graph
    if value.size >= WEIGHT_ELEMENTS:
        context.weights[name] = value
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        graph.input.append(helper.make_tensor_value_info(name, elem, list(value.shape)))
    else:
        graph.initializer.append(numpy_helper.from_array(value, name))
    return name
