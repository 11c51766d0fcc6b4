"""The normalisation inside a gated MLP (docs/mlp.md#inner-norm): between the activation (the
gating product of a SwiGLU, or any activation) and the down projection, a LayerNorm or an
RMSNorm over the hidden features — EVA-02's `scale_mlp`, timm's `SwiGLU(norm_layer=...)`.

In: a Graph, the tensor the down projection reads, the hidden width. Out: `match_norm` —
None when no normalisation ends at that tensor (the MLP walk goes on as before), else a `Norm`:
its kind (`layer`, `rms`), epsilon, the scale and shift vectors (tensor names, "" when
absent), the nodes it spans, the value it normalises (`input`, where the activation walk
starts) and, when it cannot be raised, the reason (`problem`, naming the node and the rule).

The rules, each a pattern (what is looked for), a check (the reason it does not hold) and what
the raise keeps of it:

- the op (docs/mlp.md#norm-op): a LayerNormalization (or opset 23's RMSNormalization) op
  over the last axis alone; scale and bias read as the op gives them.
- written out (docs/mlp.md#norm-written): the backward cone of the tensor through the ops a
  written-out norm uses (Add, Sub, Mul, Div, Pow, Sqrt, Reciprocal, Neg, ReduceMean, Identity,
  float Cast) holds a ReduceMean. Its input is the value nearest the down projection that
  every path up out of the cone passes through (a dominator of the cone's inputs in the
  reversed dataflow) and that no ReduceMean computes, directly or not: so the activation ops
  the cone took in go back to the activation. The nodes between that value and the tensor are
  the norm. Every ReduceMean there must reduce the last axis with keepdims; a per-feature
  vector may be read by one Mul (the scale) and one Add (the shift). The norm is then named
  by value: evaluated with numpy on probe rows of several scales and offsets, against
  LayerNorm and RMSNorm with each epsilon the cone adds (a scalar Add), both with the scale
  and shift found. So every order an exporter writes (`Div` by `Sqrt`, `Mul` by
  `Reciprocal`, `Pow` or `x·x`, the scale before or after) gets the same name, and a formula
  that is not one of the two (ε added after the square root, a mean over another axis, a
  scale applied twice) does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from onnx2bir.graph import Graph
from onnx2bir.patterns.queries import const_value, scalar_const

NORM_OPS = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Reciprocal",
        "Neg",
        "ReduceMean",
        "Identity",
        "Cast",
    }
)
ROW_OPS = frozenset({"LayerNormalization", "RMSNormalization"})
MAX_CONE = 40
KINDS = ("layer", "rms")


@dataclass
class Norm:
    kind: str  # "layer" or "rms" ("" when not recognised)
    input: str  # the value normalised: the activation's output
    output: str  # the normalised value the down projection reads
    nodes: list[str] = field(default_factory=list)
    epsilon: float = 0.0
    scale: str = ""
    bias: str = ""
    form: str = ""  # the op's type, or "written out"
    problem: str | None = None

    @property
    def label(self) -> str:
        return f"{self.kind or 'norm'}_norm"


def _shape(graph: Graph, tensor: str) -> tuple[int, ...]:
    return tuple(graph.tensors[tensor].shape)


def _is_vector(graph: Graph, tensor: str, width: int) -> bool:
    """A per-feature vector: a constant of `width` values along the last axis, or a computed
    rank-1 [width] tensor (a rank-1 tensor is never a row of the activation)."""
    shape = _shape(graph, tensor)
    if const_value(graph, tensor) is not None:
        return len(shape) >= 1 and shape[-1] == width and int(np.prod(shape)) == width
    return shape == (width,)


def _float_cast(graph: Graph, node: str) -> bool:
    data = graph.node(node)
    return graph.tensors[data["outputs"][0]].dtype.is_float and all(
        graph.tensors[t].dtype.is_float for t in data["inputs"][:1]
    )


def match_norm(graph: Graph, tensor: str, width: int) -> Norm | None:
    top = tensor
    wrappers = []  # Identity, float Casts and Reshapes keeping the last dim, after the norm
    while (node := graph.producer(tensor)) is not None and _transparent(graph, node, width):
        wrappers.append(node)
        tensor = graph.node(node)["inputs"][0]
    if node is None or graph.node(node)["domain"] not in ("", "ai.onnx"):
        return None
    op = graph.node(node)["op_type"]
    if op in ROW_OPS:
        norm = _norm_op(graph, node, width)
    elif op in NORM_OPS:
        norm = _written_out(graph, tensor, width)
    else:
        return None
    if norm is None:
        return None
    if norm.nodes:
        norm.nodes += wrappers[::-1]
    else:  # not found: the MLP walk goes through the wrappers and the cone
        norm.input = top
    return norm


def _transparent(graph: Graph, node: str, width: int) -> bool:
    data = graph.node(node)
    if data["domain"] not in ("", "ai.onnx") or not data["inputs"]:
        return False
    if data["op_type"] in ("Identity", "Reshape"):
        return (
            _shape(graph, data["outputs"][0])[-1:]
            == (width,)
            == _shape(graph, data["inputs"][0])[-1:]
        )
    return data["op_type"] == "Cast" and _float_cast(graph, node)


# --- the op ----------------------------------------------------------------------------------
def _norm_op(graph: Graph, node: str, width: int) -> Norm:
    """LayerNormalization / RMSNormalization over the last axis alone (docs/mlp.md#norm-op)."""
    data = graph.node(node)
    op, attrs, ins = data["op_type"], data["attrs"], data["inputs"]
    x = ins[0]
    rank = len(_shape(graph, x))
    axis = int(attrs.get("axis", -1))
    norm = Norm(
        "layer" if op == "LayerNormalization" else "rms",
        x,
        data["outputs"][0],
        [node],
        float(attrs.get("epsilon", 1e-5)),
        ins[1] if len(ins) > 1 else "",
        ins[2] if len(ins) > 2 and op == "LayerNormalization" else "",
        op,
    )
    if (axis % rank if rank else axis) != rank - 1:
        norm.problem = (
            f"{op} {node!r} normalises from axis {axis} of a rank-{rank} value, not over the "
            f"hidden features alone"
        )
        return norm
    for role, vector in (("scale", norm.scale), ("bias", norm.bias)):
        if vector and int(np.prod(_shape(graph, vector))) != width:
            norm.problem = (
                f"{op} {node!r} has a {role} of shape {_shape(graph, vector)}, not [{width}]"
            )
    return norm


# --- written out -----------------------------------------------------------------------------
def _cone(graph: Graph, tensor: str, width: int) -> tuple[list[str], set[str]] | None:
    """The nodes above `tensor` through NORM_OPS (bounded), and the per-feature vectors they
    read; None when the cone holds no ReduceMean (no norm ends here)."""
    nodes: list[str] = []
    vectors: set[str] = set()
    stack, seen = [tensor], set()
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        node = graph.producer(value)
        if node is None:
            continue
        data = graph.node(node)
        if data["op_type"] not in NORM_OPS or data["domain"] not in ("", "ai.onnx"):
            continue
        if data["op_type"] == "Cast" and not _float_cast(graph, node):
            continue
        nodes.append(node)
        if len(nodes) > MAX_CONE:
            break
        inputs = data["inputs"][:1] if data["op_type"] == "ReduceMean" else data["inputs"]
        for value_ in inputs:
            if not value_ or scalar_const(graph, value_) is not None:
                continue
            if _is_vector(graph, value_, width):
                vectors.add(value_)
            elif const_value(graph, value_) is None:
                stack.append(value_)
    if not any(graph.node(n)["op_type"] == "ReduceMean" for n in nodes):
        return None
    return nodes, vectors


def _written_out(graph: Graph, tensor: str, width: int) -> Norm | None:
    """A written-out LayerNorm or RMSNorm (module docstring, docs/mlp.md#norm-written)."""
    cone = _cone(graph, tensor, width)
    if cone is None:
        return None
    nodes, vectors = cone
    members = set(nodes)
    # The dataflow between values, reversed: from the normalised value up to the cone's inputs.
    flow = nx.DiGraph()
    flow.add_node(tensor)
    for node in nodes:
        data = graph.node(node)
        out = data["outputs"][0]
        inputs = data["inputs"][:1] if data["op_type"] == "ReduceMean" else data["inputs"]
        for value in inputs:
            if value and value not in vectors and const_value(graph, value) is None:
                flow.add_edge(out, value)
    entries = [v for v in flow if graph.producer(v) not in members]
    dominators = nx.immediate_dominators(flow, tensor)
    # The values every path up to the cone's inputs passes through, from the inputs down.
    common = None
    for entry in entries:
        chain, value = [], entry
        while True:
            chain.append(value)
            if dominators.get(value, value) == value:  # the root (networkx may leave it out)
                break
            value = dominators[value]
        common = chain if common is None else [v for v in common if v in set(chain)]
    norm = Norm("", tensor, tensor, sorted(members, key=list(graph.nx.nodes).index))
    norm.form = "written out"
    reduced = {n for n in members if graph.node(n)["op_type"] == "ReduceMean"}
    upstream = {}  # value → the ReduceMeans that compute it or a value it is computed from
    for value in common or []:
        above = nx.descendants(flow, value) | {value}
        upstream[value] = {n for n in reduced if graph.node(n)["outputs"][0] in above}
    inputs = [v for v in (common or []) if v != tensor and not upstream[v]]
    if not inputs:  # the MLP walk goes through the cone, its nodes are the region's
        norm.nodes = []
        first = min(reduced, key=list(graph.nx.nodes).index)
        norm.problem = (
            f"{_ending(graph, tensor)} (written-out norm rule): no value that every path up "
            f"from it passes through is left unreduced by ReduceMean {first!r}, so it does "
            f"not normalise one value"
        )
        return norm
    x = inputs[-1]  # the one nearest the down projection
    above = nx.descendants(flow, x) | {x}
    norm.input = x
    norm.nodes = [n for n in norm.nodes if graph.node(n)["outputs"][0] not in above]
    _name(graph, norm, width)
    return norm


def _name(graph: Graph, norm: Norm, width: int) -> None:
    """Check the norm's nodes, find its scale, shift and epsilon candidates, and name it by
    value (module docstring); sets `kind`, `epsilon`, `scale`, `bias` or `problem`."""
    rank = len(_shape(graph, norm.input))
    scales, shifts, epsilons = [], [], []
    for node in norm.nodes:
        data = graph.node(node)
        op, ins = data["op_type"], data["inputs"]
        if op == "ReduceMean":
            axes = _axes(graph, data)
            in_rank = len(_shape(graph, ins[0]))
            if axes is None or [a % in_rank for a in axes] != [in_rank - 1]:
                norm.problem = (
                    f"ReduceMean {node!r} reduces over axes {axes} of a rank-{in_rank} value, "
                    f"not over the hidden features"
                )
                return
            if not data["attrs"].get("keepdims", 1):
                norm.problem = f"ReduceMean {node!r} drops the reduced axis (keepdims = 0)"
                return
            continue
        for value in ins:
            if value and _is_vector(graph, value, width) and scalar_const(graph, value) is None:
                if op == "Mul":
                    scales.append(value)
                elif op == "Add":
                    shifts.append(value)
                else:
                    norm.problem = (
                        f"{op} {node!r} reads a per-feature vector {value!r} other than as a "
                        f"scale (Mul) or a shift (Add)"
                    )
                    return
            elif value and op == "Add" and scalar_const(graph, value) is not None:
                epsilons.append(scalar_const(graph, value))
    if len(scales) > 1 or len(shifts) > 1:
        norm.problem = (
            f"{_ending(graph, norm.output)} (written-out norm rule) reads {len(scales)} scale "
            f"and {len(shifts)} shift vectors (at most one each)"
        )
        return
    norm.scale = scales[0] if scales else ""
    norm.bias = shifts[0] if shifts else ""
    probes = _Probes(graph, norm, width, rank)
    got = probes.evaluate()
    if got is None:
        return
    for kind in KINDS:
        for eps in (*epsilons, 0.0):
            want = probes.reference(kind, eps)
            if np.allclose(got, want, rtol=1e-6, atol=1e-9):
                norm.kind, norm.epsilon = kind, float(eps)
                return
    candidates = ", ".join(f"{e:.3g}" for e in sorted(set(epsilons))) or "0"
    norm.problem = (
        f"{_ending(graph, norm.output)} (written-out norm rule) is not a LayerNorm or an "
        f"RMSNorm over the hidden features, by value (epsilon among {candidates})"
    )


def _ending(graph: Graph, tensor: str) -> str:
    """`the normalisation ending at <Op> '<node>'`, naming the node that computes `tensor`."""
    node = graph.producer(tensor)
    return f"the normalisation ending at {graph.node(node)['op_type']} {node!r}"


def _axes(graph: Graph, data: dict) -> list[int] | None:
    if "axes" in data["attrs"]:
        return [int(a) for a in data["attrs"]["axes"]]
    if len(data["inputs"]) > 1 and data["inputs"][1]:
        value = const_value(graph, data["inputs"][1])
        return None if value is None else [int(a) for a in np.ravel(value)]
    return None  # every axis (or none, with noop_with_empty_axes)


_ROW_SCALES = (1.0, 0.01, 10.0, 0.001, 1.0, 3.0)
_ROW_OFFSETS = (0.0, 0.0, 0.0, 0.0, 3.0, -0.5)


class _Probes:
    """The norm's nodes evaluated on probe rows (float64), and the references."""

    def __init__(self, graph: Graph, norm: Norm, width: int, rank: int) -> None:
        self.graph, self.norm, self.width = graph, norm, width
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((len(_ROW_SCALES), width))
        rows = rows * np.array(_ROW_SCALES)[:, None] + np.array(_ROW_OFFSETS)[:, None]
        self.x = rows.reshape((1,) * max(0, rank - 2) + rows.shape)
        self.values: dict[str, np.ndarray] = {norm.input: self.x}
        for vector in (norm.scale, norm.bias):
            if not vector:
                continue
            value = const_value(graph, vector)
            if value is None:  # a computed vector: any values will do, the same on both sides
                value = rng.uniform(0.5, 1.5, width) * rng.choice([-1.0, 1.0], width)
            self.values[vector] = np.asarray(value, np.float64).reshape(-1)[-width:]
        self.gamma = self.values.get(norm.scale, np.ones(width))
        self.beta = self.values.get(norm.bias, np.zeros(width))

    def reference(self, kind: str, eps: float) -> np.ndarray:
        x = self.x.reshape(-1, self.width)
        if kind == "layer":
            x = x - x.mean(-1, keepdims=True)
        normed = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        return normed * self.gamma + self.beta

    def value(self, tensor: str) -> np.ndarray:
        if tensor in self.values:
            return self.values[tensor]
        return np.asarray(const_value(self.graph, tensor), np.float64)

    def evaluate(self) -> np.ndarray | None:
        graph, norm = self.graph, self.norm
        with np.errstate(all="ignore"):
            for node in norm.nodes:
                data = graph.node(node)
                op, ins = data["op_type"], data["inputs"]
                if op == "ReduceMean":
                    out = self.value(ins[0]).mean(-1, keepdims=True)
                elif op in ("Identity", "Cast"):
                    out = self.value(ins[0])
                elif op == "Neg":
                    out = -self.value(ins[0])
                elif op == "Sqrt":
                    out = np.sqrt(self.value(ins[0]))
                elif op == "Reciprocal":
                    out = 1.0 / self.value(ins[0])
                else:
                    a, b = self.value(ins[0]), self.value(ins[1])
                    out = {
                        "Add": np.add,
                        "Sub": np.subtract,
                        "Mul": np.multiply,
                        "Div": np.divide,
                        "Pow": np.power,
                    }[op](a, b)
                self.values[data["outputs"][0]] = out
        got = self.values[norm.output]
        if got.size != self.x.size:
            norm.problem = (
                f"{_ending(self.graph, norm.output)} (written-out norm rule) does not keep the "
                f"shape of {norm.input!r}"
            )
            return None
        return got.reshape(-1, self.width)
