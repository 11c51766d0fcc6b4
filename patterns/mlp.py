"""LowerToNKIKernelCC: raise dot2(act(dot1(x))) MLP blocks to AwsNeuronMLPNKI
(docs/attention.md#mlp-raise).

Pure structure: no flag, no dtype gate, no cast config (`backend_config` is empty,
api_version 1). A block is MatMul or Gemm (+ an optional bias Add), an activation, MatMul or
Gemm (+ an optional bias Add); GPT-2's exports put a Reshape on either side of the
activation, which the patterns allow. Activations are small graphs matched as a whole, in
each multiplication order exporters emit (docs/attention.md#idioms):

- `Relu`, `Gelu` (the op; `approximate` decides erf or tanh),
- erf GELU `x·½·(1 + erf(x/√2))` in three orders (and with ·1/√2 instead of /√2),
- tanh GELU / GPT-2 `gelu_new` `½x·(1 + tanh(√(2/π)(x + 0.044715x³)))`, cube as Pow or x·x·x,
- SiLU `x·σ(x)`, QuickGELU `x·σ(1.702x)`,
- SwiGLU `σ(g)·g·up` with g and up two projections of the same x.

The anchor is the activation's signature op (Relu, Gelu, Erf, Tanh, Sigmoid), so matching
runs once per activation, around it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.passes import PassResult, Statistic
from onnx2bir.patterns.graph_queries import const_value, scalar_const
from onnx2bir.patterns.matcher import ANY_INDEX, Pattern, PNode, find_matches, validity_problem

TARGET = "AwsNeuronMLPNKI"
DOTS = ("MatMul", "Gemm")
SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

# name → (nodes, edges using "h" for the pre-activation and "act_out" for the last node,
#         anchor key, {node key: (input index of the constant or None, expected value)})
_Template = tuple[list[PNode], list[tuple[str, str, int]], str, dict]


def _templates() -> dict[str, _Template]:
    n = PNode.of
    erf_core = [n("scale", "Div", "Mul"), n("erf", "Erf"), n("one", "Add")]
    erf_edges = [("h", "scale", 0), ("scale", "erf", 0), ("erf", "one", ANY_INDEX)]
    erf_consts = {"one": 1.0, "half": 0.5}

    def tanh_core(cube: str) -> tuple[list[PNode], list]:
        if cube == "pow":
            nodes, edges = [n("cube", "Pow")], [("h", "cube", 0)]
        else:
            nodes = [n("square", "Mul"), n("cube", "Mul")]
            edges = [
                ("h", "square", ANY_INDEX),
                ("h", "square", ANY_INDEX),
                ("square", "cube", ANY_INDEX),
                ("h", "cube", ANY_INDEX),
            ]
        nodes += [
            n("coef", "Mul"),
            n("inner", "Add"),
            n("scale", "Mul"),
            n("tanh", "Tanh"),
            n("one", "Add"),
        ]
        edges += [
            ("cube", "coef", ANY_INDEX),
            ("h", "inner", ANY_INDEX),
            ("coef", "inner", ANY_INDEX),
            ("inner", "scale", ANY_INDEX),
            ("scale", "tanh", 0),
            ("tanh", "one", ANY_INDEX),
        ]
        return nodes, edges

    tanh_consts = {"coef": 0.044715, "scale": SQRT_2_OVER_PI, "one": 1.0, "half": 0.5}
    templates: dict[str, _Template] = {
        "relu": ([n("act_out", "Relu")], [("h", "act_out", 0)], "act_out", {}),
        "gelu_op": ([n("act_out", "Gelu")], [("h", "act_out", 0)], "act_out", {}),
        "silu": (
            [n("sigmoid", "Sigmoid"), n("act_out", "Mul")],
            [("h", "sigmoid", 0), ("sigmoid", "act_out", ANY_INDEX), ("h", "act_out", ANY_INDEX)],
            "sigmoid",
            {},
        ),
        "quick_gelu": (
            [n("scale", "Mul"), n("sigmoid", "Sigmoid"), n("act_out", "Mul")],
            [
                ("h", "scale", ANY_INDEX),
                ("scale", "sigmoid", 0),
                ("sigmoid", "act_out", ANY_INDEX),
                ("h", "act_out", ANY_INDEX),
            ],
            "sigmoid",
            {"scale": 1.702},
        ),
        # x·(1+erf)·½
        "erf_gelu_a": (
            erf_core + [n("mul_x", "Mul"), n("act_out", "Mul")],
            erf_edges
            + [
                ("one", "mul_x", ANY_INDEX),
                ("h", "mul_x", ANY_INDEX),
                ("mul_x", "act_out", ANY_INDEX),
            ],
            "erf",
            {"one": 1.0, "act_out": 0.5},
        ),
        # (1+erf)·½·x
        "erf_gelu_b": (
            erf_core + [n("half", "Mul"), n("act_out", "Mul")],
            erf_edges
            + [
                ("one", "half", ANY_INDEX),
                ("half", "act_out", ANY_INDEX),
                ("h", "act_out", ANY_INDEX),
            ],
            "erf",
            erf_consts,
        ),
        # (½x)·(1+erf)
        "erf_gelu_c": (
            erf_core + [n("half", "Mul"), n("act_out", "Mul")],
            erf_edges
            + [
                ("h", "half", ANY_INDEX),
                ("half", "act_out", ANY_INDEX),
                ("one", "act_out", ANY_INDEX),
            ],
            "erf",
            erf_consts,
        ),
    }
    for cube in ("pow", "mul"):
        nodes, edges = tanh_core(cube)
        # gelu_new: (½x)·(1+tanh)
        templates[f"tanh_gelu_{cube}_a"] = (
            nodes + [n("half", "Mul"), n("act_out", "Mul")],
            edges
            + [
                ("h", "half", ANY_INDEX),
                ("half", "act_out", ANY_INDEX),
                ("one", "act_out", ANY_INDEX),
            ],
            "tanh",
            tanh_consts,
        )
        # x·(1+tanh)·½
        templates[f"tanh_gelu_{cube}_b"] = (
            nodes + [n("mul_x", "Mul"), n("act_out", "Mul")],
            edges
            + [
                ("one", "mul_x", ANY_INDEX),
                ("h", "mul_x", ANY_INDEX),
                ("mul_x", "act_out", ANY_INDEX),
            ],
            "tanh",
            {**tanh_consts, "act_out": 0.5, "half": None},
        )
    return templates


TEMPLATES = _templates()


def _build_patterns() -> list[Pattern]:
    patterns = []
    for act, (act_nodes, act_edges, anchor, _) in TEMPLATES.items():
        for bias in (True, False):
            for reshape_in in (True, False):
                for reshape_out in (True, False):
                    nodes = [PNode.of("dot1", *DOTS), PNode.of("dot2", *DOTS), *act_nodes]
                    edges = []
                    feed = "dot1"
                    if bias:
                        nodes.append(PNode.of("bias1", "Add"))
                        edges.append((feed, "bias1", ANY_INDEX))
                        feed = "bias1"
                    if reshape_in:
                        nodes.append(PNode.of("reshape_in", "Reshape"))
                        edges.append((feed, "reshape_in", 0))
                        feed = "reshape_in"
                    edges += [(feed if a == "h" else a, b, i) for a, b, i in act_edges]
                    out = "act_out"
                    if reshape_out:
                        nodes.append(PNode.of("reshape_out", "Reshape"))
                        edges.append((out, "reshape_out", 0))
                        out = "reshape_out"
                    edges.append((out, "dot2", 0))
                    patterns.append(
                        Pattern(
                            f"mlp.{act}[bias={bias}, reshape={reshape_in}/{reshape_out}]",
                            tuple(nodes),
                            tuple(edges),
                            anchor,
                        )
                    )
    swiglu = []
    for bias in (False,):
        nodes = [
            PNode.of("dot1", *DOTS),
            PNode.of("up", *DOTS),
            PNode.of("dot2", *DOTS),
            PNode.of("sigmoid", "Sigmoid"),
            PNode.of("silu", "Mul"),
            PNode.of("gate", "Mul"),
        ]
        edges = [
            ("dot1", "sigmoid", 0),
            ("sigmoid", "silu", ANY_INDEX),
            ("dot1", "silu", ANY_INDEX),
            ("silu", "gate", ANY_INDEX),
            ("up", "gate", ANY_INDEX),
            ("gate", "dot2", 0),
        ]
        swiglu.append(Pattern(f"mlp.swiglu[bias={bias}]", tuple(nodes), tuple(edges), "sigmoid"))
    return sorted(swiglu + patterns, key=lambda p: -p.size)


PATTERNS = _build_patterns()


@dataclass
class MlpBlock:
    match: dict[str, str]
    pattern: str
    activation: str
    x: str = ""
    w1: str = ""
    b1: str = ""
    w2: str = ""
    b2: str = ""
    w_up: str = ""
    trans_w1: int = 0
    trans_w2: int = 0
    output: str = ""
    extra_nodes: tuple[str, ...] = ()

    @property
    def nodes(self) -> list[str]:
        return [*self.match.values(), *self.extra_nodes]


def _close(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=1e-3)


def _scalar_input(graph: Graph, node: str) -> float | None:
    for tensor in graph.node(node)["inputs"]:
        value = scalar_const(graph, tensor) if tensor else None
        if value is not None:
            return value
    return None


def _dot_operands(graph: Graph, node: str) -> tuple[str, str, int, str] | str:
    """(x, weight, transB, bias) of a MatMul/Gemm with a constant 2-D weight, else a reason."""
    data = graph.node(node)
    x, w = data["inputs"][:2]
    weight = const_value(graph, w)
    if weight is None or weight.ndim != 2:
        return f"{node!r} has no constant 2-D weight"
    if data["op_type"] == "MatMul":
        return x, w, 0, ""
    attrs = data["attrs"]
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        return f"Gemm {node!r} has transA, alpha or beta"
    bias = data["inputs"][2] if len(data["inputs"]) > 2 else ""
    if bias and (const_value(graph, bias) is None or const_value(graph, bias).ndim != 1):
        return f"Gemm {node!r} has a non-constant or 2-D C"
    return x, w, int(attrs.get("transB", 0)), bias


def check_block(
    graph: Graph, match: dict[str, str], pattern: str
) -> tuple[MlpBlock | None, str | None]:
    act = pattern.split(".")[1].split("[")[0]
    template_consts = TEMPLATES[act][3] if act in TEMPLATES else {}
    for key, expected in template_consts.items():
        if (
            expected is not None
            and key in match
            and not _close(_scalar_input(graph, match[key]), expected)
        ):
            return None, f"{match[key]!r} does not multiply/add by {expected:g}"
    if "scale" in match and act.startswith("erf"):
        op = graph.node(match["scale"])["op_type"]
        value = _scalar_input(graph, match["scale"])
        if not _close(value, SQRT2 if op == "Div" else 1.0 / SQRT2):
            return None, "erf argument is not x/√2"
    if "cube" in match and graph.node(match["cube"])["op_type"] == "Pow":
        if not _close(scalar_const(graph, graph.node(match["cube"])["inputs"][1]), 3.0):
            return None, "Pow exponent is not 3"
    activation = {
        "relu": "relu",
        "silu": "silu",
        "quick_gelu": "quick_gelu",
        "swiglu": "swiglu",
    }.get(act)
    if act == "gelu_op":
        approximate = graph.node(match["act_out"])["attrs"].get("approximate", "none")
        activation = "gelu_tanh" if approximate == "tanh" else "gelu"
    elif act.startswith("erf"):
        activation = "gelu"
    elif act.startswith("tanh"):
        activation = "gelu_tanh"
    block = MlpBlock(match, pattern, activation)
    first = _dot_operands(graph, match["dot1"])
    second = _dot_operands(graph, match["dot2"])
    for operands in (first, second):
        if isinstance(operands, str):
            return None, operands
    block.x, block.w1, block.trans_w1, block.b1 = first
    _, block.w2, block.trans_w2, block.b2 = second
    if "bias1" in match:
        if block.b1:
            return None, "two biases on the first projection"
        other = [
            t
            for t in graph.node(match["bias1"])["inputs"]
            if t != graph.node(match["dot1"])["outputs"][0]
        ]
        value = const_value(graph, other[0]) if other else None
        if value is None or value.ndim != 1:
            return None, "the first bias is not a constant vector"
        block.b1 = other[0]
    if "up" in match:
        up = _dot_operands(graph, match["up"])
        if isinstance(up, str):
            return None, up
        if up[0] != block.x or up[2] != block.trans_w1:
            return None, "gate and up projections read different inputs"
        block.w_up = up[1]
        if up[3]:
            return None, "biased up projection"
    block.output = graph.node(match["dot2"])["outputs"][0]
    users = graph.consumers(block.output)
    if not block.b2 and len(users) == 1 and graph.node(users[0][0])["op_type"] == "Add":
        add = users[0][0]
        other = [t for t in graph.node(add)["inputs"] if t != block.output]
        value = const_value(graph, other[0]) if other else None
        if value is not None and value.ndim == 1:
            block.b2 = other[0]
            block.output = graph.node(add)["outputs"][0]
            block.extra_nodes = (add,)
    problem = validity_problem(graph, set(block.nodes), {block.output})
    if problem:
        return None, problem
    return block, None


def raise_block(graph: Graph, block: MlpBlock) -> None:
    anchor = block.match["dot2"]
    for node in block.nodes:
        graph.remove_node(node)
    graph.add_node(
        anchor,
        "CustomCall",
        [block.x, block.w1, block.b1, block.w2, block.b2, block.w_up, ""],
        [block.output],
        {
            "custom_call_target": TARGET,
            "backend_config": "",
            "api_version": 1,
            "activation": block.activation,
            "trans_w1": block.trans_w1,
            "trans_w2": block.trans_w2,
        },
        domain="onnx2bir",
    )


_ANCHOR_OPS = {"Relu", "Gelu", "Erf", "Tanh", "Sigmoid"}


def _near(graph: Graph, node: str, step, hops: int) -> bool:
    """Whether a MatMul or Gemm lies within `hops` steps of `node` in one direction."""
    frontier = {node}
    for _ in range(hops):
        frontier = {other for current in frontier for other in step(current)}
        if any(graph.node(other)["op_type"] in DOTS for other in frontier):
            return True
    return False


@dataclass(frozen=True)
class LowerToNKIKernelCC:
    """Raise MLP dot chains to the AwsNeuronMLPNKI kernel (docs/attention.md#mlp-raise)."""

    name: str = "LowerToNKIKernelCC"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        findings = []
        claimed: set[str] = set()
        for node in graph.topological_order():
            if node not in graph.nx or node in claimed:
                continue
            if graph.node(node)["op_type"] not in _ANCHOR_OPS:
                continue
            block, reason = self._match(graph, node, claimed)
            if block is None:
                if reason:
                    findings.append(
                        {"nodes": [node], "activation": None, "target": None, "reason": reason}
                    )
                continue
            claimed.update(block.nodes)
            findings.append(
                {
                    "nodes": block.nodes,
                    "activation": block.activation,
                    "target": TARGET,
                    "reason": None,
                    "pattern": block.pattern,
                }
            )
            raise_block(graph, block)
        raised = sum(1 for f in findings if f["target"])
        stats = [
            Statistic(
                self.name, "mlp_blocks_raised", f"Number of MLP blocks lowered to {TARGET}", raised
            )
        ]
        return PassResult(raised > 0, stats, findings)

    @staticmethod
    def _match(graph: Graph, anchor: str, claimed: set[str]):
        if not (
            _near(graph, anchor, graph.nx.successors, 6)
            and _near(graph, anchor, graph.nx.predecessors, 6)
        ):
            return None, None  # no projection on one side: a CNN activation, not an MLP
        first_reason = None
        for pattern in PATTERNS:
            for match in find_matches(graph, pattern, anchor, radius=12):
                if claimed & set(match.values()):
                    continue
                block, reason = check_block(graph, match, pattern.name)
                if block is not None:
                    return block, None
                first_reason = first_reason or reason
        return None, first_reason
