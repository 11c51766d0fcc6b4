"""The emulating oracle: onnxruntime computing what the device computes.

In: the model as imported and folded (its weights held aside), the compile's `CastPlan`, and
optionally the machine's own values of some rounded intermediates (`resync`). Out: an ONNX
model that is the same graph with every value the machine rounds passed through the same
rounding at the same point, and its outputs run on onnxruntime with graph optimisations off
(docs/validation.md#the-emulating-oracle).

A cast point (node N reads tensor T rounded to dtype d) becomes

    T ─ round_d ─▶ N      (N's other inputs and T's other readers unchanged)

where round_d is onnxruntime's own Cast to the narrow type and back for bfloat16 (opset 13
and later) and float16 — it rounds to nearest, ties to even, as the machine does — and an
exact arithmetic rounding otherwise (`rounding_nodes`): float8 e4m3 (which Cast reaches only
from opset 19, without the device's saturation), tfloat32 (which has no ONNX type), and
bfloat16 before opset 13. Roundings need opset 9 (Where, IsNaN); a model older than that cannot
be emulated (`MIN_OPSET`).

Resynchronisation. The machine and onnxruntime sum in different orders, so a value the
machine rounds can sit a few fp32 ULPs from onnxruntime's and round the other way; such a
flip moves one element by a whole ULP of the narrow type, and downstream it is summed with
others, so in a deep network flips beget flips until the two sides differ by as much as the
narrow type's own error (measured: light resnet50's logits). So for every intermediate the
machine stores and the plan names (a `Probe`: each rounded tensor, and each matmul's or
convolution's output), the oracle continues from the machine's own value — every reader of T,
its rounding included, reads a graph input fed with the machine's T — and the verdict checks
that value against onnxruntime's T at the fp32 bound (`runtime/oracle/verdict.py`), with the
reduction's own summation-order allowance (`accumulation_allowance_nodes`). Every segment
between two probes is then checked on its own, and neither a flip nor a cancellation of two
large sums can carry an fp32 difference further.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.cast_plan import CastPlan, CastPoint
from onnx2bir.errors import UserError
from onnx2bir.graph import Graph
from onnx2bir.op_traits import traits
from onnx2bir.runtime.oracle.ort import run_onnxruntime
from onnx2bir.runtime.oracle.tolerance import reduction_length

MACHINE_SUFFIX = "::machine"  # the graph input that carries the machine's value of a tensor
ALLOWANCE_SUFFIX = "::flip_allowance"  # a kernel boundary's allowance (`flip_allowance_nodes`)
ACCUMULATION_SUFFIX = "::accumulation_allowance"  # a reduction's (`accumulation_allowance_nodes`)
CAST_OPSET_BF16 = 13  # Cast to and from bfloat16 exists from opset 13
MIN_OPSET = 9  # Where and IsNaN, which the arithmetic rounding needs
IR_VERSION_OPSET_13 = 7  # the first IR version that may import opset 13


class Format:
    """A float format as an exact rounding: `precision` significant bits, smallest normal
    exponent `min_exponent`, and what a value past `max_finite` becomes."""

    def __init__(self, precision: int, min_exponent: int, max_finite: float, saturates: bool):
        self.precision = precision
        self.min_exponent = min_exponent
        self.max_finite = max_finite
        self.saturates = saturates


FORMATS = {
    "bfloat16": Format(8, -126, float(np.finfo(np.float32).max), False),
    "float16": Format(11, -14, 65504.0, False),
    "tfloat32": Format(11, -126, float(np.finfo(np.float32).max), False),
    # The device's conversion to fp8 e4m3 saturates at ±448 (docs/autocast.md#rounding).
    "float8_e4m3": Format(4, -6, 448.0, True),
}
_CAST_TYPES = {"bfloat16": TensorProto.BFLOAT16, "float16": TensorProto.FLOAT16}


def rounding_nodes(
    source: str, result: str, dtype: str, opset: int, prefix: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes (and their constants) that compute `result` = `source` (float32) rounded to
    `dtype` and read back as float32: a Cast pair where onnxruntime's Cast rounds as the
    device does, else the exact arithmetic rounding of `arithmetic_rounding`."""
    cast_type = _CAST_TYPES.get(dtype)
    if cast_type is not None and (dtype != "bfloat16" or opset >= CAST_OPSET_BF16):
        narrow = f"{prefix}/narrow"
        return [
            helper.make_node("Cast", [source], [narrow], to=cast_type, name=f"{prefix}/cast"),
            helper.make_node(
                "Cast", [narrow], [result], to=TensorProto.FLOAT, name=f"{prefix}/widen"
            ),
        ], []
    return arithmetic_rounding(source, result, FORMATS[dtype], prefix)


class _Builder:
    """Appends ONNX nodes and float32 constants with names under one prefix."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.consts: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, tag: str) -> str:
        self._count += 1
        return f"{self.prefix}/{tag}{self._count}"

    def const(self, value: float) -> str:
        tensor = numpy_helper.from_array(np.array(value, np.float32), self.name("c"))
        self.consts.append(tensor)
        return tensor.name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def quantum(self, x: str, fmt: Format) -> str:
        """The spacing of `fmt`'s values around x: 2^(e − precision + 1), e = floor(log2|x|)
        exactly (Log's guess corrected by comparing |x| with 2^e and 2^(e+1)), at least the
        format's smallest normal exponent (below it the spacing is that of subnormals)."""
        two, one = self.const(2.0), self.const(1.0)
        magnitude = self.op("Abs", x)
        guess = self.op("Floor", self.op("Mul", self.op("Log", magnitude), self.const(1 / LN2)))
        below = self.op("Less", magnitude, self.op("Pow", two, guess))
        guess = self.op("Sub", guess, self.op("Cast", below, to=TensorProto.FLOAT))
        # |x| >= 2^(e+1), spelled Not(Less) (NaN is handled by the callers).
        reach = self.op("Pow", two, self.op("Add", guess, one))
        above = self.op("Not", self.op("Less", magnitude, reach))
        exponent = self.op("Add", guess, self.op("Cast", above, to=TensorProto.FLOAT))
        exponent = self.op("Max", exponent, self.const(float(fmt.min_exponent)))
        return self.op("Pow", two, self.op("Sub", exponent, self.const(float(fmt.precision - 1))))

    def round_half_even(self, y: str) -> str:
        """y rounded to the nearest integer, ties to even, without the Round op (opset 11):
        f = Floor(y), d = y − f (exact: |y| < 2^24 here); up when d > 1/2, or d = 1/2 and f
        is odd (f − 2·Floor(f/2) = 1)."""
        half = self.const(0.5)
        floor = self.op("Floor", y)
        fraction = self.op("Sub", y, floor)
        over = self.op("Greater", fraction, half)
        tie = self.op(
            "And",
            self.op("Not", self.op("Less", fraction, half)),
            self.op("Not", over),
        )
        halved = self.op("Floor", self.op("Mul", floor, half))
        parity = self.op("Sub", floor, self.op("Add", halved, halved))
        odd = self.op("Greater", parity, half)
        up = self.op("Or", over, self.op("And", tie, odd))
        return self.op("Add", floor, self.op("Cast", up, to=TensorProto.FLOAT))

    def is_special(self, x: str) -> str:
        """NaN or ±inf, without IsInf (opset 10): |x| > the largest finite float32."""
        largest = self.const(float(np.finfo(np.float32).max))
        return self.op("Or", self.op("IsNaN", x), self.op("Greater", self.op("Abs", x), largest))


LN2 = math.log(2.0)


def arithmetic_rounding(
    source: str, result: str, fmt: Format, prefix: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """x rounded to nearest, ties to even, on `fmt.precision` significant bits, in float32
    arithmetic that is exact at every step:

        q = the format's spacing at x (`_Builder.quantum`, a power of two: x/q, r·q exact)
        r = sign(x) · rint(|x| / q) · q    (half to even, `_Builder.round_half_even`)

    then ±inf and NaN pass through and a value past the largest finite one becomes ±inf, or
    ±max for a saturating format (fp8 e4m3). Only ops of opset 9 (Where, IsNaN) and before,
    whose meaning has not changed since, so it runs in any model from opset 9 on."""
    b = _Builder(prefix)
    quantum = b.quantum(source, fmt)
    magnitude = b.op("Abs", source)
    rounded = b.op("Mul", b.round_half_even(b.op("Div", magnitude, quantum)), quantum)
    # The sign goes back on last, by a product, so that -0 and a negative value rounding to
    # zero stay -0 (1/x < 0 holds for every negative x, -0 included; onnxruntime's Where turns
    # a -0 taken from its first branch into +0, so the sign is not chosen with Where).
    negative = b.op("Less", b.op("Div", b.const(1.0), source), b.const(0.0))
    twice = b.op("Mul", b.op("Cast", negative, to=TensorProto.FLOAT), b.const(2.0))
    rounded = b.op("Mul", rounded, b.op("Sub", b.const(1.0), twice))
    rounded = b.op("Where", b.is_special(source), source, rounded)
    if fmt.saturates:
        limit = b.const(fmt.max_finite)
        clipped = b.op("Min", b.op("Max", rounded, b.op("Neg", limit)), limit)
        rounded = b.op("Where", b.op("IsNaN", source), source, clipped)
    else:
        past = b.op("Greater", b.op("Abs", rounded), b.const(fmt.max_finite))
        infinity = b.op("Mul", b.op("Sign", source), b.const(float("inf")))
        rounded = b.op("Where", past, infinity, rounded)
    b.nodes.append(helper.make_node("Identity", [rounded], [result], name=f"{prefix}/result"))
    return b.nodes, b.consts


# How far the machine's value of a kernel-internal operand may sit from onnxruntime's, relative
# to the value and to the tensor's RMS: 2^-16. Measured between the machine and onnxruntime on
# every probed fp32 intermediate of the zoo: at most 1.4e-6 absolute on values of RMS about 1
# (2^-19.4), so the margin is about ten (docs/validation.md#kernel-boundaries).
FLIP_REACH = 2.0**-16


def flip_allowance_nodes(
    node: onnx.NodeProto, position: int, operand: str, dtype: str, result: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing, for each element of `node`'s output, the most that roundings of
    `operand` (input `position`) in the other direction can change it: the roundings whose
    value lies within FLIP_REACH·(|t| + rms(t)) of a half-way point, each a step of one spacing.
    It is `node` itself applied to A = spacing·[t near a half-way point] and to the absolute
    values of its other operand, without a bias."""
    fmt = FORMATS[dtype]
    b = _Builder(result)
    t = operand
    quantum = b.quantum(t, fmt)
    scaled = b.op("Div", t, quantum)
    offset = b.op("Sub", b.op("Sub", scaled, b.op("Floor", scaled)), b.const(0.5))
    distance = b.op("Mul", b.op("Abs", offset), quantum)
    rms = b.op("Sqrt", b.op("ReduceMean", b.op("Mul", t, t), keepdims=0))
    reach = b.op("Mul", b.op("Add", b.op("Abs", t), rms), b.const(FLIP_REACH))
    near = b.op("Cast", b.op("Not", b.op("Less", reach, distance)), to=TensorProto.FLOAT)
    steps = b.op("Mul", near, quantum)
    steps = b.op("Where", b.op("IsNaN", steps), b.const(0.0), steps)
    clone = onnx.NodeProto()
    clone.CopyFrom(node)
    clone.name = b.name("bound")
    inputs = list(clone.input)
    keep = 2 if clone.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose") else len(inputs)
    inputs = inputs[:keep]
    other = 1 - position
    inputs[position] = steps
    inputs[other] = b.op("Abs", inputs[other])
    if clone.op_type == "Gemm":  # C is required before opset 11: a zero that broadcasts
        inputs.append(b.const(0.0))
    del clone.input[:]
    clone.input.extend(inputs)
    del clone.output[:]
    clone.output.append(result)
    for attr in clone.attribute:
        if attr.name == "alpha":
            attr.f = abs(attr.f)
    b.nodes.append(clone)
    return b.nodes, b.consts


# The summation-order allowance of a reduction of K terms t (docs/validation.md#reductions).
# With independent rounding errors, a sum of K terms computed in fp32 in any order lies within
# about λ·√K·u·Σ|t| of the exact one (Higham and Mary, "A new approach to probabilistic
# rounding error analysis", 2019); the machine and onnxruntime each have such an error, and
# products of fp32 operands one rounding more (u·Σ|t|), so they may differ by
# 2·(λ·√K + 1)·u·Σ|t|. Measured over the sweep (benchmarks/summation_order.py, 6,562 matmul and
# convolution outputs of 175 models): at most 1.9·u·√K·Σ|t|; λ = 6 leaves a factor of six.
ACCUMULATION_LAMBDA = 6.0
FP32_UNIT_ROUNDOFF = 2.0**-24


def accumulation_source(graph: Graph, tensor: str) -> str | None:
    """The tensor whose reduction's allowance bounds `tensor`: itself when a node that sums
    products on the PE makes it (its op has PE operands: MatMul, Gemm, Conv, ConvTranspose, a
    two-input Einsum); through a Relu, its input's source, since a Relu moves two values no
    further apart (|relu(a) - relu(b)| <= |a - b|). A Relu fused into its conv's PSUM eviction
    (patterns/conv/epilogue.py) is checked at its own output, the conv's being never stored."""
    producer = graph.producer(tensor)
    if producer is None:
        return None
    data = graph.node(producer)
    operands = [t for t in data["inputs"] if t]
    if data["op_type"] == "Relu" and operands:
        return accumulation_source(graph, operands[0])
    if data["op_type"] == "Einsum":
        return tensor if len(operands) == 2 else None
    sums = bool(traits(data["op_type"]).pe_operands) and len(operands) >= 2
    return tensor if sums else None


def accumulates(graph: Graph, tensor: str) -> bool:
    """Whether `tensor` gets a reduction's accumulation allowance (`accumulation_source`)."""
    return accumulation_source(graph, tensor) is not None


def accumulation_allowance_nodes(
    node: onnx.NodeProto, terms: int, result: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing, for each element of `node`'s output, how far two fp32 evaluations of
    it in different orders may lie apart: 2·(λ·√K + 1)·u·Σ|t| for its K = `terms` products and
    its bias t (`ACCUMULATION_LAMBDA`). Σ|t| is `node` itself applied to the absolute values of
    its operands and bias (|alpha|, |beta| for a Gemm)."""
    b = _Builder(result)
    clone = onnx.NodeProto()
    clone.CopyFrom(node)
    clone.name = b.name("magnitude")
    inputs = [b.op("Abs", t) if t else t for t in clone.input]
    del clone.input[:]
    clone.input.extend(inputs)
    magnitude = b.name("sum")
    del clone.output[:]
    clone.output.append(magnitude)
    for attr in clone.attribute:
        if attr.name in ("alpha", "beta"):
            attr.f = abs(attr.f)
    b.nodes.append(clone)
    scale = 2.0 * (ACCUMULATION_LAMBDA * math.sqrt(max(terms, 1)) + 1.0) * FP32_UNIT_ROUNDOFF
    scaled = b.op("Mul", magnitude, b.const(scale))
    b.nodes.append(helper.make_node("Identity", [scaled], [result], name=f"{result}/result"))
    return b.nodes, b.consts


def emulating_model(
    folded: onnx.ModelProto,
    graph: Graph,
    plan: CastPlan,
    resync: Iterable[str] = (),
    outputs: list[str] | None = None,
    prerounded: dict[str, tuple[int, ...]] | None = None,
) -> onnx.ModelProto:
    """`folded` with the plan's roundings inserted (module docstring). `graph` is the graph
    built from `folded` (its node names, in the same order). Tensors in `resync` are rounded
    from a graph input `<tensor>::machine` instead of onnxruntime's own value. `outputs`:
    the tensors to return (default the graph outputs); `<tensor>::accumulation_allowance`
    among them is the allowance of the reduction that produces `tensor`. `prerounded`: the
    rounded copies (`<tensor>::<dtype>`, with their shapes) fed as graph inputs instead of
    computed (`round_weights`)."""
    prerounded = prerounded or {}
    model = onnx.ModelProto()
    model.CopyFrom(folded)
    proto = model.graph
    opset = next(
        (entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0
    )
    resync = set(resync)
    if (plan.points or plan.boundaries) and opset < MIN_OPSET:
        raise UserError(
            f"the model's opset {opset} predates the ops the emulating oracle rounds with "
            f"(opset {MIN_OPSET}): validate it with --auto-cast none, or convert it to a newer "
            "opset"
        )
    by_node: dict[str, list[CastPoint]] = {}
    for point in plan.points:
        by_node.setdefault(point.node, []).append(point)
    rounded: dict[tuple[str, str], str] = {}  # (source tensor, dtype) → its rounded copy
    nodes: list[onnx.NodeProto] = []
    allowances: list[tuple[onnx.NodeProto, object]] = []
    wanted = list(outputs) if outputs is not None else list(graph.outputs)
    summed: dict[str, list[str]] = {}  # a reduction's output -> the tensors its allowance bounds
    for t in wanted:
        if t.endswith(ACCUMULATION_SUFFIX):
            bounded = t[: -len(ACCUMULATION_SUFFIX)]
            source = accumulation_source(graph, bounded)
            if source is not None:
                summed.setdefault(source, []).append(bounded)
    reductions: list[tuple[onnx.NodeProto, str]] = []
    for name, node in zip((n for n, _ in graph.nodes()), proto.node, strict=True):
        for index, tensor in enumerate(node.input):
            if tensor in resync:  # every reader takes the machine's value
                node.input[index] = tensor + MACHINE_SUFFIX
        for boundary in plan.boundaries.values():
            if boundary.node == name:
                allowances.append((node, boundary))
        for point in by_node.get(name, ()):
            key = (point.input, point.dtype)
            if key not in rounded:
                source = point.input + MACHINE_SUFFIX if point.input in resync else point.input
                result = f"{point.input}::{point.dtype}"
                if result in prerounded and point.input not in resync:
                    proto.input.append(
                        helper.make_tensor_value_info(
                            result, TensorProto.FLOAT, list(prerounded[result])
                        )
                    )
                else:
                    new, consts = rounding_nodes(source, result, point.dtype, opset, result)
                    nodes.extend(new)
                    proto.initializer.extend(consts)
                rounded[key] = result
            for index, tensor in enumerate(node.input):
                if tensor in (point.input, point.input + MACHINE_SUFFIX):
                    node.input[index] = rounded[key]
        nodes.append(node)
        if node.output and node.output[0] in summed:
            reductions.append((node, name))
    for node, name in reductions:  # on the operands as the node reads them (rounded)
        first, *others = summed[node.output[0]]
        new, consts = accumulation_allowance_nodes(
            node, reduction_length(graph, name), first + ACCUMULATION_SUFFIX
        )
        nodes.extend(new)
        proto.initializer.extend(consts)
        for other in others:
            nodes.append(
                helper.make_node(
                    "Identity",
                    [first + ACCUMULATION_SUFFIX],
                    [other + ACCUMULATION_SUFFIX],
                    name=f"{other}{ACCUMULATION_SUFFIX}/same",
                )
            )
    for node, boundary in allowances:
        original = next(  # the node's own copy, before its inputs were rounded
            n for n in folded.graph.node if list(n.output) == list(node.output)
        )
        new, consts = flip_allowance_nodes(
            original,
            boundary.position,
            boundary.operand,
            boundary.dtype,
            boundary.tensor + ALLOWANCE_SUFFIX,
        )
        nodes.extend(new)
        proto.initializer.extend(consts)
    del proto.node[:]
    proto.node.extend(nodes)
    for tensor in sorted(resync):
        info = graph.tensors[tensor]
        proto.input.append(
            helper.make_tensor_value_info(tensor + MACHINE_SUFFIX, TensorProto.FLOAT, info.shape)
        )
    known = {vi.name: vi for vi in [*proto.input, *proto.value_info, *proto.output]}
    del proto.output[:]
    for tensor in wanted:
        if tensor in known:
            proto.output.append(known[tensor])
        elif tensor.endswith((ALLOWANCE_SUFFIX, ACCUMULATION_SUFFIX)):
            proto.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
        else:
            info = graph.tensors[tensor]
            elem = helper.np_dtype_to_tensor_dtype(info.dtype.numpy)
            proto.output.append(helper.make_tensor_value_info(tensor, elem, list(info.shape)))
    return model


def round_weights(
    folded: onnx.ModelProto, weights: dict[str, np.ndarray], plan: CastPlan
) -> dict[str, np.ndarray]:
    """The plan's roundings of the held-aside weights, `<weight>::<dtype>` → value, computed
    once for every run of the oracle (a validation runs it at least twice; an arithmetic
    rounding of resnet50's 25M weights is a dozen elementwise ops each time). onnxruntime runs
    the nodes `rounding_nodes` gives, so each value is the one the emulating model would
    compute: both forms round exactly, to nearest with ties to even. The weights' model is
    apart from the model's graph, so it takes bfloat16's Cast pair even when the model is older
    than opset 13, where the activations take the arithmetic form (light resnet50, opset 9:
    3.1 s -> 0.2 s)."""
    opset = next(
        (entry.version for entry in folded.opset_import if entry.domain in ("", "ai.onnx")), 0
    )
    pairs = sorted({(p.input, p.dtype) for p in plan.points if p.input in weights})
    if not pairs or opset < MIN_OPSET:
        return {}
    opset = max(opset, CAST_OPSET_BF16)
    nodes, consts, inputs, results = [], [], {}, []
    for tensor, dtype in pairs:
        value = weights[tensor]
        if np.asarray(value).dtype != np.float32:
            continue
        result = f"{tensor}::{dtype}"
        new, made = rounding_nodes(tensor, result, dtype, opset, result)
        nodes.extend(new)
        consts.extend(made)
        inputs[tensor] = value
        results.append(result)
    if not results:
        return {}
    graph = helper.make_graph(
        nodes,
        "round_weights",
        [
            helper.make_tensor_value_info(t, TensorProto.FLOAT, list(v.shape))
            for t, v in inputs.items()
        ],
        [helper.make_tensor_value_info(r, TensorProto.FLOAT, None) for r in results],
        consts,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset)],
        ir_version=max(folded.ir_version, IR_VERSION_OPSET_13),
    )
    return run_onnxruntime(model.SerializeToString(), inputs, results)


def run_emulating(
    folded: onnx.ModelProto,
    graph: Graph,
    weights: dict[str, np.ndarray],
    plan: CastPlan,
    feeds: dict[str, np.ndarray],
    machine_values: dict[str, np.ndarray] | None = None,
    outputs: list[str] | None = None,
    prerounded: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Run the emulating model on onnxruntime: `feeds` the graph inputs, `machine_values`
    the resynchronised tensors (module docstring; none: the plain emulation); `prerounded`
    the weights' roundings from `round_weights`, fed instead of computed."""
    machine_values = machine_values or {}
    prerounded = prerounded or {}
    wanted = list(outputs) if outputs is not None else list(graph.outputs)
    shapes = {name: tuple(value.shape) for name, value in prerounded.items()}
    model = emulating_model(folded, graph, plan, machine_values, wanted, shapes)
    extra = {
        tensor + MACHINE_SUFFIX: np.asarray(value, np.float32)
        for tensor, value in machine_values.items()
    }
    fed = {**feeds, **weights, **extra, **prerounded}
    for name in restore_prepacked_weights(model, weights):
        del fed[name]
    return run_onnxruntime(model.SerializeToString(), fed, wanted)


# Vendor ops whose onnxruntime kernel computes otherwise when a weight is a graph input: a
# MatMulNBits honours accuracy_level 4 (int8 dot products) only on a weight it can prepack,
# an initializer (docs/quantization.md#nbits).
_PREPACKED_INPUTS = {("com.microsoft", "MatMulNBits"): (1, 2, 3, 4)}


def restore_prepacked_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> set[str]:
    """Make the held-aside weights such ops read initializers of `model` again (in place);
    the names restored."""
    wanted = {
        tensor
        for node in model.graph.node
        for index, tensor in enumerate(node.input)
        if index in _PREPACKED_INPUTS.get((node.domain, node.op_type), ()) and tensor in weights
    }
    if not wanted:
        return set()
    kept = [value for value in model.graph.input if value.name not in wanted]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for name in sorted(wanted):
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(weights[name]), name))
    return wanted
