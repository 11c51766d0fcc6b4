"""The general autocast: operand storage, bit-exact matmuls, the PE dtype rules, mutations.

The expected values are derived independently of the code under test: operands rounded by
ml_dtypes (bf16, fp16, fp8 e4m3fn after clamping to ±448) or by float64 arithmetic (tf32:
11 significant bits, ties to even), then multiplied and accumulated in fp32 by numpy.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import make_model, one_node_model
from onnx import helper

from onnx2bir.bir.dtypes import round_tf32, store_as
from onnx2bir.bir.enums import Dtype, Opcode
from onnx2bir.codegen.casting import AUTO_CAST_DTYPES
from onnx2bir.compiler import compile_graph, compile_model, import_graph
from onnx2bir.options import AUTO_CAST_TYPES, CompileOptions
from onnx2bir.runtime.machine import semantics
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.semantics import SEMANTICS, pe_operands_pair
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.validation.run import run_validate

M, K, N = 96, 192, 80  # two K tiles (128 + 64): the second accumulates onto the first in PSUM


def rounded(x: np.ndarray, cast_type: str) -> np.ndarray:
    """x rounded to the cast dtype, back in fp32 (independent of onnx2bir's rounding)."""
    x = np.asarray(x, np.float32)
    if cast_type == "bf16":
        return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    if cast_type == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if cast_type == "fp8_e4m3":
        return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    mantissa, exponent = np.frexp(x.astype(np.float64))  # tf32: 1 + 10 significant bits
    return (np.round(mantissa * 2.0**11) / 2.0**11 * 2.0**exponent).astype(np.float32)


def matmul_case(cast_type: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    scale = 150.0 if cast_type == "fp8_e4m3" else 1.0  # fp8: some operands saturate at 448
    a = (rng.standard_normal((M, K)) * scale).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    model = one_node_model("MatMul", {"a": (M, K)}, initializers={"b": b})
    options = CompileOptions(auto_cast="matmult", auto_cast_type=cast_type)
    compiled = compile_graph(import_graph(model), options, [])
    return compiled, a, b


def expected_matmul(a: np.ndarray, b: np.ndarray, cast_type: str) -> np.ndarray:
    """Rounded operands; each K tile's dot products summed exactly enough (float64) and rounded
    once to fp32, as one Matmult instruction does; the second tile added onto the first in fp32
    (PSUM accumulation)."""
    stationary = rounded(a, cast_type).T.astype(np.float64)  # [K, M], as the PE array holds it
    moving = rounded(b, cast_type).astype(np.float64)
    first = np.matmul(stationary[:128].T, moving[:128]).astype(np.float32)
    second = np.matmul(stationary[128:].T, moving[128:]).astype(np.float32)
    return first + second  # fp32 + fp32 rounds in fp32


@pytest.mark.parametrize("cast_type", AUTO_CAST_TYPES)
def test_one_matmul_is_bit_exact_with_rounded_operands_and_fp32_accumulation(cast_type):
    compiled, a, b = matmul_case(cast_type)
    got = run_function(compiled.module, {"a": a})["y"]
    expected = expected_matmul(a, b, cast_type)
    assert np.array_equal(got, expected)
    assert not np.array_equal(got, a @ b)  # the cast really happened


@pytest.mark.parametrize("cast_type", AUTO_CAST_TYPES)
def test_matmult_operand_tiles_are_in_the_cast_dtype(cast_type):
    compiled, _, _ = matmul_case(cast_type)
    function = compiled.module.functions[0]
    locations = function.memory_locations
    want = AUTO_CAST_DTYPES[cast_type]
    products = [
        ins
        for ins in function.instructions()
        if ins.opcode is Opcode.MATMULT and ins.srcs["moving"].loc != "identity_fp32"
    ]
    assert products
    for ins in products:
        for role in ("stationary", "moving"):
            assert locations[ins.srcs[role].loc].dtype is want
        assert locations[ins.dst.loc].dtype is Dtype.FP32  # PSUM accumulates in fp32
    # The output comes back in the model's dtype.
    assert locations[function.outputs[0]].dtype is Dtype.FP32


def test_auto_cast_none_keeps_fp32_operands():
    rng = np.random.default_rng(0)
    b = rng.standard_normal((K, N)).astype(np.float32)
    model = one_node_model("MatMul", {"a": (M, K)}, initializers={"b": b})
    compiled = compile_graph(import_graph(model), CompileOptions(auto_cast="none"), [])
    function = compiled.module.functions[0]
    dtypes = {
        function.memory_locations[ins.srcs[role].loc].dtype
        for ins in function.instructions()
        if ins.opcode is Opcode.MATMULT
        for role in ("stationary", "moving")
    }
    assert dtypes == {Dtype.FP32}


def test_tf32_rounds_to_nearest_even_and_fp8_saturates():
    # 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even gives 1.
    # 1 + 3·2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even gives 1 + 2^-9.
    values = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-20], np.float32)
    assert round_tf32(values).tolist() == [1.0, 1 + 2.0**-9, 1 + 2.0**-10]
    assert np.isinf(round_tf32(np.array([np.inf], np.float32))[0])
    fp8 = store_as(np.array([500.0, -1e9, np.inf, 448.0, 0.3, np.nan], np.float32), Dtype.FP8_E4M3)
    as_float = fp8.astype(np.float32)
    assert as_float[:4].tolist() == [448.0, -448.0, 448.0, 448.0]
    assert as_float[4] == np.float32(ml_dtypes.float8_e4m3fn(0.3))
    assert np.isnan(as_float[5])


@pytest.mark.parametrize(
    "stationary, moving, ok",
    [
        (Dtype.BF16, Dtype.BF16, True),
        (Dtype.BF16, Dtype.FP8_E4M3, True),
        (Dtype.FP16, Dtype.BF16, True),
        (Dtype.TF32, Dtype.FP32, True),
        (Dtype.FP32, Dtype.FP32, True),
        (Dtype.FP32, Dtype.BF16, False),
        (Dtype.TF32, Dtype.FP16, False),
        (Dtype.FP8_E4M3, Dtype.FP32, False),
        (Dtype.INT32, Dtype.INT32, False),
    ],
)
def test_pe_array_operand_pairs(stationary, moving, ok):
    assert pe_operands_pair(stationary, moving) is ok


original_matmult = semantics.matmult


def _psum_rounded_to_bf16(machine, ins, loop_values):
    """A mutant PE array: PSUM rounded to bf16 after every matmul (the device never does)."""
    original_matmult(machine, ins, loop_values)
    view = machine.operands(ins)["dst"].view(loop_values)
    view[...] = view.astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("cast_type", AUTO_CAST_TYPES)
def test_mutation_psum_rounded_to_bf16_is_caught(monkeypatch, cast_type):
    """The bit-exact test fails on the mutant, whatever the cast type. (The tolerance bound
    alone would not see it at this K: one extra rounding to bf16 is within rtol 2^-6.)"""
    monkeypatch.setitem(SEMANTICS, Opcode.MATMULT, _psum_rounded_to_bf16)
    with pytest.raises(AssertionError):
        test_one_matmul_is_bit_exact_with_rounded_operands_and_fp32_accumulation(cast_type)


def _ulps_added(node: str, ulps: int, cast_dtype: Dtype):
    """A mutant PE array that adds `ulps` units in the last place of the cast dtype to every
    result of node's matmuls, away from zero: a few-ULP error in one matmul."""

    def mutant(machine, ins, loop_values):
        original_matmult(machine, ins, loop_values)
        if ins.origin.node != node:
            return
        view = machine.operands(ins)["dst"].view(loop_values)
        exponent = np.floor(np.log2(np.maximum(np.abs(view), 1e-30)))
        ulp = 2.0 ** (exponent - cast_dtype.mantissa_bits)
        view[...] = view + ulps * ulp * np.sign(view)

    return mutant


@pytest.mark.parametrize("cast_type", AUTO_CAST_TYPES)
def test_emulating_verdict_passes_the_cast_and_fails_one_ulp_in_one_matmul(
    monkeypatch, tmp_path, cast_type
):
    """One MatMul, K = 128 (one matmul instruction per output tile): the correct program
    matches the emulating oracle at the fp32 bound; the same program with one ULP of the cast
    dtype added to the matmul's results does not (the old statistical bound let 2 ULPs
    through for bf16 and fp8)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((128, 256)) / np.sqrt(128)).astype(np.float32)
    model = make_model(
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        {"x": (256, 128)},
        {"y": None},
        initializers={"w": w},
    )
    path = tmp_path / "matmul.onnx"
    onnx.save(model, path)
    options = CompileOptions(auto_cast="matmult", auto_cast_type=cast_type)
    doc, _, _ = run_validate(str(path), options, TolerancePolicy())
    assert doc["passed"], doc["outputs"][0]
    assert doc["outputs"][0]["bound"] == "fp32"
    assert doc["outputs"][0]["drift"]["r"] == pytest.approx(1.0, abs=0.05)
    mutant = _ulps_added("mm", 1, AUTO_CAST_DTYPES[cast_type])
    monkeypatch.setitem(SEMANTICS, Opcode.MATMULT, mutant)
    doc, _, _ = run_validate(str(path), options, TolerancePolicy())
    assert not doc["passed"]


ROOT = Path(__file__).resolve().parents[2]
PRODUCT_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}
PRODUCT_RULES = ("generic.MatMul", "generic.Gemm", "generic.Conv", "generic.ConvTranspose")


def _product_matmul_dtypes(module) -> dict[str, set]:
    function = module.functions[0]
    locations = function.memory_locations
    found: dict[str, set] = {}
    for ins in function.instructions():
        if ins.opcode is Opcode.MATMULT and ins.srcs["moving"].loc != "identity_fp32":
            pair = tuple(locations[ins.srcs[r].loc].dtype for r in ("stationary", "moving"))
            found.setdefault(ins.origin.rule, set()).add(pair)
    return found


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "models").glob("*.onnx")))
def test_every_product_matmul_of_the_zoo_takes_bf16_operands_by_default(name):
    """Generic MatMul/Gemm/Conv/ConvTranspose, the conv kernels and the MLP kernel: bf16
    operands under the default options; one-hot gathers and Resize matmuls move data and
    stay fp32."""
    path = ROOT / "models" / f"{name}.onnx"
    found = _product_matmul_dtypes(compile_model(path).module)
    products = {n.op_type for n in onnx.load(str(path)).graph.node} & PRODUCT_OPS
    assert bool(found) == bool(products), (found, products)
    for rule, pairs in found.items():
        if rule in PRODUCT_RULES or rule.startswith("kernel."):
            assert pairs == {(Dtype.BF16, Dtype.BF16)}, rule
        else:
            assert pairs == {(Dtype.FP32, Dtype.FP32)}, rule


def test_column_packing_kernel_under_the_autocast(tmp_path):
    """C_in·kH > 128 sends a dense conv to conv2d_column_packing; its weights and im2col tile
    are bf16 and the result matches the emulating oracle at the fp32 bound."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 16, 9, 9)) / 36).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    model = make_model(
        helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv"),
        {"x": (1, 16, 12, 12)},
        {"y": None},
        initializers={"w": w, "b": bias},
    )
    compiled = compile_model(model)
    assert _product_matmul_dtypes(compiled.module) == {
        "kernel.conv2d_column_packing": {(Dtype.BF16, Dtype.BF16)}
    }
    path = tmp_path / "conv.onnx"
    onnx.save(model, path)
    doc, _, _ = run_validate(str(path), CompileOptions(), TolerancePolicy())
    assert doc["passed"] and doc["outputs"][0]["bound"] == "fp32"
