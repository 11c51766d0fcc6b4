"""Tan, Sinh, Cosh, the inverse trigonometric and hyperbolic functions and Swish
(codegen/lower/math_inverse.py) against onnxruntime through `onnx2bir.api.validate`, and the
machine's outputs against numpy's float64 functions in fp32 ulps: inputs from 1e-30 to the
edge of each domain (overflow, |x| near 1), the special values and out-of-domain inputs.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2bir.api as api
from onnx2bir.bir.enums import AluOp
from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.codegen.lower import math_inverse
from onnx2bir.codegen.lower.elementwise import emit_elementwise

_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def _model(op: str, n: int, dtype=np.float32, opset: int = 18, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    elem = _TYPES[dtype]
    graph = helper.make_graph(
        [node],
        "t",
        [helper.make_tensor_value_info("x", elem, [n])],
        [helper.make_tensor_value_info("y", elem, [n])],
    )
    ir = 11 if opset >= 24 else 10
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
    onnx.checker.check_model(model, full_check=True)
    return model


def _magnitudes(lo: float, hi: float, n: int, seed: int, signed: bool = True) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    if signed:
        x *= rng.choice([-1.0, 1.0], n)
    return x.astype(np.float32)


def _near_one(n: int, seed: int, signed: bool) -> np.ndarray:
    """±(1 − d) for d from one fp32 ulp below 1 up to 0.1."""
    x = 1.0 - _magnitudes(6e-8, 0.1, n, seed, signed=False)
    if signed:
        x *= np.random.default_rng(seed).choice([-1.0, 1.0], n)
    return x.astype(np.float32)


def _inputs(op: str) -> np.ndarray:
    m = _magnitudes
    parts = {
        "Sinh": [m(1e-30, 89.4, 1500, 1), m(0.5, 2.0, 300, 2)],
        "Cosh": [m(1e-30, 89.4, 1500, 3)],
        "Tan": [
            m(1e-30, 1e6, 1500, 4),
            (np.arange(-2000, 2000) * (np.pi / 2)).astype(np.float32),  # near the poles
            (np.arange(-2000, 2000) * np.pi).astype(np.float32),  # near the zeros
        ],
        "Atan": [m(1e-30, 3e38, 1500, 5)],
        "Asin": [m(1e-30, 1.0, 1500, 6), _near_one(300, 7, True)],
        "Acos": [m(1e-30, 1.0, 1500, 8), _near_one(300, 9, True)],
        "Atanh": [m(1e-30, 1.0, 1500, 10), _near_one(300, 11, True)],
        "Asinh": [m(1e-30, 3e38, 1500, 12)],
        "Acosh": [1.0 + m(1e-7, 10.0, 500, 13, signed=False), m(1.0, 3e38, 1000, 14, False)],
        "Swish": [m(1e-30, 80.0, 1500, 15)],
    }[op]
    return np.concatenate(parts).astype(np.float32)


def _swish(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    return x / (1.0 + np.exp(-alpha * x))


_REFERENCE = {
    "Sinh": np.sinh,
    "Cosh": np.cosh,
    "Tan": np.tan,
    "Atan": np.arctan,
    "Asin": np.arcsin,
    "Acos": np.arccos,
    "Atanh": np.arctanh,
    "Asinh": np.arcsinh,
    "Acosh": np.arccosh,
    "Swish": _swish,
}
# The largest error measured over `_inputs`, in fp32 ulps of the float64 result, rounded up.
_ULPS = {
    "Sinh": 3,
    "Cosh": 3,
    "Tan": 4,
    "Atan": 2,
    "Asin": 2,
    "Acos": 2,
    "Atanh": 3,
    "Asinh": 3,
    "Acosh": 4,
    "Swish": 3,
}
_SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.5, 1e-45], "f4")


def _ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y − ref| in units of the fp32 spacing at ref, where ref is a finite normal fp32."""
    ref32 = ref.astype(np.float32)
    keep = np.isfinite(ref32) & (np.abs(ref) >= np.finfo(np.float32).tiny)
    return np.abs(y[keep].astype(np.float64) - ref[keep]) / np.spacing(np.abs(ref32[keep]))


def _opset(op: str) -> int:
    return 24 if op == "Swish" else 18


@pytest.mark.parametrize("op", list(_REFERENCE))
def test_within_ulps_of_float64_and_matches_onnxruntime(op: str) -> None:
    x = _inputs(op)
    model = _model(op, x.size, opset=_opset(op))
    # at rtol 1e-5, no atol; but onnxruntime's Swish is 0 where x·sigmoid(x) < ~1e-28
    # (x < -65): the default tolerance for it, the ulps below against float64
    tight = {} if op == "Swish" else {"atol": 0.0, "rtol": 1e-5}
    result = api.validate(model, {"x": x}, auto_cast="none", **tight)
    assert result.passed, result.document
    y = result.outputs["y"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _REFERENCE[op](x.astype(np.float64))
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    assert np.array_equal(np.isinf(y), np.isinf(ref.astype(np.float32)))
    error = _ulp_error(y, ref)
    assert error.max() <= _ULPS[op], (op, error.max(), x[np.argmax(error)])


@pytest.mark.parametrize("op", list(_REFERENCE))
def test_special_values_default_autocast(op: str) -> None:
    """±0, ±inf, NaN, the domain edges and beyond; under the default autocast."""
    result = api.validate(_model(op, _SPECIAL.size, opset=_opset(op)), {"x": _SPECIAL})
    assert result.passed, result.document
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _REFERENCE[op](_SPECIAL.astype(np.float64)).astype(np.float32)
    y = result.outputs["y"]
    if op != "Swish":  # onnxruntime's x·sigmoid(x) at -inf: NaN or -0, either is fine
        assert np.array_equal(np.isnan(y), np.isnan(ref))
    finite = np.isfinite(ref)
    assert np.array_equal(y[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
    np.testing.assert_allclose(y[finite], ref[finite], rtol=3e-7, atol=0)


def test_swish_alpha() -> None:
    x = _magnitudes(1e-6, 40.0, 500, 16)
    result = api.validate(_model("Swish", x.size, opset=24, alpha=0.35), {"x": x})
    assert result.passed, result.document
    # αx rounds to fp32 on ScalarE's input, as in onnxruntime: the reference takes it so
    alpha_x = (x * np.float32(0.35)).astype(np.float64)
    ref = x.astype(np.float64) / (1.0 + np.exp(-alpha_x))
    assert _ulp_error(result.outputs["y"], ref).max() <= 3


@pytest.mark.parametrize("op", ["Asinh", "Acos", "Tan"])
def test_float16(op: str) -> None:
    x = {"Asinh": _magnitudes(1e-4, 6e4, 300, 17), "Acos": _magnitudes(1e-4, 1.0, 300, 18)}.get(
        op, _magnitudes(1e-4, 100.0, 300, 19)
    )
    x = x.astype(np.float16)
    result = api.validate(_model(op, x.size, np.float16), {"x": x}, auto_cast="none")
    assert result.passed, result.document
    ref = _REFERENCE[op](x.astype(np.float64)).astype(np.float16)
    y = result.outputs["y"]
    assert y.dtype == np.float16
    spacing = np.spacing(np.abs(ref)).astype(np.float64)
    assert (np.abs(y.astype(np.float64) - ref.astype(np.float64)) / spacing).max() <= 1


def test_a_wrong_formula_is_rejected(monkeypatch) -> None:
    """Validation at rtol 1e-5 tells a slightly different function apart: a lowering of
    Asinh that computes asinh(x)·(1 + 1e-4) is rejected, the real one passes."""
    x = _magnitudes(1e-3, 1e3, 600, 20)
    model = _model("Asinh", x.size)
    tight = {"auto_cast": "none", "atol": 0.0, "rtol": 1e-5}
    assert api.validate(model, {"x": x}, **tight).passed

    def wrong(cg, node) -> None:
        scratch = math_inverse._Scratch(cg, 9, 2)

        def run(cg, dst, srcs) -> None:
            f, m = scratch.at(dst)
            math_inverse._asinh(cg, dst, srcs[0], f, m)
            cg.tensor_scalar(dst, dst, AluOp.MULTIPLY, 1.0001)

        emit_elementwise(cg, node, run)

    monkeypatch.setitem(GENERIC_LOWERINGS, "Asinh", wrong)
    assert not api.validate(model, {"x": x}, **tight).passed


def test_integer_input_is_refused() -> None:
    node = helper.make_node("Swish", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "t",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=11)
    with pytest.raises(Exception, match="floats only|not supported|type"):
        api.compile(model)
