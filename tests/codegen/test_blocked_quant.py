"""Blocked quantization (opset 21 `block_size`) of DequantizeLinear and QuantizeLinear against
onnxruntime, and the refusals: a last partial block, the float8 types
(onnx2bir/codegen/lower/quant.py, docs/quantization.md#blocked)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR_VERSION, assert_matches_onnxruntime, make_model
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.errors import UserError
from onnx2bir.options import CompileOptions


def blocked_dq(shape, axis, block, zero=True, dtype=np.int8, seed=0):
    """y = DequantizeLinear(x, scale, zp), x a graph input of `dtype` (a constant x would be
    folded at import, and the lowering never reached)."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    blocked = list(shape)
    blocked[axis] = -(-shape[axis] // block)
    inits = [numpy_helper.from_array(rng.uniform(0.01, 0.1, blocked).astype(np.float32), "scale")]
    if zero:
        zp = rng.integers(info.min, info.max + 1, size=blocked).astype(dtype)
        inits.append(numpy_helper.from_array(zp, "zp"))
    names = ["x", "scale", *(["zp"] if zero else [])]
    node = helper.make_node("DequantizeLinear", names, ["y"], axis=axis, block_size=block)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [node],
        "blocked",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION
    )


@pytest.mark.parametrize(
    "shape, axis, block, zero, dtype",
    [
        ((64, 24), 0, 16, True, np.int8),
        ((64, 24), 0, 32, False, np.uint8),
        ((24, 64), 1, 16, True, np.uint8),
        ((2, 48, 10), 1, 16, True, np.int8),
        ((3, 4, 64), -1, 32, True, np.int8),
    ],
)
def test_blocked_dequantize_matches_onnxruntime(shape, axis, block, zero, dtype):
    assert_matches_onnxruntime(blocked_dq(shape, axis, block, zero, dtype))


@pytest.mark.parametrize("shape, axis, block", [((64, 24), 0, 16), ((4, 96), 1, 32)])
def test_blocked_quantize_matches_onnxruntime(shape, axis, block):
    rng = np.random.default_rng(1)
    blocked = list(shape)
    blocked[axis] //= block
    inits = {
        "scale": rng.uniform(0.005, 0.02, size=blocked).astype(np.float32),
        "zp": rng.integers(-20, 20, size=blocked).astype(np.int8),
    }
    node = helper.make_node(
        "QuantizeLinear", ["x", "scale", "zp"], ["q"], axis=axis, block_size=block
    )
    cast = helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)
    model = make_model([node, cast], {"x": shape}, {"y": shape}, opset=21, initializers=inits)
    assert_matches_onnxruntime(model)


def test_a_last_partial_block_is_refused():
    model = blocked_dq((40, 8), 0, 16)
    with pytest.raises(UserError, match="block_size 16 does not divide axis 0 of x \\(40\\)"):
        compile_graph(import_graph(model), CompileOptions(auto_cast="none"))


@pytest.mark.parametrize("elem", [TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2FNUZ])
def test_fnuz_float8_dequantize_of_a_run_time_tensor_is_refused_with_the_reason(elem):
    node = helper.make_node("DequantizeLinear", ["x", "scale"], ["y"])
    graph = helper.make_graph(
        [node],
        "fp8",
        [helper.make_tensor_value_info("x", elem, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.float32(0.5), "scale")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=IR_VERSION
    )
    with pytest.raises(UserError, match="float8"):
        compile_graph(import_graph(model), CompileOptions(auto_cast="none"))
