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
bfloat16 before opset 13. A model older than 13 that rounds to bfloat16 is emulated in a copy
raised to opset 13 where every node means the same there (runtime/oracle/cast_opset.py), so
that its roundings are Cast pairs too; else it keeps the arithmetic form. Roundings need opset
9 (Where, IsNaN); a model older than that cannot be emulated (`MIN_OPSET`).

A recurrent op (LSTM, GRU, RNN) with cast points, or whose outputs' allowances are asked for,
is computed step by step, as the program computes it: an ONNX Scan whose body is one step in
plain ops, rounding the state where the plan says (`recurrent_nodes`,
docs/validation.md#recurrent-ops).

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
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.cast_plan import CastPlan, CastPoint
from onnx2bir.errors import UserError
from onnx2bir.frontend.attention_block import read_block
from onnx2bir.frontend.function_expansion import inlined_body
from onnx2bir.graph import Graph
from onnx2bir.op_traits import traits
from onnx2bir.runtime.oracle.cast_opset import raised_to_cast_opset
from onnx2bir.runtime.oracle.ort import run_onnxruntime
from onnx2bir.runtime.oracle.tolerance import RECURRENT_OPS, reduction_length

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
    source: str, result: str, dtype: str, opset: int, prefix: str, elem: int = TensorProto.FLOAT
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes (and their constants) that compute `result` = `source` rounded to `dtype` and
    read back in `source`'s own ONNX type `elem` (float32, or the float16 / float64 of a model
    in that type): a Cast pair where onnxruntime's Cast rounds as the device does, else the
    exact arithmetic rounding of `arithmetic_rounding`, in float32 between two Casts."""
    cast_type = _CAST_TYPES.get(dtype)
    if cast_type is not None and (dtype != "bfloat16" or opset >= CAST_OPSET_BF16):
        narrow = f"{prefix}/narrow"
        return [
            helper.make_node("Cast", [source], [narrow], to=cast_type, name=f"{prefix}/cast"),
            helper.make_node("Cast", [narrow], [result], to=elem, name=f"{prefix}/widen"),
        ], []
    if elem == TensorProto.FLOAT:
        return arithmetic_rounding(source, result, FORMATS[dtype], prefix)
    wide, narrow = f"{prefix}/as_float", f"{prefix}/rounded"
    nodes, consts = arithmetic_rounding(wide, narrow, FORMATS[dtype], prefix)
    return [
        helper.make_node("Cast", [source], [wide], to=TensorProto.FLOAT, name=f"{wide}/cast"),
        *nodes,
        helper.make_node("Cast", [narrow], [result], to=elem, name=f"{prefix}/back"),
    ], consts


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
        return self.array(np.array(value, np.float32))

    def array(self, value: np.ndarray) -> str:
        """A constant of `value`'s own dtype and shape (indices, shapes, zeros)."""
        tensor = numpy_helper.from_array(np.asarray(value), self.name("c"))
        self.consts.append(tensor)
        return tensor.name

    def indices(self, start: int, stop: int) -> str:
        return self.array(np.arange(start, stop, dtype=np.int64))

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


def flip_steps(b: _Builder, t: str, fmt: Format) -> str:
    """Per element of `t`, one spacing of `fmt` where t lies within FLIP_REACH·(|t| + rms(t))
    of a half-way point (a rounding fp32 differences can flip), else 0."""
    quantum = b.quantum(t, fmt)
    scaled = b.op("Div", t, quantum)
    offset = b.op("Sub", b.op("Sub", scaled, b.op("Floor", scaled)), b.const(0.5))
    distance = b.op("Mul", b.op("Abs", offset), quantum)
    rms = b.op("Sqrt", b.op("ReduceMean", b.op("Mul", t, t), keepdims=0))
    reach = b.op("Mul", b.op("Add", b.op("Abs", t), rms), b.const(FLIP_REACH))
    near = b.op("Cast", b.op("Not", b.op("Less", reach, distance)), to=TensorProto.FLOAT)
    steps = b.op("Mul", near, quantum)
    return b.op("Where", b.op("IsNaN", steps), b.const(0.0), steps)


def flip_allowance_nodes(
    node: onnx.NodeProto, position: int, operand: str, dtype: str, result: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing, for each element of `node`'s output, the most that roundings of
    `operand` (input `position`) in the other direction can change it: the roundings whose
    value lies within FLIP_REACH·(|t| + rms(t)) of a half-way point, each a step of one spacing.
    It is `node` itself applied to A = spacing·[t near a half-way point] and to the absolute
    values of its other operand, without a bias."""
    b = _Builder(result)
    steps = flip_steps(b, operand, FORMATS[dtype])
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
    two-input Einsum; an output of a recurrent op, whose gates sum products at every step,
    `recurrent_nodes`); through a Relu, its input's source, since a Relu moves two values no
    further apart (|relu(a) - relu(b)| <= |a - b|). A Relu fused into its conv's PSUM eviction
    (patterns/conv/epilogue.py) is checked at its own output, the conv's being never stored."""
    producer = graph.producer(tensor)
    if producer is None:
        return None
    data = graph.node(producer)
    operands = [t for t in data["inputs"] if t]
    if data["op_type"] in RECURRENT_OPS:  # each output its own (`recurrent_nodes`)
        return tensor
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
    node: onnx.NodeProto, terms: int, result: str, in_float32: bool = True
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing, for each element of `node`'s output, how far two fp32 evaluations of
    it in different orders may lie apart: 2·(λ·√K + 1)·u·Σ|t| for its K = `terms` products and
    its bias t (`ACCUMULATION_LAMBDA`). Σ|t| is `node` itself applied to the absolute values of
    its operands and bias (|alpha|, |beta| for a Gemm), in float32 (`in_float32` False: the
    operands are float16 or float64 in the model, and are cast first, as the machine computes
    in fp32)."""
    b = _Builder(result)
    clone = onnx.NodeProto()
    clone.CopyFrom(node)
    clone.name = b.name("magnitude")
    inputs = list(clone.input)
    if not in_float32:  # before Abs: onnxruntime has no bfloat16 Abs
        inputs = [b.op("Cast", t, to=TensorProto.FLOAT) if t else t for t in inputs]
    inputs = [b.op("Abs", t) if t else t for t in inputs]
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


# --- a recurrent op, one step at a time ------------------------------------------------------
# The lowering (codegen/lower/recurrent.py) computes every step's input projection
# XW = X·Wᵀ + (Wb + Rb) in one matmul before the time loop, then per step gates = XW_t +
# h_{t-1}·Rᵀ on the PE array and the gate math in fp32 on ScalarE and VectorE. Its PE operands
# are therefore X and W (a cast point on each when they are narrow) and, in the loop, R and the
# state h_{t-1} (GRU without linear_before_reset: r⊙h_{t-1} in its second product): a cast point
# of kind "recurrent" on R says that the recurrent products take R and the state rounded. No
# cast around the ONNX op rounds the state, so the oracle computes such a node as a Scan whose
# body is one step in plain ONNX ops, rounding where the program rounds; the body is the same
# graph for any sequence length (docs/validation.md#recurrent-ops).
SCAN_OPSET = 9  # Scan with scan_input_directions (opset 8's Scan has a batch axis)
_STEP_ACTIVATIONS = ("Sigmoid", "Tanh", "Relu")  # those the lowering runs
_DEFAULT_ACTIVATIONS = {
    "LSTM": ("Sigmoid", "Tanh", "Tanh"),
    "GRU": ("Sigmoid", "Tanh"),
    "RNN": ("Tanh",),
}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def step_emulation_refusal(graph: Graph, name: str, opset: int) -> str | None:
    """Why recurrent node `name` cannot be computed step by step (`recurrent_nodes`), or None:
    what the lowering refuses too (peepholes, clip, input_forget, activation parameters,
    activations other than Sigmoid, Tanh and Relu, sequence_lens shorter than the sequence),
    a shape that is not static, or an opset before Scan's (9)."""
    data = graph.node(name)
    op, attrs, inputs = data["op_type"], data["attrs"], list(data["inputs"]) + [""] * 8
    if op not in _GATES:
        return f"{op} is not a recurrent op"
    if opset < SCAN_OPSET:
        return f"opset {opset} predates Scan's step form (opset {SCAN_OPSET})"
    if inputs[7] or attrs.get("clip") is not None or attrs.get("input_forget", 0):
        return f"{op} with peepholes, clip or input_forget"
    if attrs.get("activation_alpha") or attrs.get("activation_beta"):
        return f"{op} with activation_alpha/beta"
    acts = attrs.get("activations") or ()
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in acts]
    if any(a not in _STEP_ACTIVATIONS for a in acts):
        return f"{op} activations {', '.join(acts)}"
    try:
        x = tuple(int(v) for v in graph.tensors[inputs[0]].shape)
        w = tuple(int(v) for v in graph.tensors[inputs[1]].shape)
    except (KeyError, TypeError, ValueError):
        return f"{op} shapes are not static"
    if len(x) != 3 or len(w) != 3:
        return f"{op} shapes are not static"
    seq = x[1] if attrs.get("layout", 0) else x[0]
    if inputs[4]:
        lens = graph.tensors.get(inputs[4])
        if lens is None or not lens.is_const or np.any(np.asarray(lens.const) != seq):
            return f"{op} sequence_lens shorter than the sequence"
    return None


def _activation_reach(b: _Builder, act: str, pre: str, error: str) -> str:
    """A bound on |act(p) − act(pre)| for every |p − pre| ≤ error: the activation's largest
    slope on the interval times error. Sigmoid's and tanh's slopes are even and fall with |z|,
    so the largest is at z = max(|pre| − error, 0); Relu's is at most 1."""
    if act == "Relu":
        return error
    nearest = b.op("Max", b.op("Sub", b.op("Abs", pre), error), b.const(0.0))
    y = b.op(act, nearest)
    if act == "Sigmoid":
        slope = b.op("Mul", y, b.op("Sub", b.const(1.0), y))
    else:
        slope = b.op("Sub", b.const(1.0), b.op("Mul", y, y))
    return b.op("Mul", slope, error)


def _product_reach(b: _Builder, x: str, dx: str, y: str, dy: str | None) -> str:
    """A bound on |x'y' − xy| for |x' − x| ≤ dx, |y' − y| ≤ dy: |x|·dy + |y|·dx + dx·dy."""
    spread = b.op("Mul", b.op("Abs", y), dx)
    if dy is None:
        return spread
    return b.op("Add", b.op("Add", spread, b.op("Mul", b.op("Abs", x), dy)), b.op("Mul", dx, dy))


def _plus(b: _Builder, *terms: str | None) -> str:
    kept = [t for t in terms if t]
    total = kept[0]
    for term in kept[1:]:
        total = b.op("Add", total, term)
    return total


def recurrent_nodes(
    node: onnx.NodeProto,
    graph: Graph,
    name: str,
    opset: int,
    state_dtype: str | None,
    allowances: dict[int, str],
    machine_y: str | None,
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing the outputs of recurrent node `node` (LSTM, GRU or RNN; its inputs as
    the oracle reads them: X and W, R rounded where the plan rounds them) step by step, as the
    program does: per direction, XW = X·Wᵀ + (Wb + Rb) for every step, then a Scan whose body
    is one step — gates = XW_t + h̃·Rᵀ with h̃ the state rounded to `state_dtype` (GRU without
    linear_before_reset: r⊙h rounded before its product with R_h), the activations and the
    cell update in the lowering's order. `name` is the node in `graph` (its tensors' shapes).

    `machine_y`: the graph input holding the machine's Y; each step then starts from the
    machine's h_{t-1} (its Y at the previous step, initial_h at the first), so each step is
    checked on its own, as at a probe (docs/validation.md#resynchronisation).

    `allowances` (output index → result): for those outputs, how far the machine's value may
    lie from this one through fp32 summation order alone — the summation allowance
    2·(λ·√K + 1)·u·Σ|t| of each gate's pre-activation (K = input + hidden, Σ|t| over the
    products of both matmuls and the biases, `accumulation_allowance_nodes`), carried through
    the activations (their largest slope on the interval, `_activation_reach`) and the
    products and sums of the cell update, and carried from step to step through LSTM's c."""
    data = graph.node(name)
    op, attrs = data["op_type"], data["attrs"]
    shapes = [graph.tensors[t].shape if t else None for t in data["inputs"]]
    inputs = list(node.input) + [""] * 8
    x, w, r, bias, init_h, init_c = (inputs[i] for i in (0, 1, 2, 3, 5, 6))
    layout = int(attrs.get("layout", 0))
    seq, batch, size = (int(v) for v in shapes[0])
    if layout:
        seq, batch = batch, seq
    dirs, gh = int(shapes[1][0]), int(shapes[1][1])
    hidden = int(attrs.get("hidden_size") or shapes[2][-1])
    acts = attrs.get("activations") or ()
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in acts]
    acts = acts or list(_DEFAULT_ACTIVATIONS[op]) * dirs
    per_dir = len(acts) // dirs
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    lbr = op == "GRU" and bool(attrs.get("linear_before_reset", 0))
    want = bool(allowances)
    scale = 2.0 * (ACCUMULATION_LAMBDA * math.sqrt(size + hidden) + 1.0) * FP32_UNIT_ROUNDOFF
    b = _Builder(f"{name}/steps")
    h = hidden
    shape_bh = b.array(np.array([1, batch, h], np.int64))
    xs = b.op("Transpose", x, perm=[1, 0, 2]) if layout else x  # [seq, batch, input]
    y_machine = None
    if machine_y is not None:  # [seq, dirs, batch, H]
        y_machine = b.op("Transpose", machine_y, perm=[1, 2, 0, 3]) if layout else machine_y
    zeros = b.array(np.zeros((batch, h), np.float32))
    finals: dict[int, list[str]] = {0: [], 1: [], 2: []}
    reaches: dict[int, list[str]] = {0: [], 1: [], 2: []}

    def gather(t: str, start: int, stop: int, axis: int) -> str:
        return b.op("Gather", t, b.indices(start, stop), axis=axis)

    def initial(t: str) -> str:
        if not t:
            return zeros
        return b.op("Gather", t, b.array(np.array(d, np.int64)), axis=1 if layout else 0)

    for d in range(dirs):
        backwards = direction == "reverse" or (direction == "bidirectional" and d == 1)
        index = b.array(np.array(d, np.int64))
        w_t = b.op("Transpose", b.op("Gather", w, index), perm=[1, 0])  # [input, G·H]
        r_t = b.op("Transpose", b.op("Gather", r, index), perm=[1, 0])  # [H, G·H]
        xw = b.op("MatMul", xs, w_t)
        rb_h = None
        if bias:
            both = b.op("Gather", bias, index)
            wb, rb = gather(both, 0, gh, 0), gather(both, gh, 2 * gh, 0)
            if lbr:  # R_h's bias stays inside the reset product
                rb_h = gather(rb, 2 * h, 3 * h, 0)
                keep = np.ones(gh, np.float32)
                keep[2 * h :] = 0.0
                rb = b.op("Mul", rb, b.array(keep))
            xw = b.op("Add", xw, b.op("Add", wb, rb))
        scans = [xw]
        magnitude_r = b.op("Abs", r_t) if want else None
        if want:
            terms = b.op("MatMul", b.op("Abs", xs), b.op("Abs", w_t))
            if bias:
                terms = b.op("Add", terms, b.op("Add", b.op("Abs", wb), b.op("Abs", rb)))
            scans.append(terms)
        h0 = initial(init_h)
        if y_machine is not None:
            y_d = b.op("Gather", y_machine, index, axis=1)  # [seq, batch, H]
            first = b.op("Reshape", h0, shape_bh)
            if seq == 1:
                previous = first
            elif backwards:
                previous = b.op("Concat", gather(y_d, 1, seq, 0), first, axis=0)
            else:
                previous = b.op("Concat", first, gather(y_d, 0, seq - 1, 0), axis=0)
            scans.append(previous)
        states = [h0] + ([initial(init_c)] if op == "LSTM" else [])
        if want:
            states += [zeros] * len(states)
        step = _Step(
            op=op,
            hidden=h,
            gh=gh,
            batch=batch,
            acts=acts[d * per_dir : (d + 1) * per_dir],
            lbr=lbr,
            scale=scale,
            state_dtype=state_dtype,
            opset=opset,
            want=want,
            from_machine=y_machine is not None,
        )
        body, body_inputs, body_outputs = _step_body(b, step, d, r_t, magnitude_r, rb_h)
        n_states, n_scans = len(states), len(scans)
        graph_proto = helper.make_graph(
            body,
            f"{name}/step{d}",
            [helper.make_tensor_value_info(t, TensorProto.FLOAT, s) for t, s in body_inputs],
            [helper.make_tensor_value_info(t, TensorProto.FLOAT, s) for t, s in body_outputs],
        )
        n_outputs = len(body_outputs) - n_states
        results = [b.name("scan") for _ in body_outputs]
        b.nodes.append(
            helper.make_node(
                "Scan",
                [*states, *scans],
                results,
                name=b.name("scan_node"),
                body=graph_proto,
                num_scan_inputs=n_scans,
                scan_input_directions=[int(backwards)] * n_scans,
                scan_output_directions=[int(backwards)] * n_outputs,
            )
        )
        finals[1].append(results[0])
        if op == "LSTM":
            finals[2].append(results[1])
        finals[0].append(results[n_states])
        if want:
            half = n_states // 2
            reaches[1].append(results[half])
            if op == "LSTM":
                reaches[2].append(results[half + 1])
            reaches[0].append(results[n_states + 1])

    def assemble(parts: list[str], index: int, result: str) -> None:
        if index == 0:  # [seq, batch, H] per direction → Y [seq, dirs, batch, H]
            pieces = [b.op("Reshape", p, b.array(np.array([seq, 1, batch, h]))) for p in parts]
            whole = b.op("Concat", *pieces, axis=1)
            if layout:
                whole = b.op("Transpose", whole, perm=[2, 0, 1, 3])
        else:  # [batch, H] per direction → [dirs, batch, H]
            whole = b.op("Concat", *[b.op("Reshape", p, shape_bh) for p in parts], axis=0)
            if layout:
                whole = b.op("Transpose", whole, perm=[1, 0, 2])
        b.nodes.append(helper.make_node("Identity", [whole], [result], name=f"{result}/steps"))

    for index, output in enumerate(node.output):
        if output and finals[index]:
            assemble(finals[index], index, output)
    for index, result in allowances.items():
        if reaches.get(index):
            assemble(reaches[index], index, result)
    return b.nodes, b.consts


@dataclass(frozen=True)
class _Step:
    """What one step of a recurrent node's Scan computes (`recurrent_nodes`)."""

    op: str
    hidden: int
    gh: int  # gates · hidden
    batch: int
    acts: list[str]  # this direction's activations
    lbr: bool  # GRU's linear_before_reset
    scale: float  # 2·(λ·√K + 1)·u, the summation allowance per unit of Σ|t|
    state_dtype: str | None  # the state's rounding before the recurrent products
    opset: int
    want: bool  # the allowances too
    from_machine: bool  # h_{t-1} is the machine's Y[t-1]


def _step_body(
    outer: _Builder,
    step: _Step,
    d: int,
    r_t: str,
    magnitude_r: str | None,
    rb_h: str | None,
) -> tuple[list[onnx.NodeProto], list[tuple[str, list[int]]], list[tuple[str, list[int]]]]:
    """One step of direction `d` of `recurrent_nodes`' Scan: (nodes, inputs, outputs), the
    inputs the states (h, LSTM's c, then their allowances) and the step's slices (XW_t, Σ|t| of
    XW_t, the machine's h_{t-1}), the outputs the new states and then the step's h and its
    allowance. `r_t` is Rᵀ [H, G·H] as the program reads it, `magnitude_r` |Rᵀ|, `rb_h` GRU's
    R_h bias under linear_before_reset. Constants go to `outer` (the body reads them from the
    enclosing graph)."""
    op, h, gh, batch, acts = step.op, step.hidden, step.gh, step.batch, step.acts
    lbr, scale, state_dtype, opset = step.lbr, step.scale, step.state_dtype, step.opset
    want, from_machine = step.want, step.from_machine
    b = _Builder(f"{outer.prefix}/d{d}")
    b.consts = outer.consts  # constants are outer-scope values
    b._count = 0
    bh, bg = [batch, h], [batch, gh]
    h_in, xw_t = f"{b.prefix}/h_in", f"{b.prefix}/xw_t"
    c_in = f"{b.prefix}/c_in" if op == "LSTM" else None
    eh_in = f"{b.prefix}/eh_in" if want else None
    ec_in = f"{b.prefix}/ec_in" if want and op == "LSTM" else None
    sx_t = f"{b.prefix}/sx_t" if want else None
    prev_t = f"{b.prefix}/prev_t" if from_machine else None
    inputs = [(t, bh) for t in (h_in, c_in, eh_in, ec_in) if t]
    inputs += [(xw_t, bg)] + ([(sx_t, bg)] if sx_t else []) + ([(prev_t, bh)] if prev_t else [])
    hp = prev_t or h_in
    # What h_{t-1}'s own difference carries into the step is not added: bounded by |R| it
    # would grow geometrically with the steps where the true differences do not (measured:
    # 1e-4 after 6 steps of a random LSTM, against 1.5e-7). Like the differences carried along
    # any chain of ops between two probes, the fp32 bound covers it; and where Y is read from
    # the machine, none is carried. c's is: |f| <= 1 keeps it from growing faster than the
    # steps' own.
    carried = None

    def rounded(t: str, tag: str) -> str:
        if state_dtype is None:
            return t
        result = b.name(tag)
        new, consts = rounding_nodes(t, result, state_dtype, opset, result)
        b.nodes.extend(new)
        b.consts.extend(consts)
        return result

    def cols(t: str, start: int, stop: int) -> str:
        return b.op("Gather", t, outer.indices(start, stop), axis=1)

    def pre_reach(terms: str, magnitude: str | None, operand: str, weight_abs: str | None):
        """The summation allowance of a pre-activation plus what h_{t-1}'s own carries."""
        total = b.op("Add", terms, b.op("MatMul", b.op("Abs", operand), weight_abs))
        reach = b.op("Mul", total, outer.const(scale))
        if carried is not None and magnitude is not None:
            reach = b.op("Add", reach, b.op("MatMul", carried, magnitude))
        return reach

    hq = rounded(hp, "state")
    outputs: list[str] = []
    if op == "LSTM":
        f_act, g_act, h_act = acts
        pre = b.op("Add", xw_t, b.op("MatMul", hq, r_t))
        parts = [cols(pre, k * h, (k + 1) * h) for k in range(4)]  # i, o, f, c
        i, o, f = (b.op(f_act, p) for p in parts[:3])
        g = b.op(g_act, parts[3])
        c = b.op("Add", b.op("Mul", c_in, f), b.op("Mul", i, g))
        tc = b.op(h_act, c)
        new_h = b.op("Mul", o, tc)
        outputs = [new_h, c]
        if want:
            reach = pre_reach(sx_t, magnitude_r, hq, magnitude_r)
            e = [cols(reach, k * h, (k + 1) * h) for k in range(4)]
            di, do, df = (_activation_reach(b, f_act, parts[k], e[k]) for k in range(3))
            dg = _activation_reach(b, g_act, parts[3], e[3])
            dc = _plus(b, _product_reach(b, c_in, ec_in, f, df), _product_reach(b, i, di, g, dg))
            dtc = _activation_reach(b, h_act, c, dc)
            dh = _product_reach(b, o, do, tc, dtc)
            outputs += [dh, dc]
    elif op == "GRU":
        f_act, g_act = acts
        r_zr, r_h = cols(r_t, 0, 2 * h), cols(r_t, 2 * h, 3 * h)
        pre_zr = b.op("Add", cols(xw_t, 0, 2 * h), b.op("MatMul", hq, r_zr))
        a_z, a_r = cols(pre_zr, 0, h), cols(pre_zr, h, 2 * h)
        z, reset = b.op(f_act, a_z), b.op(f_act, a_r)
        xw_h = cols(xw_t, 2 * h, 3 * h)
        if lbr:
            q = b.op("MatMul", hq, r_h)
            q = b.op("Add", q, rb_h) if rb_h else q
            a_h = b.op("Add", xw_h, b.op("Mul", q, reset))
        else:
            gated = rounded(b.op("Mul", reset, hp), "gated")
            a_h = b.op("Add", xw_h, b.op("MatMul", gated, r_h))
        cand = b.op(g_act, a_h)
        new_h = b.op("Add", cand, b.op("Mul", b.op("Sub", hp, cand), z))
        outputs = [new_h]
        if want:
            m_zr, m_h = cols(magnitude_r, 0, 2 * h), cols(magnitude_r, 2 * h, 3 * h)
            e_zr = pre_reach(cols(sx_t, 0, 2 * h), m_zr, hq, m_zr)
            dz = _activation_reach(b, f_act, a_z, cols(e_zr, 0, h))
            dr = _activation_reach(b, f_act, a_r, cols(e_zr, h, 2 * h))
            sx_h = b.op("Mul", cols(sx_t, 2 * h, 3 * h), outer.const(scale))
            if lbr:
                terms = b.op("MatMul", b.op("Abs", hq), m_h)
                if rb_h:
                    terms = b.op("Add", terms, b.op("Abs", rb_h))
                e_q = b.op("Mul", terms, outer.const(scale))
                if carried is not None:
                    e_q = b.op("Add", e_q, b.op("MatMul", carried, m_h))
                e_h = b.op("Add", sx_h, _product_reach(b, q, e_q, reset, dr))
            else:
                d_gated = _product_reach(b, reset, dr, hp, carried)
                e_h = b.op(
                    "Add",
                    sx_h,
                    b.op("Mul", b.op("MatMul", b.op("Abs", gated), m_h), outer.const(scale)),
                )
                e_h = b.op("Add", e_h, b.op("MatMul", d_gated, m_h))
            dcand = _activation_reach(b, g_act, a_h, e_h)
            # h = h̃ + z⊙(h_{t-1} − h̃) = (1 − z)⊙h̃ + z⊙h_{t-1}
            keep = b.op("Abs", b.op("Sub", outer.const(1.0), z))
            dh = _plus(
                b,
                b.op("Mul", keep, dcand),
                b.op("Mul", b.op("Abs", b.op("Sub", hp, cand)), dz),
                b.op("Mul", dz, dcand),
                b.op("Mul", b.op("Abs", z), carried) if carried else None,
                b.op("Mul", dz, carried) if carried else None,
            )
            outputs += [dh]
    else:  # RNN
        (f_act,) = acts
        pre = b.op("Add", xw_t, b.op("MatMul", hq, r_t))
        new_h = b.op(f_act, pre)
        outputs = [new_h]
        if want:
            outputs += [
                _activation_reach(b, f_act, pre, pre_reach(sx_t, magnitude_r, hq, magnitude_r))
            ]
    step_h = b.op("Identity", new_h)
    scanned = [step_h] + ([b.op("Identity", outputs[len(outputs) // 2])] if want else [])
    named = []
    for index, t in enumerate([*outputs, *scanned]):
        result = f"{b.prefix}/out{index}"
        b.nodes.append(helper.make_node("Identity", [t], [result], name=result))
        named.append((result, bh))
    return b.nodes, inputs, named


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
    resync = set(resync)
    model = _raised(folded, graph, plan, resync, prerounded)
    proto = model.graph
    opset = next(
        (entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0
    )
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
    fused_online = {
        e.node for e in plan.online.values() if graph.node(e.node)["op_type"] == "Attention"
    }
    fused_online |= {e.node for e in plan.expanded.values()}
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
                    elem = _elem(graph, point.input)
                    new, consts = rounding_nodes(source, result, point.dtype, opset, result, elem)
                    nodes.extend(new)
                    proto.initializer.extend(consts)
                rounded[key] = result
            for index, tensor in enumerate(node.input):
                if tensor in (point.input, point.input + MACHINE_SUFFIX):
                    node.input[index] = rounded[key]
        if name in fused_online:  # computed through its ONNX function body
            nodes.extend(_fused_body(node, graph, name, opset))
            continue
        if node.op_type in RECURRENT_OPS and (
            name in by_node or any(t in summed for t in node.output if t)
        ):
            nodes.extend(
                _recurrent(node, graph, name, opset, by_node.get(name, ()), summed, resync, proto)
            )
            continue
        nodes.append(node)
        if node.output and node.output[0] in summed:
            reductions.append((node, name))
    for entry in plan.online.values():
        bounded = summed.get(entry.tensor) or (
            [entry.tensor] if entry.tensor + ACCUMULATION_SUFFIX in wanted else []
        )
        new, consts = _online(nodes, entry, opset, bounded, entry.node in fused_online, set(wanted))
        proto.initializer.extend(consts)
        nodes = new
    for entry in plan.expanded.values():
        wants = entry.tensor + ACCUMULATION_SUFFIX in wanted
        new, consts = _expanded(nodes, entry, opset, wants)
        proto.initializer.extend(consts)
        nodes = new
    reductions = [(n, name) for n, name in reductions if n.output[0] not in plan.online]
    for node, name in reductions:  # on the operands as the node reads them (rounded)
        first, *others = summed[node.output[0]]
        operands = graph.node(name)["inputs"]  # the model's names (the node's may be rounded)
        in_float32 = all(_elem(graph, t) == TensorProto.FLOAT for t in operands if t)
        new, consts = accumulation_allowance_nodes(
            node, reduction_length(graph, name), first + ACCUMULATION_SUFFIX, in_float32
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
            helper.make_tensor_value_info(tensor + MACHINE_SUFFIX, _elem(graph, tensor), info.shape)
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


def _raised(
    folded: onnx.ModelProto,
    graph: Graph,
    plan: CastPlan,
    resync: set[str],
    prerounded: dict[str, tuple[int, ...]],
) -> onnx.ModelProto:
    """A copy of `folded` to build the emulating model in: raised to opset 13 when it is older
    and rounds some value to bfloat16 in its graph, so that the rounding is a Cast pair
    (runtime/oracle/cast_opset.py), where every node means the same there; else as it is."""
    opset = next((e.version for e in folded.opset_import if e.domain in ("", "ai.onnx")), 0)
    in_graph = any(
        point.dtype == "bfloat16"
        and (f"{point.input}::{point.dtype}" not in prerounded or point.input in resync)
        for point in plan.points
    )
    if MIN_OPSET <= opset < CAST_OPSET_BF16 and in_graph:
        raised = raised_to_cast_opset(folded, lambda tensor: _rank(graph, tensor))
        if raised is not None:
            return raised
    model = onnx.ModelProto()
    model.CopyFrom(folded)
    return model


def _rank(graph: Graph, tensor: str) -> int | None:
    info = graph.tensors.get(tensor)
    try:
        return len(info.shape) if info is not None and info.shape is not None else None
    except TypeError:
        return None


def _fused_body(node: onnx.NodeProto, graph: Graph, name: str, opset: int) -> list:
    """The nodes of fused `Attention` node `node` (its inputs as the oracle reads them,
    rounded) as the ONNX standard defines it, for its inputs' types in `graph`."""
    types = {}
    for read, tensor in zip(node.input, graph.node(name)["inputs"], strict=False):
        if read:
            info = graph.tensors[tensor]
            elem = _elem(graph, tensor) if info.dtype.is_float else None
            elem = elem or helper.np_dtype_to_tensor_dtype(info.dtype.numpy)
            types[read] = helper.make_tensor_type_proto(elem, list(info.shape))
    body = inlined_body(node, opset, types)
    if body is None:  # the plan checked that it has one
        raise UserError(f"Attention {name!r}: no ONNX function body to emulate it with")
    return body


def _online(
    nodes: list[onnx.NodeProto],
    entry,
    opset: int,
    bounded: list[str],
    fused: bool,
    wanted: set[str],
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`nodes` with the attention block of `entry` (an `OnlineSoftmax`) computed as the raised
    kernel computes it (runtime/oracle/online_softmax.py), and the allowance of its output
    as `<t>::accumulation_allowance` for each tensor t of `bounded`. The block's Softmax and
    the ops after it stay only when a tensor of theirs is `wanted` (--localize): the kernel
    never stores them, and onnxruntime's values are as good as any."""
    from onnx2bir.runtime.oracle import online_softmax  # it builds with this module's helpers

    softmax = entry.node
    if fused:
        found = [
            n.name for n in nodes if n.op_type == "Softmax" and n.name.startswith(softmax + "/")
        ]
        softmax = found[0] if len(found) == 1 else softmax
    block, problem = read_block(nodes, softmax)
    if block is None:  # the plan read the same nodes
        raise UserError(f"attention block at {entry.node!r}: {problem}")
    kernel = online_softmax.Kernel(entry.key_tile, entry.dtype, entry.head_dim, entry.seq_k)
    result = block.pv.output[0]
    allowance = f"{result}{ACCUMULATION_SUFFIX}" if bounded else None
    new, consts = online_softmax.online_nodes(block, kernel, opset, allowance, entry.flips)
    if allowance and result != entry.tensor:  # through the body's layout ops to its output
        new += _carried(nodes, result, entry.tensor, allowance)
    first = f"{entry.tensor}{ACCUMULATION_SUFFIX}"
    for other in bounded:
        if other != entry.tensor:
            new.append(
                helper.make_node(
                    "Identity", [first], [other + ACCUMULATION_SUFFIX], name=f"{other}/same"
                )
            )
    replaced = {id(block.pv)}
    if not any(t in wanted for n in block.replaced for t in n.output):
        replaced = {id(n) for n in block.replaced}
    at = next(i for i, n in enumerate(nodes) if n is block.pv)
    kept = [n for n in nodes[:at] if id(n) not in replaced]
    rest = [n for n in nodes[at:] if id(n) not in replaced]
    return [*kept, *new, *rest], consts


def _expanded(
    nodes: list[onnx.NodeProto], entry, opset: int, allowance: bool
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`nodes` with the function body of decomposed `Attention` `entry` (an
    `ExpandedAttention`) reading its probabilities rounded where the PV product reads them,
    as the decomposition's MatMul does; with `allowance`, `<output>::accumulation_allowance`:
    the PV product's summation allowance plus the flips of that rounding
    (docs/validation.md#expanded-attention)."""
    found = [
        n.name for n in nodes if n.op_type == "Softmax" and n.name.startswith(entry.node + "/")
    ]
    block, problem = read_block(nodes, found[0]) if len(found) == 1 else (None, "no Softmax")
    if block is None:  # the plan read the same body
        raise UserError(f"Attention {entry.node!r}: {problem}")
    pv = block.pv
    probabilities = pv.input[0]
    rounded = f"{probabilities}::{entry.dtype}"
    new, consts = rounding_nodes(probabilities, rounded, entry.dtype, opset, rounded)
    pv.input[0] = rounded
    if allowance:
        summed, flips = f"{pv.output[0]}::summation", f"{pv.output[0]}::flips"
        more, made = accumulation_allowance_nodes(pv, entry.seq_k, summed)
        new, consts = new + more, consts + made
        more, made = flip_allowance_nodes(pv, 0, probabilities, entry.dtype, flips)
        new, consts = new + more, consts + made
        total = f"{pv.output[0]}{ACCUMULATION_SUFFIX}"
        new.append(helper.make_node("Add", [summed, flips], [total], name=total))
    at = next(i for i, n in enumerate(nodes) if n is pv)
    after = [pv]
    if allowance and pv.output[0] != entry.tensor:
        after += _carried(nodes, pv.output[0], entry.tensor, total)
    return [*nodes[:at], *new, *after, *nodes[at + 1 :]], consts


_LAYOUT_OPS = ("Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze")


def _carried(nodes: list[onnx.NodeProto], start: str, end: str, allowance: str) -> list:
    """The layout ops from tensor `start` to tensor `end` (a chain of one reader each),
    applied to `allowance`; the last writes `<end>::accumulation_allowance`."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    out, tensor, carried = [], start, allowance
    while tensor != end:
        chain = [n for n in readers.get(tensor, []) if n.op_type in _LAYOUT_OPS]
        if len(chain) != 1:
            raise UserError(f"the attention output {end!r} is not a view of {start!r}")
        clone = onnx.NodeProto()
        clone.CopyFrom(chain[0])
        tensor = clone.output[0]
        name = f"{tensor}{ACCUMULATION_SUFFIX}"
        clone.name = name
        clone.input[0] = carried
        del clone.output[:]
        clone.output.append(name)
        out.append(clone)
        carried = name
    return out


def _elem(graph: Graph, tensor: str) -> int:
    """The ONNX element type of a float tensor of the graph (float32 when not known)."""
    info = graph.tensors.get(tensor)
    if info is None or not info.dtype.is_float:
        return TensorProto.FLOAT
    return helper.np_dtype_to_tensor_dtype(info.dtype.numpy)


def _recurrent(
    node: onnx.NodeProto,
    graph: Graph,
    name: str,
    opset: int,
    points: Iterable[CastPoint],
    summed: dict[str, list[str]],
    resync: set[str],
    proto: onnx.GraphProto,
) -> list[onnx.NodeProto]:
    """The nodes that stand for recurrent node `node` in the oracle: its steps
    (`recurrent_nodes`), with the allowances of its outputs the verdict asks for and from the
    machine's Y when Y is resynchronised; else the op itself (onnxruntime's own, on the inputs
    as rounded), with no allowance."""
    allowances: dict[int, str] = {}
    same: list[tuple[str, str]] = []
    for index, output in enumerate(node.output):
        if output and output in summed:
            first, *others = summed[output]
            allowances[index] = first + ACCUMULATION_SUFFIX
            same += [(allowances[index], other + ACCUMULATION_SUFFIX) for other in others]
    state = next((p.dtype for p in points if p.kind == "recurrent"), None)
    y = node.output[0] if node.output else ""
    if step_emulation_refusal(graph, name, opset) is None:
        machine_y = y + MACHINE_SUFFIX if y and y in resync else None
        nodes, consts = recurrent_nodes(node, graph, name, opset, state, allowances, machine_y)
        proto.initializer.extend(consts)
    else:
        nodes = [node]
        for index, result in allowances.items():  # none: the bound alone
            zero = numpy_helper.from_array(np.array(0.0, np.float32), f"{result}/zero")
            proto.initializer.append(zero)
            nodes.append(
                helper.make_node("Mul", [node.output[index], zero.name], [result], name=result)
            )
    for source, result in same:
        nodes.append(helper.make_node("Identity", [source], [result], name=f"{result}/same"))
    return nodes


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
    extra = {  # in the tensor's own dtype (float32, or a float16/bfloat16/float64 model's),
        # converted only when the machine holds it in another (no copy of an fp32 value)
        tensor + MACHINE_SUFFIX: np.asarray(value, graph.tensors[tensor].dtype.numpy)
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
