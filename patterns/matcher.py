"""Declarative dataflow patterns matched by networkx subgraph monomorphism.

A `Pattern` is a small graph of pattern nodes — each an op-type set and an optional predicate
on the matched graph node — and edges that name the consumer's input index (or accept any
index, for commutative ops). `find_matches` runs `networkx`'s MultiDiGraphMatcher, but only on
the neighbourhood of each anchor node (the nodes within a few hops), so compile time grows
linearly with the model rather than with its square.

A match becomes a rewrite only if it is valid (torch.fx's rules):
- anchored: the pattern's anchor node is the anchor being tried;
- self-contained: no value computed inside the match, other than the match's outputs, is used
  outside it;
- non-overlapping: a node belongs to at most one rewrite (the caller claims nodes, first in
  topological order wins);
- acyclic after fusing: no path leaves the match and comes back into it.
`validity_problem` returns the reason a match breaks one of these, or None.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import networkx as nx
from networkx.algorithms import isomorphism

from onnx2bir.graph import Graph

ANY_INDEX = -1


@dataclass(frozen=True)
class PNode:
    key: str
    ops: frozenset[str]
    check: Callable[[Graph, str], bool] | None = None

    @staticmethod
    def of(key: str, *ops: str, check: Callable[[Graph, str], bool] | None = None) -> PNode:
        return PNode(key, frozenset(ops), check)


@dataclass(frozen=True)
class Pattern:
    """Nodes, edges (producer key, consumer key, consumer input index), and the anchor key."""

    name: str
    nodes: tuple[PNode, ...]
    edges: tuple[tuple[str, str, int], ...]
    anchor: str
    _graph: nx.MultiDiGraph = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        graph = nx.MultiDiGraph()
        for node in self.nodes:
            graph.add_node(node.key, pnode=node)
        for src, dst, index in self.edges:
            graph.add_edge(src, dst, index=index)
        object.__setattr__(self, "_graph", graph)

    @property
    def graph(self) -> nx.MultiDiGraph:
        return self._graph

    @property
    def size(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def radius(self) -> int:
        """Hops from the anchor to the farthest pattern node: every embedding lies within."""
        lengths = nx.single_source_shortest_path_length(
            self._graph.to_undirected(as_view=True), self.anchor
        )
        return max(lengths.values())


def neighbourhood(graph: Graph, anchor: str, radius: int) -> set[str]:
    """Nodes within `radius` hops of `anchor`, following edges both ways."""
    seen = {anchor}
    frontier = [anchor]
    for _ in range(radius):
        following = []
        for node in frontier:
            for other in (*graph.nx.predecessors(node), *graph.nx.successors(node)):
                if other not in seen:
                    seen.add(other)
                    following.append(other)
        frontier = following
    return seen


def _is_op(data: dict, ops: frozenset[str]) -> bool:
    """Pattern ops are standard ONNX ops: a com.microsoft MatMul is not a MatMul."""
    return data["op_type"] in ops and data.get("domain", "") in ("", "ai.onnx")


def find_matches(
    graph: Graph, pattern: Pattern, anchor: str, radius: int | None = None
) -> Iterator[dict[str, str]]:
    """Every embedding of `pattern` whose anchor is `anchor`, as {pattern key: graph node}."""
    data = graph.nx.nodes[anchor]
    anchor_node = next(n for n in pattern.nodes if n.key == pattern.anchor)
    if not _is_op(data, anchor_node.ops):
        return
    reach = pattern.radius if radius is None else min(radius, pattern.radius)
    local = graph.nx.subgraph(neighbourhood(graph, anchor, reach))

    def node_match(graph_data: dict, pattern_data: dict) -> bool:
        pnode: PNode = pattern_data["pnode"]
        if not _is_op(graph_data, pnode.ops):
            return False
        return pnode.check is None or pnode.check(graph, graph_data["name"])

    def edge_match(graph_edges: dict, pattern_edges: dict) -> bool:
        indices = [e["index"] for e in graph_edges.values()]
        wanted = [e["index"] for e in pattern_edges.values()]
        if len(wanted) > len(indices):
            return False
        pool = list(indices)
        for index in sorted(wanted, key=lambda i: i == ANY_INDEX):
            if index == ANY_INDEX:
                if not pool:
                    return False
                pool.pop()
            elif index in pool:
                pool.remove(index)
            else:
                return False
        return True

    matcher = isomorphism.MultiDiGraphMatcher(local, pattern.graph, node_match, edge_match)
    for mapping in matcher.subgraph_monomorphisms_iter():
        result = {key: node for node, key in mapping.items()}
        if result[pattern.anchor] == anchor:
            yield result


def edge_index(graph: Graph, producer: str, consumer: str) -> list[int]:
    """The input indices at which `consumer` reads outputs of `producer`."""
    return sorted(d["index"] for d in graph.nx.get_edge_data(producer, consumer, {}).values())


def validity_problem(graph: Graph, nodes: set[str], outputs: set[str]) -> str | None:
    """Why fusing `nodes` (whose only externally visible values are `outputs`) is invalid."""
    for node in nodes:
        for tensor in graph.node(node)["outputs"]:
            if not tensor or tensor in outputs:
                continue
            if tensor in graph.outputs:
                return f"interior value {tensor!r} is a graph output"
            outside = [user for user, _ in graph.consumers(tensor) if user not in nodes]
            if outside:
                return f"interior value {tensor!r} is also used by {outside[0]!r}"
    # A cycle appears if a path leaves the match and re-enters it.
    boundary = {succ for node in nodes for succ in graph.nx.successors(node)} - nodes
    if boundary:
        reachable = set()
        stack = list(boundary)
        while stack:
            node = stack.pop()
            if node in reachable:
                continue
            reachable.add(node)
            stack.extend(graph.nx.successors(node))
        if reachable & nodes:
            return "fusing would create a cycle (a path leaves the match and comes back)"
    return None
