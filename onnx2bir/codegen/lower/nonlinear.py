"""Generic lowering of the activation functions beyond one ScalarE lookup, and Clip.

Elementwise (`emit_elementwise`): the transcendental part runs on ScalarE (Activation, whose
`scale` and `bias_value` give a free affine map of the input), clamps and products on VectorE
(TensorScalar with immediates, TensorTensor). Per tile:

- Gelu: one Activation, GELU (approximate="none") or GELU_TANH ("tanh").
- HardSigmoid: ACT copy(αx + β), then DVE min(max(·, 0), 1).
- HardSwish: x · HardSigmoid(x) with α = 1/6, β = ½.
- LeakyRelu: max(x, αx) for 0 ≤ α ≤ 1, else max(x, 0) + α·min(x, 0); PRelu the latter with
  a broadcast slope tile.
- Elu, Selu, Celu: max(x, 0)·γ + α·γ·(exp(min(x, 0)) − 1) with ACT exp (Celu scales the
  exponent by 1/α and clamps the negative branch at 0).
- ThresholdedRelu: (x > α)·x. Softsign: x / (1 + |x|). Mish: x · tanh(softplus(x)).
- Shrink: (x > λ)·(x − bias) + (x < −λ)·(x + bias), two masks and two shifts on VectorE.
- Clip: max then min with immediates when the bounds are constants (attributes before opset
  11, inputs after); runtime bounds come in as broadcast tiles. Integers clamp exactly.
"""

from __future__ import annotations

from onnx2bir.bir.enums import ActFunc, AluOp
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import emit_elementwise, like, scalar_op, scratch_tile
from onnx2bir.graph import Node


def _attr(node: Node, name: str, default: float) -> float:
    return float(node.attr(name, default))


def lower_gelu(cg: BirCodeGen, node: Node) -> None:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise cg.fail(f"Gelu approximate={approximate!r} is not 'none' or 'tanh'")
    func = ActFunc.GELU if approximate == "none" else ActFunc.GELU_TANH
    emit_elementwise(cg, node, lambda cg, dst, srcs: cg.activation(dst, srcs[0], func), direct=True)


def _hard_sigmoid(
    cg: BirCodeGen, dst: AccessPattern, src: AccessPattern, alpha: float, beta: float
) -> None:
    cg.activation(dst, src, ActFunc.COPY, scale=alpha, bias_value=beta)
    cg.tensor_scalar(dst, dst, AluOp.MAX, 0.0, AluOp.MIN, 1.0)


def lower_hard_sigmoid(cg: BirCodeGen, node: Node) -> None:
    alpha, beta = _attr(node, "alpha", 0.2), _attr(node, "beta", 0.5)
    emit_elementwise(
        cg,
        node,
        lambda cg, dst, srcs: _hard_sigmoid(cg, dst, srcs[0], alpha, beta),
        direct=True,
    )


def lower_hard_swish(cg: BirCodeGen, node: Node) -> None:
    gate = scratch_tile(cg, "gate")

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        _hard_sigmoid(cg, like(dst, gate), srcs[0], 1.0 / 6.0, 0.5)
        cg.tensor_tensor(dst, srcs[0], like(dst, gate), AluOp.MULTIPLY)

    emit_elementwise(cg, node, compute, direct=True)


def lower_leaky_relu(cg: BirCodeGen, node: Node) -> None:
    alpha = _attr(node, "alpha", 0.01)
    negative = scratch_tile(cg, "negative")

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        x, neg = srcs[0], like(dst, negative)
        if len(srcs) == 1 and 0.0 <= alpha <= 1.0:
            cg.tensor_scalar(neg, x, AluOp.MULTIPLY, alpha)
            cg.tensor_tensor(dst, x, neg, AluOp.MAX)
            return
        if len(srcs) == 1:
            cg.tensor_scalar(neg, x, AluOp.MIN, 0.0, AluOp.MULTIPLY, alpha)
        else:
            cg.tensor_scalar(neg, x, AluOp.MIN, 0.0)
            cg.tensor_tensor(neg, neg, srcs[1], AluOp.MULTIPLY)
        cg.tensor_scalar(dst, x, AluOp.MAX, 0.0)
        cg.tensor_tensor(dst, dst, neg, AluOp.ADD)

    # A PRelu older than opset 7 (per-channel slope) was upgraded by the import
    # (frontend/opset_upgrade.py): the slope broadcasts as numpy does.
    emit_elementwise(cg, node, compute, direct=True)


def lower_elu(cg: BirCodeGen, node: Node) -> None:
    op_type = node.op_type
    if op_type == "Selu":
        alpha = _attr(node, "alpha", 1.67326319217681884765625)
        gamma = _attr(node, "gamma", 1.05070102214813232421875)
    else:
        alpha, gamma = _attr(node, "alpha", 1.0), 1.0
    negative = scratch_tile(cg, "negative")

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        x, neg = srcs[0], like(dst, negative)
        if op_type == "Celu":
            cg.activation(neg, x, ActFunc.EXP, scale=1.0 / alpha)
            cg.tensor_scalar(neg, neg, AluOp.SUBTRACT, 1.0, AluOp.MULTIPLY, alpha)
            cg.tensor_scalar(neg, neg, AluOp.MIN, 0.0)
        else:
            cg.tensor_scalar(neg, x, AluOp.MIN, 0.0)
            cg.activation(neg, neg, ActFunc.EXP)
            cg.tensor_scalar(neg, neg, AluOp.SUBTRACT, 1.0, AluOp.MULTIPLY, alpha * gamma)
        cg.tensor_scalar(dst, x, AluOp.MAX, 0.0, AluOp.MULTIPLY, gamma)
        cg.tensor_tensor(dst, dst, neg, AluOp.ADD)

    emit_elementwise(cg, node, compute, direct=True)


def lower_thresholded_relu(cg: BirCodeGen, node: Node) -> None:
    alpha = _attr(node, "alpha", 1.0)
    mask = scratch_tile(cg, "mask")

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        cg.tensor_scalar(like(dst, mask), srcs[0], AluOp.IS_GT, alpha)
        cg.tensor_tensor(dst, srcs[0], like(dst, mask), AluOp.MULTIPLY)

    emit_elementwise(cg, node, compute, direct=True)


def lower_shrink(cg: BirCodeGen, node: Node) -> None:
    lambd, bias = _attr(node, "lambd", 0.5), _attr(node, "bias", 0.0)
    if not cg.graph.tensors[node.input(0)].dtype.is_float:
        raise cg.fail("Shrink of integers is not supported (floats only)")
    upper, lower, shifted = (scratch_tile(cg, tag) for tag in ("upper", "lower", "shifted"))

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        up, low, shift = like(dst, upper), like(dst, lower), like(dst, shifted)
        cg.tensor_scalar(up, srcs[0], AluOp.IS_GT, lambd)
        cg.tensor_scalar(shift, srcs[0], AluOp.SUBTRACT, bias)
        cg.tensor_tensor(up, up, shift, AluOp.MULTIPLY)
        cg.tensor_scalar(low, srcs[0], AluOp.IS_LT, -lambd)
        cg.tensor_scalar(shift, srcs[0], AluOp.ADD, bias)
        cg.tensor_tensor(low, low, shift, AluOp.MULTIPLY)
        cg.tensor_tensor(dst, up, low, AluOp.ADD)

    emit_elementwise(cg, node, compute, direct=True)


def lower_softsign(cg: BirCodeGen, node: Node) -> None:
    denominator = scratch_tile(cg, "denominator")

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        den = like(dst, denominator)
        cg.activation(den, srcs[0], ActFunc.ABS)
        cg.tensor_scalar(den, den, AluOp.ADD, 1.0)
        cg.tensor_tensor(dst, srcs[0], den, AluOp.DIVIDE)

    emit_elementwise(cg, node, compute, direct=True)


def lower_mish(cg: BirCodeGen, node: Node) -> None:
    gate = scratch_tile(cg, "gate")

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        cg.activation(like(dst, gate), srcs[0], ActFunc.SOFTPLUS)
        cg.activation(like(dst, gate), like(dst, gate), ActFunc.TANH)
        cg.tensor_tensor(dst, srcs[0], like(dst, gate), AluOp.MULTIPLY)

    emit_elementwise(cg, node, compute, direct=True)


def lower_clip(cg: BirCodeGen, node: Node) -> None:
    """min(max(x, lo), hi), as numpy.clip: lo > hi gives hi."""
    x = node.inputs[0]
    integer = not cg.graph.tensors[x].dtype.is_float
    bounds: list[tuple[AluOp, float | None, bool]] = []  # (op, immediate, runtime tile)
    runtime = []
    if cg.graph.opset < 11:
        for name, op in (("min", AluOp.MAX), ("max", AluOp.MIN)):
            if name in node.attrs:
                bounds.append((op, float(node.attrs[name]), False))
    else:
        for index, op in ((1, AluOp.MAX), (2, AluOp.MIN)):
            name = node.inputs[index] if len(node.inputs) > index else ""
            if not name:
                continue
            info = cg.graph.tensors[name]
            if info.is_const:
                value = info.const.reshape(-1)[0]
                bounds.append((op, int(value) if integer else float(value), False))
            else:
                bounds.append((op, None, True))
                runtime.append(name)

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        source, tiles = srcs[0], iter(srcs[1:])
        if not bounds:
            cg.tensor_copy(dst, source)
        for op, value, is_tile in bounds:
            if is_tile:
                cg.tensor_tensor(dst, source, next(tiles), op)
            else:
                scalar_op(cg, dst, source, integer, op, value)
            source = dst

    emit_elementwise(cg, {**node, "inputs": [x, *runtime]}, compute, direct=True)
