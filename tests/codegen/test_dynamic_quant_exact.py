"""onnxruntime's `quantize_dynamic` models validate exactly (docs/quantization.md#dynamic).

Small BERT-style encoders and Llama-style decoders are written with onnx.helper and quantized
by onnxruntime's own `quant_pre_process` + `quantize_dynamic` with its defaults
(models/dynamic_blocks.py: no torch). Every integer tensor the tool wrote — each
DynamicQuantizeLinear's y and zero point, each MatMulInteger's int32 — is made a graph output,
so the verdict compares it with onnxruntime at the exact bound; every checkpoint must pass too,
and the int32 accumulators cast to float must agree to 0. The "split" cases have uniform
weights, whose bound passes 2^24 so a projection runs as two matmuls added in int32. Each of
these models has MatMulIntegers that onnxruntime's u8s8 kernel would get wrong on a CPU
without VNNI (int16 pair sums saturated); the oracle computes them exactly
(runtime/oracle/exact_integers.py, tests/oracle/test_exact_integers.py).

DynamicQuantizeLinear itself is checked against a numpy statement of onnxruntime's kernel
(fp32 scale (max − min) / 255, zero point and y by division and round half to even) on inputs
full of exact ties, and a zero point one off fails the verdict.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx2bir import api
from onnx2bir.patterns.quant import qlinear_ops
from onnx2bir.runtime.oracle.ort import run_onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from dynamic_blocks import (  # noqa: E402
    DecoderSize,
    EncoderSize,
    float_decoder,
    float_encoder,
    integer_tensors,
    quantize_dynamic_defaults,
    token_ids,
    with_integer_outputs,
)

CASES = {
    "encoder": (float_encoder, EncoderSize(), False),
    "decoder": (float_decoder, DecoderSize(), False),
    "encoder_split": (float_encoder, EncoderSize(hidden=128, layers=1, seq=32, ffn=1024), True),
    "decoder_split": (float_decoder, DecoderSize(hidden=128, layers=1, seq=32, ffn=1024), True),
}


@functools.cache
def _quantized(case: str) -> onnx.ModelProto:
    build, size, uniform = CASES[case]
    return quantize_dynamic_defaults(build(size, seed=len(case), uniform=uniform))


def _feeds(case: str) -> dict[str, np.ndarray]:
    size = CASES[case][1]
    return token_ids(size.vocab, size.seq, seed=3)


def _accumulator_casts(model: onnx.ModelProto) -> set[str]:
    """The float tensors the tool casts each MatMulInteger's int32 result into."""
    accumulators = {n.output[0] for n in model.graph.node if n.op_type == "MatMulInteger"}
    return {
        n.output[0] for n in model.graph.node if n.op_type == "Cast" and n.input[0] in accumulators
    }


def test_the_models_are_what_quantize_dynamic_writes():
    for case in CASES:
        ops = [n.op_type for n in _quantized(case).graph.node]
        assert ops.count("MatMulInteger") == ops.count("Cast") > 0
        assert "DynamicQuantizeLinear" in ops and "MatMul" in ops  # attention stays float
        weights = {i.name: i.data_type for i in _quantized(case).graph.initializer}
        for node in _quantized(case).graph.node:
            if node.op_type == "MatMulInteger":
                assert weights[node.input[1]] == TensorProto.INT8


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("auto_cast", ["matmult", "none"])
def test_every_checkpoint_and_integer_tensor_is_exact(case, auto_cast):
    model = with_integer_outputs(_quantized(case))
    doc = api.validate(model, inputs=_feeds(case), auto_cast=auto_cast).document
    assert doc["passed"]
    records = doc["outputs"] + doc["checkpoints"]
    assert records and all(r["passed"] for r in records)
    exact = {r["name"]: r for r in doc["outputs"] if r["bound"] == "exact"}
    assert set(exact) == set(integer_tensors(model))
    assert all(r["max_abs_err"] == 0 and r["atol"] == 0 for r in exact.values())
    assert all(r["max_abs_err"] == 0 for r in records if r["bound"] == "exact")
    casts = [r for r in doc["checkpoints"] if r["name"] in _accumulator_casts(model)]
    assert casts and all(r["max_abs_err"] == 0 for r in casts)


def test_the_split_cases_split_a_reduction():
    for case in ("encoder_split", "decoder_split"):
        entries = api.report(_quantized(case)).document["quantized"]
        assert all(e["path"] == "integer" for e in entries)
        assert any(e.get("split", 1) >= 2 for e in entries)


def test_a_dynamic_zero_point_one_off_fails(monkeypatch):
    model = with_integer_outputs(_quantized("encoder"))
    real = qlinear_ops._Emitter.quantize

    def one_off(self, x, scale, zero, out):  # DynamicQuantizeLinear's zero point, + 1
        return real(self, x, scale, np.asarray(zero) + np.uint8(1), out)

    monkeypatch.setattr(qlinear_ops._Emitter, "quantize", one_off)
    doc = api.validate(model, inputs=_feeds("encoder")).document
    assert not doc["passed"]
    zero_points = {n.output[2] for n in model.graph.node if n.op_type == "DynamicQuantizeLinear"}
    failed = {r["name"]: r for r in doc["outputs"] if not r["passed"] and r["mismatches"]}
    assert zero_points <= set(failed)
    assert all(failed[z]["max_abs_err"] == 1 for z in zero_points)


# --- DynamicQuantizeLinear against onnxruntime's kernel, stated in numpy ----------------------
def _ort_formula(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """onnxruntime's DynamicQuantizeLinear (GetQuantizationParameter, MlasQuantizeLinear):
    range widened to 0, fp32 scale (max − min) / 255 (1 for an all-zero input), zero point
    rne(sat(0 − min / scale)), y = sat(rne(x / scale) + zero point); np.rint ties to even."""
    f32 = np.float32
    low, high = min(f32(0), x.min()), max(f32(0), x.max())
    scale = f32(1) if high == low else f32(f32(high - low) / f32(255))
    zero = np.clip(np.rint(f32(0) - f32(low / scale)), 0, 255)
    y = np.clip(np.rint((x / scale).astype(f32)) + zero, 0, 255)
    return y.astype(np.uint8), scale, np.uint8(zero)


def _ties(low: float, high: float) -> np.ndarray:
    """Values v with v / scale exactly k + ½ in fp32, between `low` and `high` (the input's
    range, which fixes the scale): where round half to even and half up disagree."""
    f32 = np.float32
    scale = f32(f32(f32(high) - f32(low)) / f32(255))
    steps = np.arange(np.floor(low / scale), np.ceil(high / scale)) + 0.5
    values = (steps * scale).astype(f32)
    exact = (values / scale).astype(f32) == steps.astype(f32)
    return values[exact & (values > low) & (values < high)]


def _zero_point_tie(k: int) -> tuple[float, float]:
    """An input range (min, max) for which 0 − min / scale is exactly k + ½ in fp32."""
    f32 = np.float32
    for i in range(10000):
        scale = f32(0.004 * (1 + i / 10007))
        low = f32(-(k + 0.5) * scale)
        high = f32(f32(255) * scale + low)
        exact_scale = f32(f32(high - low) / f32(255)) == scale
        if exact_scale and f32(0) - f32(low / scale) == k + 0.5:
            return float(low), float(high)
    raise AssertionError("no tie found")


def _dynamic_model(shape) -> onnx.ModelProto:
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero"], name="dq")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [
            helper.make_tensor_value_info("y", TensorProto.UINT8, list(shape)),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("zero", TensorProto.UINT8, []),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)


@pytest.mark.parametrize("tie", [100, 37])  # the zero point rounds down to 100, up to 38
def test_dynamic_quantize_linear_rounds_ties_as_onnxruntime_does(tie):
    low, high = _zero_point_tie(tie)
    ties = _ties(low, high)
    rng = np.random.default_rng(tie)
    x = np.concatenate([[low, high], ties, rng.uniform(low, high, 4096 - 2 - ties.size)])
    x = x.astype(np.float32).reshape(32, 128)
    y, scale, zero = _ort_formula(x)
    quotients = (ties / scale).astype(np.float32)
    assert ties.size > 100 and np.any(np.floor(quotients + 0.5) != np.rint(quotients))
    assert zero == (tie if tie % 2 == 0 else tie + 1)  # k + ½ to the even neighbour
    model = _dynamic_model(x.shape)
    ort = run_onnxruntime(model, {"x": x})
    assert np.array_equal(ort["y"], y) and ort["scale"] == scale and ort["zero"] == zero
    doc = api.validate(model, inputs={"x": x}).document
    assert doc["passed"] and all(o["max_abs_err"] == 0 for o in doc["outputs"])
