"""Chains of views collapsed into one view at import: a run of Reshapes and Transposes that,
taken together, only permutes its input's axes becomes one Transpose; one that keeps the
input's element order becomes one Reshape.

In: a folded ModelProto (every Reshape's shape a constant) with inferred static shapes. Out:
the same model, each collapsible chain replaced by the one node, which writes the chain's last
tensor (its name kept: a probe of the verdict, a graph output).

Exporters spell one layout change several ways. PyTorch's dynamo exporter writes the key of
`scaled_dot_product_attention` as `Transpose(0, 2, 1, 3) → Reshape [B·H, S, D] → Transpose(0,
2, 1) → Reshape [B, H, D, S]` where the eager attention's export has one `Transpose(0, 2, 3, 1)`;
each node of the chain is a pass over the tensor on the device, and the matmul that reads the
last one cannot read its operand through the first.

Pattern: a Reshape, Transpose, Squeeze, Unsqueeze or Flatten whose output has one reader, a
node of the same kinds, and so on (two nodes or more). Check (`chain_refusal`): static shapes
throughout, no intermediate tensor is a graph output or read by another node or a subgraph,
and the chain's result, computed on the element indices of its input, is a permutation of the
input's axes or the input's element order. Rewrite: the one Transpose (or Reshape) in the
chain's place.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2bir.frontend.folding import static_shapes

_VIEW_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"})
# The chain is checked on an array of its input's element indices; a bigger input is left
# alone (exports write these chains on attention heads, well under this).
_MAX_ELEMENTS = 1 << 24


def collapse_view_chains(model: onnx.ModelProto) -> onnx.ModelProto:
    """In: a folded model. Out: the model (changed in place), each chain of views that only
    permutes or only reshapes its input replaced by one Transpose or Reshape."""
    graph = model.graph
    shapes = static_shapes(model)
    readers = _readers(graph)
    writers = {name: node for node in graph.node for name in node.output}
    keep = {value.name for value in graph.output} | _subgraph_reads(graph)
    replaced: dict[int, list] = {}
    for index, node in enumerate(graph.node):
        if index in replaced or not _is_view(node):
            continue
        source = node.input[0]
        if _is_view(writers.get(source)) and len(readers[source]) == 1 and source not in keep:
            continue  # inside a chain: the chain from its writer covers it
        chain = _collapsible_tail(_chain_from(index, graph, readers, keep), graph, shapes)
        if chain is None:
            continue
        for position in chain:
            replaced[position] = []
        replaced[chain[-1]] = _single_view(chain, graph, shapes, model)
    if not replaced:
        return model
    nodes = []
    for index, node in enumerate(graph.node):
        nodes.extend(replaced.get(index, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def _is_view(node) -> bool:
    return (
        node is not None
        and node.domain in ("", "ai.onnx")
        and node.op_type in _VIEW_OPS
        and len(node.output) == 1
    )


def _readers(graph: onnx.GraphProto) -> dict[str, list]:
    """Tensor name → the nodes that read it (a node once per input it is read at)."""
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(node)
    return readers


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for inner in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                names |= {name for n in inner.node for name in n.input}
                names |= {value.name for value in inner.output}
    return names


def _chain_from(start: int, graph: onnx.GraphProto, readers, keep: set[str]) -> list[int]:
    """In: the index of a view node. Out: the indices of the chain of views it begins, each
    the only reader of the one before."""
    position = {id(node): index for index, node in enumerate(graph.node)}
    chain = [start]
    node = graph.node[start]
    while node.output[0] not in keep:
        after = readers.get(node.output[0], [])
        if len(after) != 1 or not _is_view(after[0]) or after[0].input[0] != node.output[0]:
            break
        node = after[0]
        chain.append(position[id(node)])
    return chain


def _collapsible_tail(chain: list[int], graph: onnx.GraphProto, shapes) -> list[int] | None:
    """In: a chain of views. Out: its longest tail that the canonical views replace with fewer
    nodes (or a lone Transpose that keeps the element order, which is a Reshape), or None."""
    for start in range(len(chain)):
        tail = chain[start:]
        if chain_refusal(tail, graph, shapes) is not None:
            continue
        views = _net_view(tail, graph, shapes)
        lone_transpose = len(tail) == 1 and graph.node[tail[0]].op_type == "Transpose"
        if len(views) < len(tail) or (lone_transpose and [op for op, _ in views] == ["Reshape"]):
            return tail
    return None


def chain_refusal(chain: list[int], graph: onnx.GraphProto, shapes) -> str | None:
    """In: a chain of view nodes. Out: None when it is a Reshape of its input followed by a
    Transpose (either may be absent), else why it stays."""
    first, last = graph.node[chain[0]], graph.node[chain[-1]]
    names = [first.input[0], *(graph.node[i].output[0] for i in chain)]
    missing = [name for name in names if name not in shapes]
    if missing:
        return f"{missing[0]!r} has no static shape"
    if math.prod(shapes[first.input[0]]) > _MAX_ELEMENTS:
        return "the input is too large to check"
    if _net_view(chain, graph, shapes) is None:
        return f"{last.output[0]!r} is not a transpose of a reshape of {first.input[0]!r}"
    return None


def _indices_through(chain: list[int], graph: onnx.GraphProto, shapes) -> np.ndarray:
    """The chain applied to the element indices of its input."""
    source = graph.node[chain[0]].input[0]
    values = np.arange(math.prod(shapes[source]), dtype=np.int64).reshape(shapes[source])
    for index in chain:
        node = graph.node[index]
        if node.op_type == "Transpose":
            perm = [a.ints for a in node.attribute if a.name == "perm"]
            values = np.transpose(values, list(perm[0]) if perm else None)
        else:
            values = values.reshape(shapes[node.output[0]])
    return values


def _net_view(chain: list[int], graph: onnx.GraphProto, shapes) -> list[tuple] | None:
    """The canonical views equal to the chain (`canonical_views`), or None."""
    source = tuple(shapes[graph.node[chain[0]].input[0]])
    return canonical_views(source, _indices_through(chain, graph, shapes))


def canonical_views(source: tuple[int, ...], result: np.ndarray) -> list[tuple] | None:
    """In: a source shape and an array of indices into its elements (row-major). Out: the
    views [("Reshape", shape)?, ("Transpose", perm)?] that make `result` from the source — a
    Reshape that splits or merges its axes, then a Transpose — or None when there are none.
    [] when `result` is the source as it is."""
    size = result.size
    if np.array_equal(result.ravel(), np.arange(size)):
        return [] if tuple(result.shape) == source else [("Reshape", tuple(result.shape))]
    strides = {}
    for axis, extent in enumerate(result.shape):
        if extent > 1:
            step = [0] * result.ndim
            step[axis] = 1
            strides[axis] = int(result[tuple(step)] - result.flat[0])
            if strides[axis] <= 0:
                return None
    units = [axis for axis, extent in enumerate(result.shape) if extent == 1]
    order = units + sorted(strides, key=lambda axis: -strides[axis])
    middle = tuple(result.shape[axis] for axis in order)
    perm = tuple(order.index(axis) for axis in range(result.ndim))
    if not np.array_equal(np.transpose(np.arange(size).reshape(middle), perm), result):
        return None
    views = [] if middle == source else [("Reshape", middle)]
    return [*views, ("Transpose", perm)]


def _single_view(chain: list[int], graph: onnx.GraphProto, shapes, model) -> list:
    """The canonical nodes that replace the chain, the last writing the chain's tensor."""
    first, last = graph.node[chain[0]], graph.node[chain[-1]]
    views = _net_view(chain, graph, shapes)
    if not views:  # the chain gives back its input: an identity Reshape, dropped later
        views = [("Reshape", tuple(shapes[first.input[0]]))]
    nodes, source = [], first.input[0]
    elem = _elem_type(model, first.input[0])
    for index, (kind, value) in enumerate(views):
        out = last.output[0] if index == len(views) - 1 else f"{last.output[0]}/{kind.lower()}"
        if out != last.output[0]:
            model.graph.value_info.append(helper.make_tensor_value_info(out, elem, list(value)))
        name = f"{last.name}/{kind.lower()}" if last.name else ""
        if kind == "Transpose":
            nodes.append(helper.make_node("Transpose", [source], [out], name=name, perm=value))
        else:
            shape = numpy_helper.from_array(np.asarray(value, np.int64), f"{out}/shape")
            model.graph.initializer.append(shape)
            nodes.append(helper.make_node("Reshape", [source, shape.name], [out], name=name))
        source = out
    return nodes


def _elem_type(model: onnx.ModelProto, name: str) -> int:
    graph = model.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.name == name:
            return value.type.tensor_type.elem_type
    for init in graph.initializer:
        if init.name == name:
            return init.data_type
    return onnx.TensorProto.FLOAT
