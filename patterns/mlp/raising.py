"""LowerToNKIKernelCC: raise dot2(act(dot1(x))) MLP blocks to AwsNeuronMLPNKI
(docs/attention.md#mlp-raise).

Pure structure: no flag, no dtype gate, no cast config (`backend_config` is empty,
api_version 1). The match is rooted at the second dot, as the reference's is: every MatMul or
Gemm whose first input is reached from one projection (or two, for a gated form) through an
elementwise region (`mlp_region`: any chain of the kernel's elementwise ops, Reshapes that
keep the feature dim, scalar constants). Each projection is a MatMul or Gemm of the same x
with a 2-D weight, constant or computed, and an optional bias (Gemm's C or an Add of a
[hidden] vector) — on any subset of the projections. An Add of an [out] vector after the
second dot is its bias.

A gated form's gate and up may be the two parts of one projection, split by a Split or two
Slices along its features (docs/mlp.md#fused): the kernel reads each part in place. Between the
activation and the second dot there may be a LayerNorm or an RMSNorm over the hidden features
(the op, or written out: `norm.match_norm`, docs/mlp.md#inner-norm), raised with the block; a
norm the rules do not recognise, or a reduction inside the activation, refuses it with the
reason, and a norm of a linear function of projections (a residual stream) is not an MLP.

The region becomes the kernel's activation: a named one (relu, gelu, gelu_tanh, silu,
quick_gelu, swiglu) when the program computes it (`mlp_region.classify`, by value, so every
multiplication order matches), which the kernel runs from its lookup tables; otherwise the
program itself (GeGLU, ReGLU, HardSwish, Mish, …), which it runs step by step. A block is
refused — with the reason in its finding — when the region holds an op the kernel cannot
run, a non-scalar constant, a value used outside the block, more than two projections, or
projections of different inputs (docs/mlp.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnx2bir.graph import Graph
from onnx2bir.kernels.mlp import TARGET
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.findings import BlockFinding, Idiom, Status
from onnx2bir.patterns.matcher import validity_problem
from onnx2bir.patterns.mlp.norm import Norm
from onnx2bir.patterns.mlp.region import DOTS, Region, Source, classify, match_region
from onnx2bir.patterns.passes import PassResult, Statistic
from onnx2bir.patterns.queries import const_value

KERNEL_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "quick_gelu", "swiglu")


@dataclass
class MlpBlock:
    region: Region
    activation: str  # the name shown in reports
    x: str = ""
    w1: str = ""
    b1: str = ""
    w2: str = ""
    b2: str = ""
    w_up: str = ""
    b_up: str = ""
    trans_w1: int = 0
    trans_w_up: int = 0
    trans_w2: int = 0
    w1_offset: int = 0  # the hidden features' first column in w1 (and b1): a fused projection
    w_up_offset: int = 0
    output: str = ""
    extra_nodes: list[str] = field(default_factory=list)

    @property
    def norm(self) -> Norm | None:
        return self.region.norm

    @property
    def fused(self) -> bool:
        """Gate and up are the two parts of one projection (docs/mlp.md#fused)."""
        return any(s.split for s in self.region.sources)

    @property
    def label(self) -> str:
        """The activation, and the inner norm when there is one (`swiglu+layer_norm`)."""
        return self.activation + (f"+{self.norm.label}" if self.norm else "")

    @property
    def nodes(self) -> list[str]:
        sources = [n for s in self.region.sources for n in (s.dot, s.bias_add, s.split) if n]
        norm = self.norm.nodes if self.norm else []
        return list(
            dict.fromkeys(
                [*sources, *self.region.nodes, *norm, self.region.dot2, *self.extra_nodes]
            )
        )


def _activation_product(graph: Graph, node: str) -> bool:
    """A product of two computed batched tensors (attention's q·kᵀ or P·v): no weight, so
    no MLP starts or ends there, and it is not listed as a refused one."""
    inputs = graph.node(node)["inputs"]
    w = inputs[1] if len(inputs) > 1 else ""
    return bool(w) and const_value(graph, w) is None and len(graph.tensors[w].shape) > 2


def _dot_operands(graph: Graph, node: str) -> tuple[str, str, int, str] | str:
    """(x, weight, transB, bias) of a MatMul/Gemm with a 2-D weight, else a reason."""
    data = graph.node(node)
    x, w = data["inputs"][:2]
    if len(graph.tensors[w].shape) != 2:
        return f"{node!r} has a weight of shape {tuple(graph.tensors[w].shape)}, not 2-D"
    if len(graph.tensors[x].shape) < 1 or not graph.tensors[x].dtype.is_float:
        return f"{node!r} reads a non-float input"
    if data["op_type"] == "MatMul":
        return x, w, 0, ""
    attrs = data["attrs"]
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        return f"Gemm {node!r} has transA, alpha or beta"
    bias = data["inputs"][2] if len(data["inputs"]) > 2 else ""
    if bias and len(graph.tensors[bias].shape) != 1:
        return f"Gemm {node!r} has a C of shape {tuple(graph.tensors[bias].shape)}, not 1-D"
    return x, w, int(attrs.get("transB", 0)), bias


def _projection(graph: Graph, source: Source) -> tuple[str, str, int, str] | str:
    operands = _dot_operands(graph, source.dot)
    if isinstance(operands, str):
        return operands
    x, w, trans, bias = operands
    if bias and source.bias:
        return f"{source.dot!r} has two biases (Gemm's C and an Add)"
    return x, w, trans, bias or source.bias


def check_block(graph: Graph, region: Region) -> tuple[MlpBlock | None, str | None]:
    if region.problem:
        return None, region.problem
    activation, swap = classify(region.program)
    if swap:
        region.sources.reverse()
    block = MlpBlock(region, activation)
    projections = [_projection(graph, s) for s in region.sources]
    second = _dot_operands(graph, region.dot2)
    for operands in (*projections, second):
        if isinstance(operands, str):
            return None, operands
    block.x, block.w1, block.trans_w1, block.b1 = projections[0]
    block.w1_offset = region.sources[0].offset
    if len(projections) == 2:
        x_up, block.w_up, block.trans_w_up, block.b_up = projections[1]
        block.w_up_offset = region.sources[1].offset
        if x_up != block.x:
            return None, "gate and up projections read different inputs"
    _, block.w2, block.trans_w2, block.b2 = second
    block.output = graph.node(region.dot2)["outputs"][0]
    users = graph.consumers(block.output)
    n_out = graph.tensors[block.output].shape[-1]
    if not block.b2 and len(users) == 1 and graph.node(users[0][0])["op_type"] == "Add":
        add = users[0][0]
        other = [t for t in graph.node(add)["inputs"] if t != block.output]
        if other and tuple(graph.tensors[other[0]].shape) == (n_out,):
            block.b2 = other[0]
            block.output = graph.node(add)["outputs"][0]
            block.extra_nodes = [add]
    problem = validity_problem(graph, set(block.nodes), {block.output})
    if problem:
        return None, problem
    return block, None


def raise_block(graph: Graph, block: MlpBlock) -> None:
    """Replace the block's nodes by the kernel, which takes the place of the block's first
    node in the node order (`Graph.in_place_of`)."""
    order = {name: index for index, name in enumerate(graph.topological_order())}
    with graph.in_place_of(min(block.nodes, key=order.__getitem__)):
        _replace(graph, block)


def _replace(graph: Graph, block: MlpBlock) -> None:
    anchor = block.region.dot2
    for node in block.nodes:
        graph.remove_node(node)
    named = block.activation in KERNEL_ACTIVATIONS
    inputs = [block.x, block.w1, block.b1, block.w2, block.b2, block.w_up, block.b_up]
    attrs = {
        "custom_call_target": TARGET,
        "backend_config": "",
        "api_version": 1,
        "activation": block.activation if named else "program",
        "trans_w1": block.trans_w1,
        "trans_w2": block.trans_w2,
        "trans_w_up": block.trans_w_up if block.w_up else block.trans_w1,
    }
    if not named:
        attrs["program"] = block.region.program.to_json()
    if block.fused:
        attrs["w1_offset"] = block.w1_offset
        attrs["w_up_offset"] = block.w_up_offset
    if block.norm is not None:
        attrs["norm"] = block.norm.kind
        attrs["norm_epsilon"] = block.norm.epsilon
        inputs += [block.norm.scale, block.norm.bias]
    graph.add_node(anchor, "CustomCall", inputs, [block.output], attrs, domain="onnx2bir")


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
            if graph.node(node)["op_type"] not in DOTS or _activation_product(graph, node):
                continue
            region = match_region(graph, node)
            if region is None:
                continue
            if claimed & set(region.nodes):
                continue
            if any(_activation_product(graph, source.dot) for source in region.sources):
                continue
            block, reason = check_block(graph, region)
            if block is None:
                norm = region.norm.nodes if region.norm else []
                findings.append(
                    {
                        "nodes": [*region.nodes, *norm, node],
                        "activation": None,
                        "target": None,
                        "reason": reason,
                        "status": "refused",
                    }
                )
                continue
            claimed.update(block.nodes)
            findings.append(
                {
                    "nodes": block.nodes,
                    "activation": block.label,
                    "target": TARGET,
                    "reason": None,
                    "status": "raised",
                    "gated": bool(block.w_up),
                    "biases": [n for n, b in (("w1", block.b1), ("up", block.b_up)) if b]
                    + (["w2"] if block.b2 else []),
                    "constant_weights": all(
                        const_value(graph, w) is not None
                        for w in (block.w1, block.w2, block.w_up)
                        if w
                    ),
                    "pattern": "mlp.dot2_rooted",
                    "norm": block.norm.label if block.norm else None,
                    "fused_projection": block.fused,
                }
            )
            raise_block(graph, block)
        findings = [BlockFinding.from_json(Idiom.MLP, f) for f in findings]
        raised = sum(1 for f in findings if f.status is Status.RAISED)
        stats = [
            Statistic(
                self.name, "mlp_blocks_raised", f"Number of MLP blocks lowered to {TARGET}", raised
            ),
            Statistic(
                self.name,
                "mlp_blocks_refused",
                "Number of MLP candidates refused (the reason is in the report)",
                len(findings) - raised,
            ),
        ]
        return PassResult(raised > 0, stats, findings)
