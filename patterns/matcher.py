"""Declarative dataflow patterns matched by networkx subgraph monomorphism.

A `Pattern` is a small graph of pattern nodes — each an op-type set and an optional predicate
on the matched graph node — and edges that name the consumer's input index (or accept any
index, for commutative ops). `find_matches` grows each embedding outwards from the anchor node:
the pattern nodes are placed in breadth-first order, each one among the producers or consumers
of a node already placed, and every pattern edge between placed nodes is checked as soon as both
ends are placed. The work per anchor depends on the pattern and the fan-out around the anchor,
not on the model's size (a hub such as an attention mask read by every layer is only walked
where the pattern leaves through it). The embeddings are the subgraph monomorphisms that
`networkx`'s MultiDiGraphMatcher finds (`find_matches_vf2`, kept as the reference the tests
compare with), restricted to nodes within `radius` hops of the anchor.

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


def _edges_match(indices: list[int], wanted: list[int]) -> bool:
    """Whether graph edges with input `indices` can carry pattern edges wanting `wanted`, each
    graph edge used once (ANY_INDEX takes whichever is left)."""
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


@functools.cache
def _plan(pattern: Pattern) -> tuple | None:
    """The anchored search order: per pattern node after the anchor, (node, placed neighbour,
    whether the node consumes that neighbour's output, the pattern edges to check once it is
    placed as [(producer key, consumer key, wanted indices)]). None if the pattern is not
    connected (the search falls back to networkx)."""
    wanted: dict[tuple[str, str], list[int]] = {}
    for src, dst, index in pattern.edges:
        wanted.setdefault((src, dst), []).append(index)
    by_key = {node.key: node for node in pattern.nodes}
    order, placed = [pattern.anchor], {pattern.anchor}
    steps = []
    queue = [pattern.anchor]
    while queue:
        current = queue.pop(0)
        for src, dst in wanted:
            if current not in (src, dst):
                continue
            other, consumes = (dst, True) if src == current else (src, False)
            if other in placed:
                continue
            placed.add(other)
            order.append(other)
            queue.append(other)
            checks = [
                (a, b, indices)
                for (a, b), indices in wanted.items()
                if other in (a, b) and (a == other or a in placed) and (b == other or b in placed)
            ]
            steps.append((by_key[other], current, consumes, checks))
    if len(order) != len(pattern.nodes):
        return None
    return tuple(steps)


def find_matches(
    graph: Graph, pattern: Pattern, anchor: str, radius: int | None = None
) -> Iterator[dict[str, str]]:
    """Every embedding of `pattern` whose anchor is `anchor`, as {pattern key: graph node}."""
    anchor_node = next(n for n in pattern.nodes if n.key == pattern.anchor)
    if not _is_op(graph.nx.nodes[anchor], anchor_node.ops):
        return
    if anchor_node.check is not None and not anchor_node.check(graph, anchor):
        return
    steps = _plan(pattern)
    if steps is None:
        yield from find_matches_vf2(graph, pattern, anchor, radius)
        return
    # A pattern node k hops from the anchor lands at most k hops from it in the graph, so the
    # radius only restricts when it is below the pattern's own.
    within = None
    if radius is not None and radius < pattern.radius:
        within = neighbourhood(graph, anchor, radius)
    nxg = graph.nx
    nodes = nxg.nodes
    self_edges = [i for (a, b), i in _self_edges(pattern)]
    if self_edges and not all(_edges_match(_indices(nxg, anchor, anchor), w) for w in self_edges):
        return
    mapping = {pattern.anchor: anchor}
    used = {anchor}
    keys = [node.key for node in pattern.nodes]

    def extend(step: int) -> Iterator[dict[str, str]]:
        if step == len(steps):
            yield {key: mapping[key] for key in keys}  # in the pattern's node order
            return
        pnode, via, consumes, checks = steps[step]
        base = mapping[via]
        candidates = nxg.successors(base) if consumes else nxg.predecessors(base)
        for candidate in candidates:
            if candidate in used or (within is not None and candidate not in within):
                continue
            if not _is_op(nodes[candidate], pnode.ops):
                continue
            if pnode.check is not None and not pnode.check(graph, candidate):
                continue
            mapping[pnode.key] = candidate
            if all(_edges_match(_indices(nxg, mapping[a], mapping[b]), w) for a, b, w in checks):
                used.add(candidate)
                yield from extend(step + 1)
                used.discard(candidate)
            del mapping[pnode.key]

    yield from extend(0)


def _self_edges(pattern: Pattern) -> list[tuple[tuple[str, str], list[int]]]:
    grouped: dict[tuple[str, str], list[int]] = {}
    for src, dst, index in pattern.edges:
        if src == dst == pattern.anchor:
            grouped.setdefault((src, dst), []).append(index)
    return list(grouped.items())


def _indices(nxg, producer: str, consumer: str) -> list[int]:
    data = nxg.get_edge_data(producer, consumer)
    return [] if data is None else [e["index"] for e in data.values()]


def find_matches_vf2(
    graph: Graph, pattern: Pattern, anchor: str, radius: int | None = None
) -> Iterator[dict[str, str]]:
    """`find_matches` by networkx's VF2 on the anchor's neighbourhood (the reference)."""
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
        return _edges_match(indices, [e["index"] for e in pattern_edges.values()])

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
