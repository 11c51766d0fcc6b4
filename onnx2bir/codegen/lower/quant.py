"""Generic lowering of QuantizeLinear and DequantizeLinear (per tensor or per axis).

Elementwise (`emit_elementwise`), the scale and zero point broadcast along `axis` when they
are vectors (seen as [C, 1, …] at that axis):
- DequantizeLinear: y = (x − zero_point) · scale; the subtraction is exact (int32 on GpSimd,
  docs/neuroncore.md#integers) when both are integers, the product fp32.
- QuantizeLinear: y = saturate(round(x / scale) + zero_point), round halves to even as Round
  does (`lower_math`), saturation to the output type's range (uint8 [0, 255], int8
  [−128, 127], …) by max/min before the store converts to the integer type.
A one-element constant scale and zero point (the usual per-tensor case) ride as TensorScalar
immediates instead of tiles loaded for every block.
Blocked quantization (opset 21 `block_size`): the scale and zero point have x's shape with the
blocked axis d cut to d / block_size; x and y are walked as [.., d / block_size, block_size, ..]
and the scale as [.., d / block_size, 1, ..], a broadcast (docs/quantization.md#blocked). A last
partial block (block_size not dividing d) is refused. The float8 types are refused before
(docs/quantization.md#blocked).
"""

from __future__ import annotations

from onnx2bir.bir.dtypes import SATURATING, iinfo
from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import emit_elementwise, like, scratch_tile
from onnx2bir.codegen.lower.math_ops import _floor
from onnx2bir.graph import Node


def _integer_range(dtype: Dtype) -> tuple[int, int] | None:
    """The range QuantizeLinear saturates to: the integer output type's (uint8 [0, 255], int4
    [-8, 7], ...); None for a float output."""
    if dtype.is_float or dtype is Dtype.BOOL:
        return None
    info = iinfo(dtype.numpy)
    return int(info.min), int(info.max)


def _axis_shapes(
    cg: BirCodeGen, node: Node
) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...] | None]:
    """Per-axis scale / zero point seen as [C, 1, …] at `axis` of x; blocked ones as
    [.., d / block_size, 1, ..] against x and y seen as [.., d / block_size, block_size, ..]
    (that view, or None)."""
    x_shape = tuple(cg.graph.tensors[node.inputs[0]].shape)
    axis = int(node.attr("axis", 1)) % max(1, len(x_shape))
    block = int(node.attr("block_size", 0))
    if block:
        return _blocked_shapes(cg, node, x_shape, axis, block)
    shapes = {}
    for name in node.inputs[1:]:
        shape = tuple(cg.graph.tensors[name].shape) if name else ()
        if len(shape) == 1 and shape[0] > 1:
            shapes[name] = (shape[0],) + (1,) * (len(x_shape) - axis - 1)
    return shapes, None


def _blocked_shapes(cg: BirCodeGen, node: Node, x_shape, axis: int, block: int):
    op, length = node.op_type, x_shape[axis]
    blocks = -(-length // block)
    want = (*x_shape[:axis], blocks, *x_shape[axis + 1 :])
    for name in node.inputs[1:]:
        if name and tuple(cg.graph.tensors[name].shape) != want:
            raise cg.fail(
                f"{op} block_size {block}: {name} is {list(cg.graph.tensors[name].shape)}, "
                f"expected {list(want)} (x's shape with axis {axis} in blocks)"
            )
    if length % block:
        raise cg.fail(
            f"{op} block_size {block} does not divide axis {axis} of x ({length}): a last "
            "partial block is not supported"
        )
    view = (*x_shape[:axis], blocks, block, *x_shape[axis + 1 :])
    shapes = {node.inputs[0]: view}
    for name in node.inputs[1:]:
        if name:
            shapes[name] = (*x_shape[:axis], blocks, 1, *x_shape[axis + 1 :])
    return shapes, view


def _scalar_parameters(cg: BirCodeGen, node: Node) -> tuple[float, float] | None:
    """(scale, zero point) when both are one-element constants (or the zero point absent):
    they ride as TensorScalar immediates, no tile of them is loaded. fp32 holds every 8-bit
    zero point and the scale exactly."""
    values = []
    for name in node.inputs[1:3]:
        info = cg.graph.tensors[name] if name else None
        if info is None:
            values.append(0.0)
        elif info.is_const and info.const.size == 1:
            values.append(float(info.const.reshape(-1)[0]))
        else:
            return None
    if len(values) < 2:
        values.append(0.0)
    if cg.graph.tensors[node.inputs[1]].dtype is not Dtype.FP32:
        return None
    return values[0], values[1]


# The input index of each parameter of QuantizeLinear / DequantizeLinear.
_SCALE, _ZERO = 1, 2


def _emit_affine(cg: BirCodeGen, node: Node, steps: tuple[tuple[AluOp, int], ...]) -> None:
    """y = ((x op₀ p₀) op₁ p₁) elementwise, each p the scale (`_SCALE`) or the zero point
    (`_ZERO`; a step on an absent zero point is skipped): one TensorScalar with both as
    immediates when they are one-element constants, else TensorTensor steps on their
    broadcast tiles (`_axis_shapes`)."""
    shapes, view = _axis_shapes(cg, node)
    has_zero = len(node.inputs) > 2 and bool(node.inputs[2])
    scalars = _scalar_parameters(cg, node)
    if scalars is not None:
        (op0, p0), (op1, p1) = steps
        value = {_SCALE: scalars[0], _ZERO: scalars[1]}
        emit_elementwise(
            cg,
            {**node, "inputs": [node.inputs[0]]},
            lambda cg, dst, srcs: cg.tensor_scalar(dst, srcs[0], op0, value[p0], op1, value[p1]),
            direct=True,
        )
        return
    used = [(op, p) for op, p in steps if p == _SCALE or has_zero]

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        source = srcs[0]
        for op, p in used:
            cg.tensor_tensor(dst, source, srcs[p], op)
            source = dst

    emit_elementwise(cg, node, compute, shapes, direct=True, out_shape=view)


def lower_dequantize(cg: BirCodeGen, node: Node) -> None:
    """y = (x − zero_point) · scale (module docstring)."""
    _emit_affine(cg, node, ((AluOp.SUBTRACT, _ZERO), (AluOp.MULTIPLY, _SCALE)))


def lower_quantize(cg: BirCodeGen, node: Node) -> None:
    out_dtype = cg.graph.tensors[node.outputs[0]].dtype
    if out_dtype in SATURATING:
        _quantize_float8(cg, node, out_dtype)
        return
    span = _integer_range(out_dtype)
    if span is None:
        raise cg.fail(f"QuantizeLinear to {out_dtype} is not supported")
    low, high = span
    shapes, view = _axis_shapes(cg, node)
    has_zero = len(node.inputs) > 2 and bool(node.inputs[2])
    scalars = _scalar_parameters(cg, node)
    value_t, rem_t, flag_t, more_t = (scratch_tile(cg, t) for t in ("value", "rem", "flag", "more"))

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        value, rem = like(dst, value_t), like(dst, rem_t)
        flag, more = like(dst, flag_t), like(dst, more_t)
        if scalars is not None:
            cg.tensor_scalar(more, srcs[0], AluOp.DIVIDE, scalars[0])
        else:
            cg.tensor_tensor(more, srcs[0], srcs[1], AluOp.DIVIDE)
        # round half to even: floor, then +1 above a half or at an odd tie
        _floor(cg, value, more, rem, flag)
        cg.tensor_tensor(rem, more, value, AluOp.SUBTRACT)
        cg.tensor_scalar(flag, value, AluOp.MOD, 2.0, AluOp.IS_EQUAL, 0.0)
        cg.tensor_scalar(more, rem, AluOp.IS_EQUAL, 0.5)
        cg.tensor_tensor(flag, more, flag, AluOp.SUBTRACT)
        cg.tensor_scalar(flag, flag, AluOp.MAX, 0.0)
        cg.tensor_scalar(more, rem, AluOp.IS_GT, 0.5)
        cg.tensor_tensor(value, value, more, AluOp.ADD)
        cg.tensor_tensor(value, value, flag, AluOp.ADD)
        if scalars is not None:
            cg.tensor_scalar(value, value, AluOp.ADD, scalars[1])
        elif has_zero:
            cg.tensor_tensor(value, value, srcs[2], AluOp.ADD)
        cg.tensor_scalar(dst, value, AluOp.MAX, float(low), AluOp.MIN, float(high))

    if scalars is not None:
        node = {**node, "inputs": [node.inputs[0]]}
    emit_elementwise(cg, node, compute, shapes, direct=True, out_shape=view)


def _quantize_float8(cg: BirCodeGen, node: Node, out_dtype: Dtype) -> None:
    """QuantizeLinear to a float8 type: y = x / scale + zero_point, converted by the store,
    which rounds to nearest even and saturates as ONNX's default (`saturate=1`) asks
    (`bir/dtypes.py saturate_fp8`). `saturate=0` (overflow to NaN or inf) is refused: the
    device's conversion saturates."""
    if not int(node.attr("saturate", 1)):
        raise cg.fail(
            f"QuantizeLinear to {out_dtype} with saturate=0: the device's float8 conversion "
            "saturates"
        )
    _emit_affine(cg, node, ((AluOp.DIVIDE, _SCALE), (AluOp.ADD, _ZERO)))
