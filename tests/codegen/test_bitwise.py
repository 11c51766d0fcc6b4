"""BitShift, BitwiseAnd, BitwiseOr, BitwiseXor and BitwiseNot (codegen/lower/bitwise.py)
against onnxruntime: one-node models, chosen inputs (every shift amount past the lane width,
the int32 extremes, 2^24 + 1, which fp32 cannot hold), `onnx2bir.api.validate`, and
`onnx2bir validate` exiting 1 with a FAIL verdict for a program whose operator was swapped."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import make_model
from onnx import TensorProto, helper

from onnx2bir import api
from onnx2bir.bir.enums import AluOp, Dtype, Engine, Opcode
from onnx2bir.bir.opcodes import BITVEC_OPS
from onnx2bir.cli.commands import main
from onnx2bir.codegen.driver import CodegenError
from onnx2bir.codegen.lower import bitwise

RNG = np.random.default_rng(7)
TYPES = {
    np.uint8: TensorProto.UINT8,
    np.int8: TensorProto.INT8,
    np.int32: TensorProto.INT32,
    np.int64: TensorProto.INT64,
}
# Dtypes the machine is gaining: tested once the Dtype exists.
NEW_TYPES = {"UINT16": np.uint16, "UINT32": np.uint32, "INT16": np.int16}
ONNX_OF = {
    np.uint16: TensorProto.UINT16,
    np.uint32: TensorProto.UINT32,
    np.int16: TensorProto.INT16,
}
MACHINE_NEW = [dtype for name, dtype in NEW_TYPES.items() if hasattr(Dtype, name)]


def model_of(op_type, dtype, shapes, out_shape, opset=18, initializers=None, **attrs):
    names = ["x", "y"][: len(shapes)]
    node = helper.make_node(op_type, [*names, *(initializers or {})], ["z"], **attrs)
    elem = TYPES.get(dtype) or ONNX_OF[dtype]
    return make_model(
        node,
        dict(zip(names, shapes, strict=True)),
        {"z": out_shape},
        opset=opset,
        initializers=initializers,
        elem_type=elem,
    )


def values(dtype, shape) -> np.ndarray:
    """The dtype's whole range, its extremes and (for 32 bits and more) 2^24 + 1. int64 is
    int32 on the device (docs/neuroncore.md#integers): its values within int32."""
    info = np.iinfo(np.int32 if dtype is np.int64 else dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**32 - 1)
    x = RNG.integers(low, high, shape, dtype=np.int64, endpoint=True)
    flat = x.reshape(-1)
    special = [info.min, info.max, 0, 1, -1 if info.min < 0 else 2]
    if info.bits >= 32:
        special.append(2**24 + 1)
    flat[: len(special)] = np.array(special[: flat.size], np.int64)[: flat.size]
    return x.astype(dtype)


def passes(model, **feeds) -> bool:
    return api.validate(model, inputs=feeds).passed


def instructions(model) -> list:
    return list(api.compile(model).module.functions[0].instructions())


# --- BitShift -----------------------------------------------------------------------------

SHIFT_TYPES = [np.uint8, *[d for d in MACHINE_NEW if np.iinfo(d).min == 0]]


@pytest.mark.parametrize("dtype", SHIFT_TYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize(
    ("x_shape", "y_shape"),
    [((4, 16), (4, 16)), ((3, 5, 16), (16,)), ((6, 1), (1, 16)), ((130, 16), (130, 1))],
    ids=str,
)
def test_bit_shift(dtype, direction, x_shape, y_shape):
    out = np.broadcast_shapes(x_shape, y_shape)
    model = model_of("BitShift", dtype, [x_shape, y_shape], out, direction=direction)
    x = values(dtype, x_shape)
    bits = np.iinfo(dtype).bits
    # Every amount from 0 past the lane width: 8 and more on uint8 gives 0.
    amounts = np.arange(int(np.prod(y_shape))) % (bits + 3)
    amounts[-1] = min(np.iinfo(dtype).max, 200)
    y = amounts.reshape(y_shape).astype(dtype)
    assert passes(model, x=x, y=y)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("amount", [0, 3, 7, 8, 9, 255])
def test_bit_shift_by_a_constant_is_one_tensor_scalar(direction, amount):
    model = model_of(
        "BitShift",
        np.uint8,
        [(5, 40)],
        (5, 40),
        initializers={"s": np.array([amount], np.uint8)},
        direction=direction,
    )
    assert passes(model, x=values(np.uint8, (5, 40)))
    (compute,) = [i for i in instructions(model) if i.opcode is not Opcode.DMA_COPY]
    op = AluOp.LEFT_SHIFT if direction == "LEFT" else AluOp.RIGHT_SHIFT
    assert compute.opcode is Opcode.TENSOR_SCALAR and compute.attrs["op0"] == op
    assert compute.attrs["imm0"] == min(amount, 32)


def test_a_constant_shifted_by_a_tensor_reverses_the_operands():
    model = model_of(
        "BitShift",
        np.uint8,
        [(1,), (4, 9)],
        (4, 9),
        direction="LEFT",
    )
    # x a one-element constant: the value shifted, y the amounts (imm << y).
    model.graph.input.pop(0)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([3], np.uint8), "x"))
    y = (np.arange(36) % 11).reshape(4, 9).astype(np.uint8)
    assert passes(model, y=y)


SIGNED = [np.int8, np.int32, np.int64, *[d for d in MACHINE_NEW if np.iinfo(d).min < 0]]


def signed_shift_model(dtype, x_shape, y_shape, direction, initializers=None):
    """BitShift-28, which takes signed types (an arithmetic right shift)."""
    elem = TYPES.get(dtype) or ONNX_OF[dtype]
    names = [n for n, shape in (("x", x_shape), ("y", y_shape)) if shape is not None]
    node = helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)
    graph = helper.make_graph(
        [node],
        "test",
        [
            helper.make_tensor_value_info(n, elem, list(s))
            for n, s in zip(
                names, [shape for shape in (x_shape, y_shape) if shape is not None], strict=True
            )
        ],
        [helper.make_tensor_value_info("z", elem, None)],
        [
            onnx.numpy_helper.from_array(np.asarray(v, dtype), n)
            for n, v in (initializers or {}).items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def signed_amounts(dtype, shape) -> np.ndarray:
    """Every amount from -3 past the bits of T (BitShift-28: negative or too large an amount
    leaves only the sign extension), and the most negative one."""
    bits = min(np.iinfo(dtype).bits, 32)
    amounts = np.arange(int(np.prod(shape))) % (bits + 6) - 3
    amounts[-1] = np.iinfo(np.int32 if dtype is np.int64 else dtype).min
    return amounts.reshape(shape).astype(dtype)


@pytest.mark.parametrize("dtype", SIGNED, ids=lambda d: d.__name__)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize(("x_shape", "y_shape"), [((3, 40), (40,)), ((130, 1), (130, 5))], ids=str)
def test_signed_bit_shift(dtype, direction, x_shape, y_shape):
    """A right shift of a signed T is arithmetic: ((x ^ m) >>> y) ^ m with m the sign."""
    model = signed_shift_model(dtype, x_shape, y_shape, direction)
    x, y = values(dtype, x_shape), signed_amounts(dtype, y_shape)
    if dtype is np.int64 and direction == "LEFT":
        # int64 is int32 on the device: a left shift exact while the result fits int32.
        x, y = x % 2001 - 1000, np.where(y > 20, 20, y)
    assert passes(model, x=x, y=y)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("amount", [-5, 0, 1, 7, 8, 31, 100])
def test_signed_bit_shift_by_a_constant(direction, amount):
    dtype = np.int8 if -128 <= amount < 128 else np.int32
    model = signed_shift_model(dtype, (4, 30), None, direction, {"y": np.array([amount])})
    assert passes(model, x=values(dtype, (4, 30)))


@pytest.mark.parametrize("value", [-100, -1, 0, 77])
def test_a_signed_constant_shifted_right_by_a_tensor(value):
    """x a constant: one TensorScalar, ~(~x >>> y) for a negative x."""
    model = signed_shift_model(np.int8, None, (5, 12), "RIGHT", {"x": np.array([value])})
    assert passes(model, y=signed_amounts(np.int8, (5, 12)))
    compute = [i for i in instructions(model) if i.opcode is not Opcode.DMA_COPY]
    assert len(compute) == 1 and compute[0].opcode is Opcode.TENSOR_SCALAR


# --- BitwiseAnd, BitwiseOr, BitwiseXor -------------------------------------------------------

BINARY = ["BitwiseAnd", "BitwiseOr", "BitwiseXor"]
ALL_TYPES = [*TYPES, *MACHINE_NEW]


@pytest.mark.parametrize("op_type", BINARY)
@pytest.mark.parametrize("dtype", ALL_TYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize(
    ("x_shape", "y_shape"), [((4, 33), (4, 33)), ((2, 3, 7), (3, 1)), ((5,), (6, 5))], ids=str
)
def test_bitwise_binary(op_type, dtype, x_shape, y_shape):
    out = np.broadcast_shapes(x_shape, y_shape)
    model = model_of(op_type, dtype, [x_shape, y_shape], out)
    assert passes(model, x=values(dtype, x_shape), y=values(dtype, y_shape))


@pytest.mark.parametrize(
    ("dtype", "mask"),
    [(np.uint8, 0xF0), (np.int8, -16), (np.int32, 0x0F0F0F0F), (np.int32, -(2**31))],
    ids=str,
)
@pytest.mark.parametrize("op_type", BINARY)
def test_bitwise_with_a_constant_mask(op_type, dtype, mask):
    """A mask fp32 holds (0xF0, -16, -2^31) rides as an immediate; 0x0F0F0F0F, which fp32
    cannot hold, as the driver's exact steps (an int32 column on GpSimd)."""
    model = model_of(op_type, dtype, [(6, 20)], (6, 20), initializers={"m": np.array(mask, dtype)})
    assert passes(model, x=values(dtype, (6, 20)))
    ops = {i.attrs.get("op", i.attrs.get("op0")) for i in instructions(model)}
    assert bitwise._BINARY[op_type] in ops


def test_integer_lanes():
    """int32 on GpSimd (the code generator's integer lanes), uint8 on VectorE or GpSimd: both
    run bitvec operators."""
    for dtype, engines in ((np.int32, {Engine.POOL}), (np.uint8, {Engine.DVE, Engine.POOL})):
        model = model_of("BitwiseXor", dtype, [(4, 8), (4, 8)], (4, 8))
        (compute,) = [i for i in instructions(model) if i.opcode is Opcode.TENSOR_TENSOR]
        assert compute.engine in engines and compute.attrs["op"] in BITVEC_OPS


# --- BitwiseNot ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_TYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("shape", [(7,), (3, 50), (140, 3)], ids=str)
def test_bitwise_not(dtype, shape):
    model = model_of("BitwiseNot", dtype, [shape], shape)
    assert passes(model, x=values(dtype, shape))


# --- a wrong program fails ----------------------------------------------------------------


def _cli_validate(tmp_path, model, feeds, capsys) -> tuple[int, str]:
    path, inputs = tmp_path / "m.onnx", tmp_path / "in.npz"
    onnx.save(model, path)
    np.savez(inputs, **feeds)
    capsys.readouterr()
    code = main(["validate", str(path), "--inputs", str(inputs)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    ("op_type", "table", "key", "wrong"),
    [
        ("BitwiseAnd", "_BINARY", "BitwiseAnd", AluOp.BITWISE_OR),
        ("BitShift", "_DIRECTIONS", "LEFT", AluOp.RIGHT_SHIFT),
    ],
)
def test_a_swapped_operator_fails_validation(
    tmp_path, capsys, monkeypatch, op_type, table, key, wrong
):
    attrs = {"direction": "LEFT"} if op_type == "BitShift" else {}
    model = model_of(op_type, np.uint8, [(4, 8), (4, 8)], (4, 8), **attrs)
    feeds = {"x": values(np.uint8, (4, 8)), "y": (np.arange(32) % 9).reshape(4, 8).astype(np.uint8)}
    code, out = _cli_validate(tmp_path, model, feeds, capsys)
    assert code == 0 and out.startswith("PASS"), out
    monkeypatch.setitem(getattr(bitwise, table), key, wrong)
    code, out = _cli_validate(tmp_path, model, feeds, capsys)
    assert code == 1 and out.startswith("FAIL"), out
    assert "z  uint8[4, 8]  FAIL" in out


def test_a_logical_shift_for_a_signed_right_shift_fails(monkeypatch):
    """The arithmetic sequence matters: the plain logical shift of a negative int32 is
    caught. (For int8 it would hide below 25 bits: the low byte of a sign-extended lane
    shifted logically is the arithmetic result.)"""
    model = signed_shift_model(np.int32, (4, 10), (10,), "RIGHT")
    feeds = {"x": values(np.int32, (4, 10)), "y": (np.arange(10) % 4).astype(np.int32)}
    assert passes(model, **feeds)

    def logical(cg, node, constant):
        bitwise._emit_binary(cg, node, AluOp.RIGHT_SHIFT, (1, 0), lambda _, value: value)

    monkeypatch.setattr(bitwise, "_arithmetic_right_shift", logical)
    assert not passes(model, **feeds)


def test_an_unknown_direction_is_refused_by_name():
    model = model_of("BitShift", np.uint8, [(2, 3), (2, 3)], (2, 3), direction="LEFT")
    model.graph.node[0].attribute[0].s = b"UP"
    model.graph.node[0].name = "shift"
    with pytest.raises(CodegenError, match=r"node 'shift'.*direction 'UP'"):
        api.compile(model)
