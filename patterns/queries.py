"""Small questions the pattern checks ask of the graph: constants, producers, paths."""

from __future__ import annotations

import numpy as np

from onnx2bir.graph import Graph


def const_value(graph: Graph, tensor: str) -> np.ndarray | None:
    info = graph.tensors.get(tensor)
    return None if info is None or not info.is_const else info.const


def scalar_const(graph: Graph, tensor: str) -> float | None:
    """The value of a constant holding one number (any shape of size 1), else None."""
    value = const_value(graph, tensor)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(()))


def other_input(graph: Graph, node: str, tensor: str) -> tuple[int, str] | None:
    """(index, name) of the first input of `node` that is not `tensor`."""
    for index, name in enumerate(graph.node(node)["inputs"]):
        if name and name != tensor:
            return index, name
    return None


def producer_op(graph: Graph, tensor: str) -> tuple[str, dict] | None:
    node = graph.producer(tensor)
    return None if node is None else (node, graph.node(node))


def walk_up(graph: Graph, tensor: str, through: set[str], limit: int = 6) -> list[tuple[str, dict]]:
    """Producers of `tensor` along input 0, while their op type is in `through`."""
    chain = []
    for _ in range(limit):
        found = producer_op(graph, tensor)
        if found is None or found[1]["op_type"] not in through:
            break
        chain.append(found)
        tensor = found[1]["inputs"][0]
    return chain


def cone_ops(graph: Graph, tensor: str, limit: int = 80) -> set[str]:
    """Op types in the backward cone of `tensor` (up to `limit` nodes)."""
    seen: set[str] = set()
    ops: set[str] = set()
    stack = [tensor]
    while stack and len(seen) < limit:
        node = graph.producer(stack.pop())
        if node is None or node in seen:
            continue
        seen.add(node)
        data = graph.node(node)
        ops.add(data["op_type"])
        stack.extend(t for t in data["inputs"] if t)
    return ops


def cone_reaches_input(graph: Graph, tensor: str, limit: int = 60) -> bool:
    """Whether any graph input feeds `tensor` (within `limit` producer nodes)."""
    seen: set[str] = set()
    stack = [tensor]
    while stack and len(seen) < limit:
        name = stack.pop()
        if name in graph.inputs:
            return True
        node = graph.producer(name)
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(t for t in graph.node(node)["inputs"] if t)
    return False
