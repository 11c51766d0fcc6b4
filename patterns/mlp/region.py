"""The MLP raise's structural match (docs/mlp.md): rooted at the second dot, the elementwise
region between it and the projections that feed it, read as a small program.

In: a Graph and a MatMul/Gemm node `dot2`. Out: `match_region` — None when the node is not
the end of an MLP (no projection reaches its input through elementwise ops), else a
`Region`: the projections (one, or two for a gated form; each a MatMul/Gemm with an optional
bias Add), the region's nodes, and the `Program` the kernel runs on the projections' outputs,
or the reason the region cannot be raised. The region must be closed: every path up from
dot2 through elementwise ops ends at a projection (or a constant); a path that reaches a
norm, a reduction or a graph input means dot2 is not the end of an MLP.

Elementwise ops the program spells: the ScalarE functions (Relu, Sigmoid, Tanh, Exp, Abs, Sign,
Erf, Softplus, Gelu by its `approximate`), Sqrt and Reciprocal (VectorE x ^ 0.5 and 1 / x:
ScalarE takes them only on part of the line, docs/neuroncore.md#rules), Neg, HardSigmoid,
HardSwish, Mish, LeakyRelu, Clip with constant bounds, Add/Sub/Mul/Div/Max/Min of two region
values or of a region value and a scalar constant, Pow by a scalar, and Identity, float Cast
and a Reshape that keeps the last dim (transparent). Anything else inside the region, a
non-scalar constant, or a region value used outside it refuses the block with the reason.

`classify` names a program by evaluating it (numpy, on a probe range) against the activations
the kernel has lookup-table paths for — relu, gelu, gelu_tanh, silu, quick_gelu, and the gated
swiglu — so every multiplication order an exporter writes gets the same name; any other
program keeps the generic name and the kernel runs it step by step (GeGLU, ReGLU, HardSwish,
Mish, …).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from onnx2bir.graph import Graph
from onnx2bir.patterns.mlp.norm import ROW_OPS, Norm, match_norm
from onnx2bir.patterns.queries import const_value, scalar_const

DOTS = ("MatMul", "Gemm")
MAX_REGION = 40
UNARY = {
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Exp": "exp",
    "Abs": "abs",
    "Sign": "sign",
    "Erf": "erf",
    "Softplus": "softplus",
}
BINARY = {
    "Add": "add",
    "Sub": "subtract",
    "Mul": "multiply",
    "Div": "divide",
    "Max": "max",
    "Min": "min",
    "Pow": "pow",
}
TRANSPARENT = ("Identity", "Cast", "Reshape")
# Elementwise by ONNX but without a kernel step: the walk goes through them to find the
# projections, so the refusal can name the op.
OTHER_ELEMENTWISE = frozenset(
    {
        "Floor",
        "Ceil",
        "Round",
        "Sin",
        "Cos",
        "Log",  # ScalarE's log needs its argument scaled into range (codegen/act_range.py)
        "Elu",
        "Selu",
        "Celu",
        "ThresholdedRelu",
        "PRelu",
        "Shrink",
        "Where",
        "Mod",
        "Atan",
        "Asinh",
        "Sinh",
        "Cosh",
    }
)


@dataclass(frozen=True, slots=True)
class Step:
    """dst = func(a) ("act"), a ⊙ value ("scalar", value ⊙ a when reverse), a ⊙ b ("tensor")."""

    kind: str
    dst: int
    a: int
    func: str
    b: int = -1
    value: float = 0.0
    reverse: bool = False

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True)
class Program:
    """Registers 0 (and 1, gated) hold the projections; each step writes a new register."""

    sources: int
    steps: tuple[Step, ...]
    out: int

    @property
    def registers(self) -> int:
        return self.sources + len(self.steps)

    def to_json(self) -> str:
        return json.dumps(
            {"sources": self.sources, "out": self.out, "steps": [s.to_json() for s in self.steps]}
        )

    def evaluate(self, *sources: np.ndarray) -> np.ndarray:
        regs = [np.asarray(s, np.float64) for s in sources]
        for step in self.steps:
            a = regs[step.a]
            if step.kind == "act":
                regs.append(_ACT[step.func](a))
            else:
                b = regs[step.b] if step.kind == "tensor" else step.value
                x, y = (b, a) if step.reverse else (a, b)
                with np.errstate(all="ignore"):
                    regs.append(_ALU[step.func](x, y))
        return regs[self.out]


_erf = np.vectorize(math.erf)
_ACT = {
    "copy": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "abs": np.abs,
    "sign": np.sign,
    "erf": _erf,
    "softplus": lambda x: np.logaddexp(0, x),
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
}
_ALU = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "pow": np.power,
}
NAMED = {
    "relu": (1, _ACT["relu"]),
    "gelu": (1, _ACT["gelu"]),
    "gelu_tanh": (1, _ACT["gelu_tanh"]),
    "silu": (1, _ACT["silu"]),
    "quick_gelu": (1, lambda x: x / (1 + np.exp(-1.702 * x))),
    "swiglu": (2, lambda g, u: _ACT["silu"](g) * u),
    # no lookup table in the kernel (it runs the program), named for the report
    "hardswish": (1, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "mish": (1, lambda x: x * np.tanh(np.logaddexp(0, x))),
}
GATED_NAMES = {"relu": "reglu", "gelu": "geglu", "gelu_tanh": "geglu_tanh", "silu": "swiglu"}
_PROBE = np.linspace(-6.0, 6.0, 241)
_PROBE_UP = np.cos(3.0 * _PROBE) + 0.5


def classify(program: Program) -> tuple[str, bool]:
    """(name, swap): a named activation the program computes (swap: its sources reversed),
    else a generic name ("glu:<steps>" or "elementwise:<steps>") listing its step functions."""
    for swap in (False, True) if program.sources == 2 else (False,):
        args = (_PROBE, _PROBE_UP)[: program.sources]
        got = program.evaluate(*(args[::-1] if swap else args))
        if not np.all(np.isfinite(got)):
            continue
        for name, (arity, fn) in NAMED.items():
            if arity == program.sources and np.allclose(got, fn(*args), rtol=1e-5, atol=1e-5):
                return name, swap
        if program.sources == 2:
            for act, name in GATED_NAMES.items():
                if np.allclose(got, _ACT[act](_PROBE) * _PROBE_UP, rtol=1e-5, atol=1e-5):
                    return name, swap
    funcs = "+".join(s.func for s in program.steps) or "identity"
    return ("glu:" if program.sources == 2 else "elementwise:") + funcs, False


# --- the walk --------------------------------------------------------------------------------
@dataclass
class Source:
    """A projection feeding the region: dot(x, w) [+ bias], or one part of a fused projection
    split along its features (`split`: the Split or Slice node; `offset`: the part's first
    feature in the projection's output, its weight's columns and its bias)."""

    dot: str
    output: str  # the value the region reads (after the bias Add, if any)
    bias_add: str = ""  # the absorbed bias Add node
    bias: str = ""  # the bias vector (Gemm's C or the Add's other input)
    offset: int = 0
    split: str = ""


@dataclass
class Region:
    dot2: str
    sources: list[Source] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # elementwise nodes, topological order
    program: Program | None = None
    problem: str | None = None
    norm: Norm | None = None  # the normalisation between the activation and dot2 (norm.py)


def _float_rank_shape(graph: Graph, tensor: str) -> tuple[int, ...]:
    return tuple(graph.tensors[tensor].shape)


def _source(graph: Graph, tensor: str, width: int) -> Source | None:
    """The projection producing `tensor`, through an optional bias Add of a [width] vector; or
    a part of one fused projection (a Split or Slice along its features, docs/mlp.md#fused)."""
    node = graph.producer(tensor)
    if node is None:
        return None
    data = graph.node(node)
    if data["op_type"] in ("Split", "Slice") and data["domain"] in ("", "ai.onnx"):
        offset = _part_offset(graph, node, tensor)
        whole = data["inputs"][0]
        if offset is None or _float_rank_shape(graph, tensor)[-1:] != (width,):
            return None
        inner = _projection_source(graph, whole, _float_rank_shape(graph, whole)[-1])
        if inner is None:
            return None
        return Source(inner.dot, tensor, inner.bias_add, inner.bias, offset, node)
    return _projection_source(graph, tensor, width)


def _projection_source(graph: Graph, tensor: str, width: int) -> Source | None:
    node = graph.producer(tensor)
    if node is None:
        return None
    data = graph.node(node)
    if data["op_type"] in DOTS:
        return Source(node, tensor)
    if data["op_type"] != "Add":
        return None
    for index, value in enumerate(data["inputs"]):
        dot = graph.producer(value)
        other = data["inputs"][1 - index]
        if (
            dot is not None
            and graph.node(dot)["op_type"] in DOTS
            and _float_rank_shape(graph, other) == (width,)
        ):
            return Source(dot, tensor, node, other)
    return None


def _part_offset(graph: Graph, node: str, tensor: str) -> int | None:
    """The first feature of output `tensor` of a Split or Slice along the last axis (step 1)
    of its input; None for any other split."""
    data = graph.node(node)
    shape = _float_rank_shape(graph, data["inputs"][0])
    rank = len(shape)
    if not rank:
        return None
    if data["op_type"] == "Split":
        if int(data["attrs"].get("axis", 0)) % rank != rank - 1:
            return None
        outputs = data["outputs"]
        index = outputs.index(tensor)
        return sum(_float_rank_shape(graph, t)[-1] for t in outputs[:index])
    values = [const_value(graph, t) if t else None for t in [*data["inputs"], "", "", "", ""][1:5]]
    starts, ends, axes, steps = values
    if starts is None or ends is None or starts.size != 1:
        return None
    if data["inputs"][3:4] and data["inputs"][3] and axes is None:
        return None
    if data["inputs"][4:5] and data["inputs"][4] and (steps is None or int(steps.ravel()[0]) != 1):
        return None
    axis = int(axes.ravel()[0]) if axes is not None else 0
    if axis % rank != rank - 1:
        return None
    start = int(starts.ravel()[0])
    return min(max(start + shape[-1] if start < 0 else start, 0), shape[-1])


def match_region(graph: Graph, dot2: str) -> Region | None:
    data = graph.node(dot2)
    start = data["inputs"][0]
    shape = _float_rank_shape(graph, start)
    if not shape:
        return None
    width = shape[-1]
    region = Region(dot2)
    norm = match_norm(graph, start, width)
    if norm is not None:  # the walk starts at the value the norm reads (docs/mlp.md#inner-norm)
        region.norm = norm
        start = norm.input
    registers: dict[str, int] = {}
    nodes: list[str] = []
    blockers: list[str] = []
    nonlinear = False  # an op other than a sum or a product by a constant (`_linear`)
    reduced = False  # a normalisation or a reduction crossed inside the activation
    stack, seen = [start], set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        source = _source(graph, tensor, width)
        if source is not None:
            region.sources.append(source)
            continue
        node = graph.producer(tensor)
        if node is None:
            return None  # a graph input reaches dot2 other than through a projection
        op = graph.node(node)["op_type"]
        if op in DOTS:
            continue
        if op in ROW_OPS or op == "ReduceMean":
            blockers.append(
                f"{op} {node!r} reduces over the hidden features inside the activation: the "
                f"kernel computes the activation a tile of hidden features at a time, and takes "
                f"a normalisation only between the activation and the down projection"
            )
            stack.append(graph.node(node)["inputs"][0])
            reduced = True
            continue
        if not _elementwise(graph, node, width):
            if op not in OTHER_ELEMENTWISE:
                return None  # the chain is open (a norm, a reduction, ...): not an MLP
            blockers.append(f"{op} {node!r} is elementwise but has no MLP kernel step")
            nonlinear = True
            stack.extend(
                t for t in graph.node(node)["inputs"] if t and const_value(graph, t) is None
            )
            continue
        nodes.append(node)
        nonlinear = nonlinear or not _linear(graph, node)
        if len(nodes) > MAX_REGION:
            return None
        for value in graph.node(node)["inputs"]:
            if value and scalar_const(graph, value) is None and const_value(graph, value) is None:
                stack.append(value)
            elif value and scalar_const(graph, value) is None and op not in TRANSPARENT:
                shape_ = _float_rank_shape(graph, value)
                blockers.append(f"{op} {node!r} reads a non-scalar constant {shape_}")
    if not region.sources or not (nodes or blockers):
        return None  # dot2 is not fed by projection → elementwise chain → it: not an MLP
    if (norm is not None or reduced) and not nonlinear:
        # A norm of a sum of projections (and constants): a transformer's residual stream
        # normalised before the next dot, not an MLP's activation (docs/mlp.md#inner-norm).
        return None
    # The region's own dependency order (every path between two of its nodes runs inside
    # it: its sources are projections of the block's input), ties kept in graph order.
    members = set(nodes)
    rank = {n: i for i, n in enumerate(graph.nx.nodes) if n in members}
    order = list(
        nx.lexicographical_topological_sort(graph.nx.subgraph(members), key=rank.__getitem__)
    )
    region.nodes = order
    if norm is not None and norm.problem:
        blockers.insert(0, norm.problem)
    if blockers:
        region.problem = blockers[0]
        return region
    if len(region.sources) > 2:
        region.problem = f"{len(region.sources)} projections feed the chain (at most 2: gated)"
        return region
    region.sources.sort(key=lambda s: order.index(_first_user(graph, s.output, order)))
    for index, source in enumerate(region.sources):
        registers[source.output] = index
    try:
        region.program = _program(graph, order, registers, start)
    except ValueError as exc:
        region.problem = str(exc)
    return region


def _linear(graph: Graph, node: str) -> bool:
    """Whether the op is linear in the region's values: a sum, a difference, a negation, a
    product or quotient by a constant, or a transparent op."""
    data = graph.node(node)
    op = data["op_type"]
    if op in ("Add", "Sub", "Neg", *TRANSPARENT):
        return True
    if op in ("Mul", "Div"):
        return any(
            const_value(graph, t) is not None for t in data["inputs"][1 if op == "Div" else 0 :]
        )
    return False


def _first_user(graph: Graph, tensor: str, order: list[str]) -> str:
    users = [user for user, _ in graph.consumers(tensor) if user in order]
    return min(users, key=order.index) if users else order[0]


def _elementwise(graph: Graph, node: str, width: int) -> bool:
    data = graph.node(node)
    op = data["op_type"]
    if data["domain"] not in ("", "ai.onnx"):
        return False
    if op == "Reshape" or op == "Identity":
        return _float_rank_shape(graph, data["outputs"][0])[-1:] == (width,)
    if op == "Cast":
        return graph.tensors[data["outputs"][0]].dtype.is_float
    return (
        op in UNARY
        or op in BINARY
        or op in ("Gelu", "Neg", "HardSigmoid", "HardSwish", "Mish", "LeakyRelu", "Clip")
        or op in ("Sqrt", "Reciprocal")
    )


def _program(graph: Graph, order: list[str], registers: dict[str, int], out: str) -> Program:
    steps: list[Step] = []
    count = len(set(registers.values()))
    sources = count

    def emit(kind: str, a: int, func: str, **kw) -> int:
        nonlocal count
        steps.append(Step(kind, count, a, func, **kw))
        count += 1
        return count - 1

    def reg(tensor: str) -> int:
        if tensor not in registers:
            raise ValueError(f"{tensor!r} is computed outside the MLP")
        return registers[tensor]

    for node in order:
        data = graph.node(node)
        op, attrs, ins = data["op_type"], data["attrs"], [t for t in data["inputs"]]
        result = data["outputs"][0]
        if op in TRANSPARENT:
            registers[result] = reg(ins[0])
            continue
        if op in UNARY:
            registers[result] = emit("act", reg(ins[0]), UNARY[op])
        elif op == "Gelu":
            func = "gelu_tanh" if attrs.get("approximate", "none") == "tanh" else "gelu"
            registers[result] = emit("act", reg(ins[0]), func)
        elif op == "Neg":
            registers[result] = emit("scalar", reg(ins[0]), "multiply", value=-1.0)
        elif op == "Sqrt":
            registers[result] = emit("scalar", reg(ins[0]), "pow", value=0.5)
        elif op == "Reciprocal":
            registers[result] = emit("scalar", reg(ins[0]), "divide", value=1.0, reverse=True)
        elif op in ("HardSigmoid", "HardSwish"):
            x = reg(ins[0])
            alpha, beta = (
                (attrs.get("alpha", 0.2), attrs.get("beta", 0.5))
                if op == "HardSigmoid"
                else (1 / 6, 0.5)
            )
            t = emit("scalar", x, "multiply", value=alpha)
            t = emit("scalar", t, "add", value=beta)
            t = emit("scalar", t, "max", value=0.0)
            t = emit("scalar", t, "min", value=1.0)
            registers[result] = t if op == "HardSigmoid" else emit("tensor", x, "multiply", b=t)
        elif op == "Mish":
            x = reg(ins[0])
            t = emit("act", emit("act", x, "softplus"), "tanh")
            registers[result] = emit("tensor", x, "multiply", b=t)
        elif op == "LeakyRelu":
            x = reg(ins[0])
            t = emit("scalar", x, "multiply", value=attrs.get("alpha", 0.01))
            registers[result] = emit("tensor", x, "max", b=t)
        elif op == "Clip":
            x = reg(ins[0])
            for index, func in ((1, "max"), (2, "min")):
                if len(ins) > index and ins[index]:
                    bound = scalar_const(graph, ins[index])
                    if bound is None:
                        raise ValueError(f"Clip {node!r} has a computed bound")
                    x = emit("scalar", x, func, value=bound)
            registers[result] = x if x != reg(ins[0]) else emit("act", x, "copy")
        else:  # binary
            func = BINARY[op]
            a, b = ins[:2]
            value_a, value_b = scalar_const(graph, a), scalar_const(graph, b)
            if value_a is None and value_b is None:
                if func == "pow":
                    raise ValueError(f"Pow {node!r} raises to a computed power")
                registers[result] = emit("tensor", reg(a), func, b=reg(b))
            elif value_b is not None:
                registers[result] = emit("scalar", reg(a), func, value=value_b)
            else:
                registers[result] = emit("scalar", reg(b), func, value=value_a, reverse=True)
    return Program(sources, tuple(steps), reg(out))
