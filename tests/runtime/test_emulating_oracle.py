"""The emulating oracle: its roundings bit for bit against ml_dtypes, where it inserts them,
what it feeds from the machine, the flip allowance of a kernel boundary and the summation-order
allowance of a reduction.

Expected roundings come from ml_dtypes (bf16, fp16, fp8 e4m3fn after clamping to ±448, the
device's saturation) and, for tf32 (no ml_dtypes type), from integer arithmetic on the fp32 bit
pattern written here: round to nearest even at bit 13.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import IR_VERSION, make_model
from onnx import TensorProto, helper

from onnx2bir.bir.cast_plan import Boundary, CastPlan, CastPoint
from onnx2bir.compiler import import_graph
from onnx2bir.runtime.oracle.emulating import (
    ACCUMULATION_SUFFIX,
    ALLOWANCE_SUFFIX,
    FORMATS,
    MACHINE_SUFFIX,
    arithmetic_rounding,
    emulating_model,
    round_weights,
    rounding_nodes,
    run_emulating,
)
from onnx2bir.runtime.oracle.ort import run_onnxruntime

DTYPES = ("bfloat16", "float16", "tfloat32", "float8_e4m3")


def _tf32(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0xFFF + lsb) & 0xFFFFE000).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)


def expected(x: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "bfloat16":
            return x.astype(ml_dtypes.bfloat16).astype(np.float32)
        if dtype == "float16":
            return x.astype(np.float16).astype(np.float32)
        if dtype == "float8_e4m3":
            return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return _tf32(x)


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32)
    ties = []
    for precision in (4, 8, 11):  # exactly half-way between two values of each format
        mantissa = rng.integers(0, 2 ** (precision - 1), 5_000)
        exponent = rng.integers(-20, 20, 5_000)
        ties.append(
            ((2 ** (precision - 1) + mantissa + 0.5) * 2.0 ** (exponent - precision + 1)).astype(
                np.float32
            )
        )
    edges = np.array(
        [
            0.0,
            np.inf,
            np.nan,
            448,
            449,
            464,
            465,
            480,
            1e30,
            65504,
            65519,
            65520,
            3.4e38,
            1e-40,
            1e-45,
            2**-126,
            2**-127,
            2**-133,
            3 * 2**-134,
            2**-9,
            2**-10,
        ],
        np.float32,
    )
    normal = rng.standard_normal(50_000).astype(np.float32)
    return np.concatenate([bits.view(np.float32), edges, -edges, *ties, normal])


def _round_with_onnx(nodes, consts, x: np.ndarray, opset: int) -> np.ndarray:
    graph = helper.make_graph(
        nodes,
        "round",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])],
        consts,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    return run_onnxruntime(model.SerializeToString(), {"x": x})["y"]


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_rounding_the_oracle_inserts_is_the_devices_bit_for_bit(dtype):
    """Random bit patterns (subnormals, ±inf, NaN included), every kind of tie, the ends of
    each format's range: the same bits as ml_dtypes (and the tf32 bit rounding)."""
    x = _values()
    nodes, consts = rounding_nodes("x", "y", dtype, 18, "r")
    got = _round_with_onnx(nodes, consts, x, 18)
    bad = np.flatnonzero(~_same_bits(got, expected(x, dtype)))
    assert bad.size == 0, [(x[i], got[i], expected(x, dtype)[i]) for i in bad[:5]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_arithmetic_rounding_holds_in_opset_9(dtype):
    """Models older than opset 13 have no bfloat16 Cast (the onnx light models are opset 9):
    the arithmetic form, made of opset-9 ops, is exact too."""
    x = _values()
    nodes, consts = arithmetic_rounding("x", "y", FORMATS[dtype], "r")
    got = _round_with_onnx(nodes, consts, x, 9)
    assert _same_bits(got, expected(x, dtype)).all()


def test_a_wrong_rounding_is_told_apart():
    """The comparison above can fail: rounding toward zero differs from the device's."""
    x = _values()
    truncated = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    assert not _same_bits(truncated, expected(x, "bfloat16")).all()


def _mm_add():
    """y = x·w + x: the MatMul reads x rounded, the Add reads it as it is."""
    w = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    proto = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
            helper.make_node("Add", ["p", "x"], ["y"], name="add"),
        ],
        {"x": (4, 8)},
        {"y": None},
        initializers={"w": w},
    )
    return proto, import_graph(proto), w


def test_a_cast_point_rounds_only_the_edge_it_names():
    proto, graph, w = _mm_add()
    plan = CastPlan(
        (
            CastPoint("mm", "x", "bfloat16", "operand"),
            CastPoint("mm", "w", "bfloat16", "operand"),
        )
    )
    x = (np.random.default_rng(2).standard_normal((4, 8)) + 1 / 3).astype(np.float32)
    got = run_emulating(proto, graph, {}, plan, {"x": x})["y"]
    bf = expected(x, "bfloat16").astype(np.float64) @ expected(w, "bfloat16").astype(np.float64)
    np.testing.assert_allclose(got, bf + x, rtol=1e-6, atol=1e-6)  # the Add's x is not rounded
    plain = x.astype(np.float64) @ w.astype(np.float64) + x
    assert np.abs(got - plain).max() > 1e-3  # and the MatMul's are


@pytest.mark.parametrize("opset", [9, 18])
@pytest.mark.parametrize("dtype", DTYPES)
def test_weights_rounded_once_are_the_devices_rounding_and_feed_every_run(dtype, opset):
    """A held-aside weight's rounding, computed once for all the oracle's runs, has the device's
    bits (ml_dtypes), in the Cast form and the arithmetic one; the oracle fed it gives what it
    computes rounding the weight itself."""
    proto, graph, w = _mm_add()
    del proto.opset_import[:]
    proto.opset_import.append(helper.make_opsetid("", opset))
    plan = CastPlan((CastPoint("mm", "w", dtype, "operand"),))
    key = f"w::{dtype}"
    bits = _values()  # every kind of bit pattern, tie and edge, as a weight
    rounded = round_weights(proto, {"w": bits}, plan)
    assert list(rounded) == [key]
    assert _same_bits(rounded[key], expected(bits, dtype)).all()
    rounded = round_weights(proto, {"w": w}, plan)
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    del proto.graph.initializer[:]  # held aside: fed at run time, as the import does
    proto.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 8]))
    itself = run_emulating(proto, graph, {"w": w}, plan, {"x": x})["y"]
    fed = run_emulating(proto, graph, {"w": w}, plan, {"x": x}, prerounded=rounded)["y"]
    assert _same_bits(fed, itself).all()
    wrong = {key: rounded[key] * np.float32(1.01)}  # the fed value is the one used
    assert not _same_bits(
        run_emulating(proto, graph, {"w": w}, plan, {"x": x}, prerounded=wrong)["y"], itself
    ).all()


def test_every_reader_of_a_resynchronised_tensor_takes_the_machines_value():
    """The MatMul rounds the machine's x (1 + 2^-10 rounds to 1 in bf16); the Add reads the
    machine's x unrounded."""
    proto, graph, w = _mm_add()
    plan = CastPlan((CastPoint("mm", "x", "bfloat16", "operand"),))
    x = np.zeros((4, 8), np.float32)
    machine_x = np.full((4, 8), 1.0 + 2**-10, np.float32)
    model = emulating_model(proto, graph, plan, {"x"})
    assert "x" + MACHINE_SUFFIX in [i.name for i in model.graph.input]
    got = run_emulating(proto, graph, {}, plan, {"x": x}, {"x": machine_x})["y"]
    np.testing.assert_allclose(got, np.ones((4, 8)) @ w + machine_x, rtol=1e-6)


def test_a_kernel_boundarys_allowance_covers_flips_near_half_way_points_only():
    """h = relu(x·w1), y = h·w2 with h rounded inside the kernel: the allowance of a row of y
    is non-zero only where some h of that row sits within reach of a half-way point, and then
    it is the bf16 spacing of that h times |w2|."""
    w1 = np.eye(4, dtype=np.float32)
    w2 = np.arange(1, 9, dtype=np.float32).reshape(4, 2) - 4.0
    proto = make_model(
        [
            helper.make_node("MatMul", ["x", "w1"], ["m"], name="up"),
            helper.make_node("Relu", ["m"], ["h"], name="act"),
            helper.make_node("MatMul", ["h", "w2"], ["y"], name="down"),
        ],
        {"x": (2, 4)},
        {"y": None},
        initializers={"w1": w1, "w2": w2},
    )
    graph = import_graph(proto)
    plan = CastPlan(
        (CastPoint("down", "h", "bfloat16", "operand"),),
        boundaries={"y": Boundary("y", "down", "h", 0, "bfloat16")},
    )
    half_way = 1.0 + 2**-8  # between the bf16 values 1 and 1 + 2^-7
    x = np.array([[1.25, 1.5, 0.75, 1.0], [half_way, 1.5, 0.75, 1.0]], np.float32)
    got = run_emulating(
        proto,
        graph,
        {},
        plan,
        {"x": x},
        {"y": np.zeros((2, 2), np.float32)},
        outputs=["y" + ALLOWANCE_SUFFIX],
    )["y" + ALLOWANCE_SUFFIX]
    np.testing.assert_array_equal(got[0], [0.0, 0.0])
    np.testing.assert_allclose(got[1], 2**-7 * np.abs(w2[0]), rtol=0)


# --- the summation-order allowance of a reduction --------------------------------------------
def _cancelling_matmul(k: int = 4096, n: int = 16):
    """y = x·w whose K products are large (|x| about 1e3) and cancel: the last row of w makes
    every exact sum about 1e-3 of one term, so two fp32 orders differ by far more than the fp32
    bound of y."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((1, k)) * 1e3).astype(np.float32)
    w = rng.standard_normal((k, n))
    w[-1] = -(x[0, :-1].astype(np.float64) @ w[:-1]) / float(x[0, -1])
    w[-1] += rng.standard_normal(n) * 1e-3
    w = w.astype(np.float32)
    proto = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        {"x": (1, k)},
        {"y": None},
        initializers={"w": w},
    )
    return proto, x, w


def _sequential(products: np.ndarray) -> np.ndarray:
    return np.cumsum(products, axis=0, dtype=np.float32)[-1]  # left to right, in fp32


def test_a_reductions_allowance_admits_another_summation_order_and_rejects_a_wrong_sum():
    proto, x, w = _cancelling_matmul()
    graph = import_graph(proto)
    got = run_emulating(
        proto, graph, {}, CastPlan(), {"x": x}, outputs=["y", "y" + ACCUMULATION_SUFFIX]
    )
    allowance = got["y" + ACCUMULATION_SUFFIX][0].astype(np.float64)
    products = (x[0][:, None] * w).astype(np.float32)
    forward, backward = _sequential(products), _sequential(products[::-1])
    exact = x[0].astype(np.float64) @ w.astype(np.float64)

    def within(a, b, extra=0.0):
        return np.abs(a.astype(np.float64) - b) <= 1e-4 + 1e-3 * np.abs(b) + extra

    assert not within(forward, backward).all()  # the fp32 bound alone rejects a right answer
    for one, other in ((forward, backward), (forward, got["y"][0]), (backward, exact)):
        assert within(one, other, allowance).all()
    # Wrong sums: the largest term dropped, and an error of 1e-4·Σ|t| in either direction.
    magnitude = np.abs(products).astype(np.float64).sum(axis=0)
    largest = products[np.abs(products).argmax(axis=0), np.arange(products.shape[1])]
    assert not within(forward - largest, exact, allowance).any()
    for sign in (1, -1):
        assert not within(forward + sign * 1e-4 * magnitude, exact, allowance).any()


def test_a_reductions_allowance_grows_with_the_magnitude_of_its_terms_not_its_sum():
    """The same cancelling sums with the terms ten times larger: ten times the allowance
    (Σ|t| scales), whatever the sums themselves do."""
    proto, x, w = _cancelling_matmul(k=256, n=4)
    graph = import_graph(proto)

    def allowance(scale):
        return run_emulating(
            proto,
            graph,
            {},
            CastPlan(),
            {"x": x * np.float32(scale)},
            outputs=["y" + ACCUMULATION_SUFFIX],
        )["y" + ACCUMULATION_SUFFIX]

    magnitude = np.abs(x[0]).astype(np.float64) @ np.abs(w).astype(np.float64)
    ratio = allowance(1.0)[0] / magnitude
    assert np.allclose(ratio, ratio[0], rtol=1e-5) and 0 < ratio[0] < 1e-4
    np.testing.assert_allclose(allowance(10.0), 10 * allowance(1.0), rtol=1e-6)
