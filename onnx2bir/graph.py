"""The dataflow graph every pass and the code generator work on.

A `networkx.MultiDiGraph` with one node per ONNX op and one edge per use of a tensor by an op:
edge (producer → consumer) carries the tensor name and the consumer's input index, so
`Mul(x, x)` has two edges. Graph inputs and constants have no producer node; they are known
from the tensor table. Node data: `op_type`, `domain`, `name` (the ONNX node name, unique),
`attrs` (plain Python values), `inputs` and `outputs` (tensor names by position, "" for an
absent optional input). Iteration order is insertion order, which the importer makes the
ONNX topological order, so every walk is deterministic.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType

import networkx as nx
import numpy as np

from onnx2bir.bir.enums import Dtype

# A group's copy of a node when a pass runs part of a batch a few images at a time
# (patterns/batch_split.py): `<node>/image<j>` for image j alone, `<node>/images<j>-<k>` for
# images j..k.
_IMAGE_CLONE = re.compile(r"(.+)/image(?:\d+|s\d+-\d+)")


def image_clone_name(node: str, first: int, group: int = 1) -> str:
    if group == 1:
        return f"{node}/image{first}"
    return f"{node}/images{first}-{first + group - 1}"


def image_clone_of(node: str, source: Graph) -> str | None:
    """The node of `source` that `node` is an image's copy of, if it is one."""
    match = _IMAGE_CLONE.fullmatch(node)
    if match and match.group(1) in source.nx:
        return match.group(1)
    return None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: Dtype
    const: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def is_const(self) -> bool:
        return self.const is not None


@dataclass(frozen=True, slots=True)
class Node(Mapping):
    """A read-only view of one op node, as the lowerings and kernels read it:
    `node.attr("axis", 0)`, `node.inputs`, `node.input(2)` ("" for an absent optional input).

    It is also a mapping of the graph's node data keys (name, op_type, domain, attrs, inputs,
    outputs), so code that takes the raw dict takes it too."""

    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, object]

    @classmethod
    def of(cls, data: Mapping) -> Node:
        if isinstance(data, Node):
            return data
        return cls(
            data["name"],
            data["op_type"],
            data.get("domain", ""),
            tuple(data["inputs"]),
            tuple(data["outputs"]),
            MappingProxyType(dict(data["attrs"])),
        )

    def attr(self, name: str, default=None):
        """The attribute's value, or `default` when the node does not set it."""
        return self.attrs.get(name, default)

    def input(self, index: int) -> str:
        """Input `index`'s tensor, "" when absent (past the end or left out)."""
        return self.inputs[index] if index < len(self.inputs) else ""

    def output(self, index: int) -> str:
        """Output `index`'s tensor, "" when absent (past the end, or nothing reads it)."""
        return self.outputs[index] if index < len(self.outputs) else ""

    def __getitem__(self, key: str):
        if key not in _NODE_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(_NODE_KEYS)

    def __len__(self) -> int:
        return len(_NODE_KEYS)


_NODE_KEYS = ("name", "op_type", "domain", "inputs", "outputs", "attrs")


@dataclass
class Graph:
    name: str
    nx: nx.MultiDiGraph
    tensors: dict[str, TensorInfo]
    inputs: list[str]
    outputs: list[str]
    opset: int
    producers: dict[str, str] = field(default_factory=dict)  # tensor → node that writes it
    uses: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # tensor → (node, index)
    # The model's own initializers (weights) as imported, unchanged by folding; a constant not
    # listed here was computed at compile time. See docs/memory_kinds.md.
    parameters: frozenset[str] = frozenset()
    # The tensors of the model as imported; the passes add others (a kernel's layout copies).
    # None for a graph built by hand: every tensor is the model's.
    imported: frozenset[str] | None = None
    # Nodes whose PE operands the general autocast leaves in fp32 (`--auto-cast-exclude`,
    # resolved by `codegen/casting.py` after the passes).
    keep_fp32: frozenset[str] = frozenset()
    # Convs and matmuls that multiply integers (patterns/quant/integer.py): their PE operands
    # are bf16, exactly, whatever the autocast (docs/quantization.md#exactness).
    integer_operands: frozenset[str] = frozenset()
    # Inputs the user fixed to a value (`--input-value`), constants of the graph now: the
    # program is for these values, onnxruntime is fed them (frontend/input_values.py).
    pinned_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    # What the importer changed in the model as declared, one sentence each (a graph output's
    # declared shape that contradicts its inferred one); printed as notes.
    import_notes: tuple[str, ...] = ()
    # The opset the model declared when the import upgraded it (frontend/opset_upgrade.py):
    # onnxruntime must then run the upgraded model too. None: not upgraded.
    upgraded_from: int | None = None
    # The rewrites of the model's meaning the importer made (static sequences, function
    # bodies): the validation checks each against onnxruntime's run of the model as given.
    import_rewrites: tuple[str, ...] = ()
    # topological_order's last answer and the graph's state it answered for.
    _order: tuple[tuple[int, int, int], list[str]] | None = field(
        default=None, repr=False, compare=False
    )
    _mutations: int = field(default=0, repr=False, compare=False)
    # Each node's place in the order topological_order keeps where it can: (n,) for the n-th
    # node added, or, for a node added in_place_of(another), that node's place and a number.
    _place: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False, compare=False)
    _placing: list | None = field(default=None, repr=False, compare=False)
    _added: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in self.nx.nodes:  # a graph made around a networkx graph built elsewhere
            self._place.setdefault(name, (self._added,))
            self._added += 1

    # --- queries -------------------------------------------------------------------------
    def nodes(self):
        """(name, data) for every op node, in topological order."""
        yield from self.nx.nodes(data=True)

    def node(self, name: str) -> dict:
        return self.nx.nodes[name]

    def producer(self, tensor: str) -> str | None:
        return self.producers.get(tensor)

    def consumers(self, tensor: str) -> list[tuple[str, int]]:
        """(node, input index) for every use of `tensor`, in node order."""
        return list(self.uses.get(tensor, ()))

    def is_model_tensor(self, tensor: str) -> bool:
        """Whether `tensor` is one of the model's (not one a pass made)."""
        return self.imported is None or tensor in self.imported

    def op_counts(self) -> Counter:
        return Counter(data["op_type"] for _, data in self.nodes())

    # --- mutation ------------------------------------------------------------------------
    def add_node(
        self,
        name: str,
        op_type: str,
        inputs: list[str],
        outputs: list[str],
        attrs: dict | None = None,
        domain: str = "",
    ) -> None:
        if name in self.nx:
            raise ValueError(f"node name {name!r} is used twice")
        self._mutations += 1
        if self._placing is None:
            self._place[name] = (self._added,)
            self._added += 1
        else:
            base, number = self._placing
            self._place[name] = (*base, number)
            self._placing[1] += 1
        self.nx.add_node(
            name,
            op_type=op_type,
            domain=domain,
            name=name,
            attrs=dict(attrs or {}),
            inputs=list(inputs),
            outputs=list(outputs),
        )
        for index, tensor in enumerate(inputs):
            if not tensor:
                continue
            self.uses.setdefault(tensor, []).append((name, index))
            producer = self.producers.get(tensor)
            if producer is not None:
                self.nx.add_edge(producer, name, tensor=tensor, index=index)
        for tensor in outputs:
            if not tensor:
                continue
            self.producers[tensor] = name
            for consumer, index in self.uses.get(tensor, ()):
                if consumer != name:
                    self.nx.add_edge(name, consumer, tensor=tensor, index=index)

    def remove_node(self, name: str) -> None:
        data = self.nx.nodes[name]
        self._mutations += 1
        for tensor in data["outputs"]:
            if self.producers.get(tensor) == name:
                del self.producers[tensor]
        for tensor in data["inputs"]:
            if tensor in self.uses:
                self.uses[tensor] = [use for use in self.uses[tensor] if use[0] != name]
        self.nx.remove_node(name)
        del self._place[name]

    @contextmanager
    def in_place_of(self, node: str) -> Iterator[None]:
        """Nodes added inside take `node`'s place in the order, one after another: a rewrite
        that replaces `node` (removes it and adds its replacement and helpers) leaves the
        order of the other nodes as it was, where plain additions would go after every
        node and run as late as the dependencies allow."""
        if self._placing is not None:
            raise RuntimeError("in_place_of does not nest")
        self._placing = [self._place[node], 1]
        try:
            yield
        finally:
            self._placing = None

    def remove_dead_producers(self, tensors) -> int:
        """Remove the writers of `tensors` that nothing reads any more, and so on up their
        inputs: what a rewrite stopped reading. A graph output, or a tensor a Loop/If/Scan body
        reads by name (it is listed in `uses` of no node), is never dead."""
        bodies = _read_by_bodies(
            body
            for _, data in self.nodes()
            for value in data["attrs"].values()
            for body in (value if isinstance(value, list) else [value])
            if hasattr(body, "node")
        )
        kept = set(self.outputs) | bodies
        stack, removed = [t for t in tensors if t], 0
        while stack:
            node = self.producers.get(stack.pop())
            if node is None:
                continue
            data = self.nx.nodes[node]
            if any(t in kept or self.uses.get(t) for t in data["outputs"] if t):
                continue
            self.remove_node(node)
            removed += 1
            stack.extend(t for t in data["inputs"] if t)
        return removed

    def redirect_uses(self, old: str, new: str) -> None:
        """Every reader of tensor `old` reads `new` instead (same shape and dtype)."""
        self._mutations += 1
        old_producer, new_producer = self.producers.get(old), self.producers.get(new)
        for consumer, index in self.uses.pop(old, []):
            self.nx.nodes[consumer]["inputs"][index] = new
            self.uses.setdefault(new, []).append((consumer, index))
            if old_producer is not None:
                for key, data in list(self.nx.get_edge_data(old_producer, consumer, {}).items()):
                    if data["tensor"] == old and data["index"] == index:
                        self.nx.remove_edge(old_producer, consumer, key)
            if new_producer is not None:
                self.nx.add_edge(new_producer, consumer, tensor=new, index=index)

    def rename_output(self, old: str, new: str) -> None:
        """The node that writes `old` writes `new` instead; `new` has no writer yet."""
        node = self.producers.pop(old)
        self._mutations += 1
        data = self.nx.nodes[node]
        data["outputs"] = [new if t == old else t for t in data["outputs"]]
        self.producers[new] = node
        for consumer, index in self.uses.get(new, ()):
            self.nx.add_edge(node, consumer, tensor=new, index=index)

    def topological_order(self) -> list[str]:
        """Node names in a topological order that keeps insertion order wherever it can.

        The order is kept until the graph changes (the passes ask for it once per candidate
        block, which made them quadratic in the depth)."""
        state = (self._mutations, self.nx.number_of_nodes(), self.nx.number_of_edges())
        if self._order is None or self._order[0] != state:
            order = list(nx.lexicographical_topological_sort(self.nx, key=self._place.__getitem__))
            self._order = (state, order)
        return list(self._order[1])

    def snapshot(self) -> Graph:
        """A copy the passes cannot change: its own networkx graph, node data, tensor table and
        use lists (the tensor infos, and the constants they hold, are shared: both are
        immutable)."""
        copy = nx.MultiDiGraph()
        for name, data in self.nx.nodes(data=True):
            copy.add_node(
                name,
                **{
                    **data,
                    "attrs": dict(data["attrs"]),
                    "inputs": list(data["inputs"]),
                    "outputs": list(data["outputs"]),
                },
            )
        copy.add_edges_from(self.nx.edges(keys=True, data=True))
        graph = Graph(
            self.name,
            copy,
            dict(self.tensors),
            list(self.inputs),
            list(self.outputs),
            self.opset,
            dict(self.producers),
            {tensor: list(uses) for tensor, uses in self.uses.items()},
            self.parameters,
            self.imported,
        )
        graph._place, graph._added = dict(self._place), self._added
        graph.pinned_inputs = self.pinned_inputs
        graph.import_notes = self.import_notes
        graph.upgraded_from = self.upgraded_from
        graph.import_rewrites = self.import_rewrites
        return graph


def _read_by_bodies(bodies) -> set[str]:
    """Every tensor name a node inside these subgraphs (onnx GraphProtos) reads, at any
    depth."""
    names: set[str] = set()
    for body in bodies:
        for inner in body.node:
            names.update(inner.input)
            for attr in inner.attribute:
                nested = [*attr.graphs, *([attr.g] if attr.HasField("g") else [])]
                names |= _read_by_bodies(nested)
    return names
