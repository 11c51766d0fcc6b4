"""int64 on a device without an int64 datapath: which narrowings to int32 are proven safe.

In: the graph after the passes. Out: one `Narrowing` per int64 tensor the program computes
with (the model's int64 inputs, the int64 results of its nodes, and the int64 constants they
read): its value range when one is proven, or why it may overflow int32.

Every int64 tensor is int32 on chip (`bir/dtypes.py on_chip`, docs/neuroncore.md#integers), as
the reference compiler narrows it; int64 exists only in DRAM at the model's boundary. The
narrowing is safe where the values provably fit int32:

- a constant whose values fit;
- a tensor that is only ever an index (Gather, GatherElements, GatherND, ScatterND,
  ScatterElements, OneHot): every valid index lies in (-2^31, 2^31), since no axis is that long;
- a tensor that is only ever an input the op clamps to an axis's length (Slice's starts and
  ends, which the ONNX spec clamps to [0, dim], or [-1, dim - 1] for a negative step): the
  "slice to the end" idiom's INT64_MAX (or INT64_MIN going backwards) is the clamped value, a
  position of the axis, and the lowering reads the constant whole at compile time
  (`codegen/lower/layout.py slice_params`); its range is reported clamped, within [-1, dim];
- a tensor whose range an interval analysis bounds within int32: from constants, shapes,
  element counts, ArgMax/TopK/NonZero positions, Range bounds and small integer dtypes,
  through the arithmetic (Add, Sub, Mul, Neg, Abs, Min, Max, Clip, Where, Div, Mod, CumSum,
  ReduceSum) and the ops that only move values (Reshape, Gather's data, Concat, ...).

Anything else (a model input used in arithmetic, a product whose bound passes 2^31, a cast from
a float) is reported as "may overflow int32": `report` lists it and every command prints a
`note:`. It is narrowed all the same, wrapping as a two's-complement conversion does, so a value
that does not fit makes validation fail rather than pass by an exactness the device lacks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph, Node

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

Interval = tuple[int, int] | None  # inclusive bounds; None: not bounded by the analysis

# (op_type, input index) where a tensor is an index into an axis: a valid value fits int32.
INDEX_INPUTS = frozenset(
    {
        ("Gather", 1),
        ("GatherElements", 1),
        ("GatherND", 1),
        ("ScatterND", 1),
        ("ScatterElements", 1),
        ("Scatter", 1),
        ("OneHot", 0),
    }
)

# (op_type, input index) -> the op's input whose axes bound it: a value the op clamps to an
# axis's length (ONNX Slice: starts and ends to [0, dim], [-1, dim - 1] for a negative step),
# so whatever it holds (INT64_MAX for "to the end") acts as a value in [-1, dim].
CLAMPED_INPUTS = {
    ("Slice", 1): 0,
    ("Slice", 2): 0,
}

# Ops whose outputs hold only values of their data inputs (these input indices).
_MOVES = {
    "Identity": (0,),
    "Reshape": (0,),
    "Squeeze": (0,),
    "Unsqueeze": (0,),
    "Flatten": (0,),
    "Expand": (0,),
    "Transpose": (0,),
    "Slice": (0,),
    "Gather": (0,),
    "GatherElements": (0,),
    "GatherND": (0,),
    "Tile": (0,),
    "Split": (0,),
    "DepthToSpace": (0,),
    "SpaceToDepth": (0,),
    "ReduceMax": (0,),
    "ReduceMin": (0,),
    "Max": None,  # every input
    "Min": None,
    "Concat": None,
    "ScatterND": (0, 2),
    "ScatterElements": (0, 2),
    "Where": (1, 2),
    "Pad": (0, 2),
    "TopK": (0,),
    "Sort": (0,),
}


@dataclass(frozen=True, slots=True)
class Narrowing:
    """One int64 tensor narrowed to int32: `bounds` when proven, else `reason` why it may
    overflow; `root` is the tensor the doubt comes from (itself, or an input it derives from)."""

    tensor: str
    kind: str  # "input", "constant", "computed"
    bounds: tuple[int, int] | None
    proof: str
    root: str | None = None

    @property
    def proven(self) -> bool:
        return self.root is None

    def to_json(self) -> dict:
        return {
            "tensor": self.tensor,
            "kind": self.kind,
            "proven": self.proven,
            "range": list(self.bounds) if self.bounds else None,
            "reason": self.proof,
            "root": self.root,
        }


def _fits(bounds: Interval) -> bool:
    return bounds is not None and INT32_MIN <= bounds[0] and bounds[1] <= INT32_MAX


def _dtype_range(dtype: Dtype) -> Interval:
    if dtype is Dtype.BOOL:
        return (0, 1)
    if dtype in (Dtype.INT8, Dtype.UINT8, Dtype.INT32):
        info = np.iinfo(dtype.numpy)
        return (int(info.min), int(info.max))
    return None


def _union(bounds: list[Interval]) -> Interval:
    if not bounds or any(b is None for b in bounds):
        return None
    return (min(b[0] for b in bounds), max(b[1] for b in bounds))


def _products(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    corners = [x * y for x in a for y in b]
    return (min(corners), max(corners))


def _magnitude(b: tuple[int, int]) -> int:
    return max(abs(b[0]), abs(b[1]))


class _Ranges:
    """Interval analysis over the graph's integer tensors, in topological order."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.bounds: dict[str, Interval] = {}

    def of(self, tensor: str) -> Interval:
        if not tensor:
            return None
        if tensor in self.bounds:
            return self.bounds[tensor]
        info = self.graph.tensors[tensor]
        if info.is_const:
            values = np.asarray(info.const)
            if info.dtype.is_float or values.dtype.kind not in "iub":
                return None
            if values.size == 0:
                return (0, 0)
            return (int(values.min()), int(values.max()))
        return _dtype_range(info.dtype)

    def run(self) -> dict[str, Interval]:
        for name in self.graph.topological_order():
            node = Node.of(self.graph.node(name))
            results = self._node(node)
            for index, output in enumerate(node.outputs):
                if output and output in self.graph.tensors:
                    info = self.graph.tensors[output]
                    own = _dtype_range(info.dtype)
                    self.bounds[output] = own if own is not None else results[index]
        return self.bounds

    def _node(self, node: Node) -> list[Interval]:
        outputs = len(node.outputs)
        result = self._first_output(node)
        extra: list[Interval] = [None] * (outputs - 1)
        if node.op_type == "TopK" and outputs > 1:
            extra[0] = self._positions(node, node.attr("axis", -1))
        return [result, *extra]

    def _shape(self, tensor: str) -> tuple[int, ...]:
        return tuple(self.graph.tensors[tensor].shape)

    def _positions(self, node: Node, axis: int) -> Interval:
        shape = self._shape(node.inputs[0])
        if not shape:
            return (0, 0)
        return (0, max(shape[axis] - 1, 0))

    def _first_output(self, node: Node) -> Interval:
        op, ins = node.op_type, node.inputs
        args = [self.of(t) for t in ins]
        if op in _MOVES:
            picks = range(len(ins)) if _MOVES[op] is None else _MOVES[op]
            return _union([args[i] for i in picks if i < len(ins) and ins[i]])
        if op == "Shape":
            shape = self._shape(ins[0])
            return (0, max(shape, default=0))
        if op == "Size":
            return (0, math.prod(self._shape(ins[0])))
        if op in ("ArgMax", "ArgMin"):
            return self._positions(node, node.attr("axis", 0))
        if op == "NonZero":
            return (0, max(self._shape(ins[0]), default=1) - 1)
        if op == "Cast":
            return None if self.graph.tensors[ins[0]].dtype.is_float else args[0]
        if op == "Range":
            if args[0] is None or args[1] is None:
                return None
            return (min(args[0][0], args[1][0]), max(args[0][1], args[1][1]))
        if any(b is None for b in args[: 2 if op != "Clip" else 1]):
            return None
        a = args[0]
        b = args[1] if len(args) > 1 else None
        if op == "Add":
            return (a[0] + b[0], a[1] + b[1])
        if op == "Sub":
            return (a[0] - b[1], a[1] - b[0])
        if op == "Mul":
            return _products(a, b)
        if op == "Neg":
            return (-a[1], -a[0])
        if op == "Abs":
            m = _magnitude(a)
            return (0, m)
        if op == "Div":
            m = _magnitude(a)
            return (-m, m)
        if op == "Mod":
            m = min(_magnitude(b) - 1, _magnitude(a)) if b else _magnitude(a)
            return (-m, m)
        if op == "Clip":
            low = args[1] if len(args) > 1 and ins[1] else None
            high = args[2] if len(args) > 2 and ins[2] else None
            return (
                max(a[0], low[0]) if low else a[0],
                min(a[1], high[1]) if high else a[1],
            )
        if op == "CumSum":
            shape = self._shape(ins[0])
            axis = self.graph.tensors[ins[1]].const
            n = max(shape, default=1) if axis is None else shape[int(np.asarray(axis).item())]
            return (n * min(a[0], 0), n * max(a[1], 0))
        if op == "ReduceSum":
            n = math.prod(self._shape(ins[0])) // max(math.prod(self._shape(node.outputs[0])), 1)
            return (n * min(a[0], 0), n * max(a[1], 0))
        return None


def _index_only(graph: Graph, tensor: str) -> str | None:
    """Why `tensor` fits int32 whatever it holds, when every use of it is an index input
    (`INDEX_INPUTS`) or an input its op clamps to an axis's length (`CLAMPED_INPUTS`); else
    None."""
    uses = graph.consumers(tensor)
    if not uses or tensor in graph.outputs:
        return None
    index_ops, clamped_ops = [], []
    for node_name, index in uses:
        op_type = graph.node(node_name)["op_type"]
        if (op_type, index) in INDEX_INPUTS:
            index_ops.append(op_type)
        elif (op_type, index) in CLAMPED_INPUTS:
            clamped_ops.append(op_type)
        else:
            return None
    parts = []
    if index_ops:
        parts.append("only an index (" + ", ".join(sorted(set(index_ops))) + "): a valid index")
    if clamped_ops:
        parts.append(
            ("or " if parts else "only ")
            + "a start or end of "
            + ", ".join(sorted(set(clamped_ops)))
            + ", clamped to the axis's length (ONNX spec): the clamped value"
        )
    return ", ".join(parts) + " fits int32"


def _clamped_bounds(graph: Graph, tensor: str, span: Interval) -> Interval:
    """`span` clamped as the op clamps `tensor` (to [-1, dim] of the largest axis its readers
    slice), when every use of it is a `CLAMPED_INPUTS` one; else `span` unchanged."""
    uses = graph.consumers(tensor)
    if not uses or tensor in graph.outputs:
        return span
    dims = []
    for node_name, index in uses:
        data = graph.node(node_name)
        key = (data["op_type"], index)
        if key not in CLAMPED_INPUTS:
            return span
        source = data["inputs"][CLAMPED_INPUTS[key]]
        info = graph.tensors.get(source) if source else None
        if info is None or not all(isinstance(d, int) for d in info.shape):
            return span
        dims.append(max(info.shape, default=1))
    high = max(dims)
    low_span, high_span = span if span is not None else (-1, high)
    return (min(max(low_span, -1), high), min(max(high_span, -1), high))


def narrowings(graph: Graph) -> list[Narrowing]:
    """Every int64 tensor the program computes with, and whether its narrowing is proven."""
    ranges = _Ranges(graph)
    bounds = ranges.run()
    tensors = set()
    for name in graph.topological_order():
        node = graph.node(name)
        tensors.update(t for t in (*node["inputs"], *node["outputs"]) if t)
    tensors.update(graph.inputs)
    result: list[Narrowing] = []
    roots: dict[str, str] = {}
    for name in graph.topological_order():
        node = graph.node(name)
        for output in node["outputs"]:
            if output and graph.tensors.get(output) and _is_int64(graph, output):
                roots[output] = _root(graph, node, output, bounds, roots)
    for tensor in sorted(tensors, key=_order(graph)):
        if not _is_int64(graph, tensor):
            continue
        info = graph.tensors[tensor]
        kind = "constant" if info.is_const else "input" if tensor in graph.inputs else "computed"
        index = _index_only(graph, tensor)
        span = bounds.get(tensor) if not info.is_const else ranges.of(tensor)
        if index is not None and not _fits(span):  # its proof is the index's, not the span's
            result.append(Narrowing(tensor, kind, _clamped_bounds(graph, tensor, span), index))
        elif _fits(span):
            proof = {
                "constant": "a constant that fits int32",
                "input": "an input of a dtype that fits int32",
                "computed": "bounded by the interval analysis",
            }[kind]
            result.append(Narrowing(tensor, kind, span, proof))
        elif kind == "constant":
            result.append(
                Narrowing(
                    tensor, kind, span, "a constant with values outside int32: they wrap", tensor
                )
            )
        elif kind == "input":
            readers = sorted({graph.node(n)["op_type"] for n, _ in graph.consumers(tensor)})
            why = "a model input read by " + (", ".join(readers) or "nothing")
            result.append(Narrowing(tensor, kind, None, why + ", not only as an index", tensor))
        else:
            root = roots.get(tensor, tensor)
            producer = graph.node(graph.producer(tensor))["op_type"]
            why = (
                f"{producer} whose bound {list(span)} passes int32"
                if span is not None
                else f"computed by {producer} from values without a bound"
            )
            result.append(Narrowing(tensor, kind, span, why, root))
    return result


def _is_int64(graph: Graph, tensor: str) -> bool:
    info = graph.tensors.get(tensor)
    return info is not None and info.dtype is Dtype.INT64


def _order(graph: Graph):
    position = {name: i for i, name in enumerate(graph.topological_order())}

    def key(tensor: str) -> tuple[int, str]:
        producer = graph.producer(tensor)
        return (position.get(producer, -1) if producer else -1, tensor)

    return key


def _root(graph: Graph, node: dict, output: str, bounds: dict, roots: dict) -> str:
    """The tensor an unbounded int64 `output` takes its doubt from: an int64 input of its node
    that is itself unbounded (and, recursively, its root), else `output` itself."""
    for tensor in node["inputs"]:
        if tensor and _is_int64(graph, tensor) and not _fits(bounds.get(tensor)):
            info = graph.tensors[tensor]
            if info.is_const:
                continue
            if _index_only(graph, tensor) is not None:
                continue
            return roots.get(tensor, tensor)
    return output


def narrowing_notes(found: list[Narrowing]) -> list[dict]:
    """One `note:` per root of doubt: the tensor, why, and how many derive from it."""
    doubtful = [n for n in found if not n.proven]
    notes = []
    for root in dict.fromkeys(n.root for n in doubtful):
        own = next((n for n in doubtful if n.tensor == root), None)
        derived = sum(1 for n in doubtful if n.root == root and n.tensor != root)
        why = own.proof if own else "unbounded"
        more = f"; so may {derived} tensor(s) computed from it" if derived else ""
        notes.append(
            {
                "flag": "int64",
                "message": f"{root!r} may overflow int32 when narrowed for the device ({why})"
                + more
                + " (docs/neuroncore.md#integers)",
            }
        )
    return notes
