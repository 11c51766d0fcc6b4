"""Tolerance policy: defaults by path, overrides from the command line and a file, their
precedence, and the smallest tolerance that would have passed."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from validation_helpers import F32, SMALL_CNN, model, run, run_json

from onnx2bir.bir.cast_plan import CastPlan
from onnx2bir.compiler import import_graph
from onnx2bir.runtime.machine import interpreter
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.tolerance import (
    FP32_ATOL,
    FP32_RTOL,
    Partial,
    Tolerance,
    TolerancePolicy,
    einsum_terms,
    low_precision_tolerance,
)
from onnx2bir.runtime.oracle.verdict import bound_for, taints

OFFSET = 0.01


@pytest.fixture
def off_by_a_bit(monkeypatch):
    """The machine's logits come out OFFSET too high."""
    real = interpreter.run_function

    def shifted(*args, **kwargs):
        return {name: value + np.float32(OFFSET) for name, value in real(*args, **kwargs).items()}

    monkeypatch.setattr(interpreter, "run_function", shifted)


def _logits(doc):
    (entry,) = doc["outputs"]
    return entry


def test_default_fp32_tolerance_catches_the_offset(off_by_a_bit, capsys):
    code, doc = run_json(["validate", SMALL_CNN, "--auto-cast", "none"], capsys)
    logits = _logits(doc)
    assert code == 1 and not logits["passed"]
    assert (logits["atol"], logits["rtol"]) == (FP32_ATOL, FP32_RTOL)
    assert logits["tolerance_source"] == "fp32 path default" and logits["path"] == "fp32"


def test_the_default_autocast_is_judged_at_the_fp32_bound_and_catches_the_offset(
    off_by_a_bit, capsys
):
    """Under the default autocast the oracle rounds where the program rounds, so the bound is
    the `--auto-cast none` one (docs/validation.md#verdict)."""
    code, doc = run_json(["validate", SMALL_CNN], capsys)
    logits = _logits(doc)
    assert code == 1 and not logits["passed"] and logits["bound"] == "fp32"
    assert (logits["atol"], logits["rtol"]) == (FP32_ATOL, FP32_RTOL)
    assert logits["drift"]["max_abs_err"] >= OFFSET * 0.9


@pytest.mark.parametrize(
    "flags, source",
    [
        (["--tolerance", "logits=0.02,0"], "--tolerance logits"),
        (["--op-tolerance", "Gemm=0.02,0"], "--op-tolerance Gemm"),
        (["--atol", "0.02", "--rtol", "0"], "--atol/--rtol"),
    ],
)
def test_command_line_overrides(off_by_a_bit, capsys, flags, source):
    code, doc = run_json(["validate", SMALL_CNN, *flags], capsys)
    logits = _logits(doc)
    assert code == 0 and logits["passed"]
    assert (logits["atol"], logits["rtol"]) == (0.02, 0.0)
    assert logits["tolerance_source"] == source


@pytest.mark.parametrize(
    "section",
    [
        {"tensors": {"logits": {"atol": 0.02, "rtol": 0}}},
        {"outputs": {"logits": {"atol": 0.02, "rtol": 0}}},
        {"op_types": {"Gemm": {"atol": 0.02, "rtol": 0}}},
        {"default": {"atol": 0.02, "rtol": 0}},
        {"paths": {"fp32": {"atol": 0.02, "rtol": 0}}},
    ],
)
def test_tolerance_file(off_by_a_bit, capsys, tmp_path, section):
    path = tmp_path / "tol.json"
    path.write_text(json.dumps(section))
    argv = ["validate", SMALL_CNN, "--tolerance-file", path, "--auto-cast", "none"]
    code, doc = run_json(argv, capsys)
    logits = _logits(doc)
    assert code == 0 and (logits["atol"], logits["rtol"]) == (0.02, 0.0)
    assert "tol.json" in logits["tolerance_source"]


def test_a_tensor_rule_beats_an_op_rule_and_the_command_line_beats_the_file(
    off_by_a_bit, capsys, tmp_path
):
    path = tmp_path / "tol.json"
    path.write_text(
        json.dumps(
            {"tensors": {"logits": {"atol": 1.0}}, "op_types": {"Gemm": {"atol": 2.0, "rtol": 0.5}}}
        )
    )
    code, doc = run_json(
        [
            "validate",
            SMALL_CNN,
            "--tolerance-file",
            path,
            "--tolerance",
            "logits=1e-6,",
            "--op-tolerance",
            "Gemm=3,",
        ],
        capsys,
    )
    logits = _logits(doc)
    # atol: --tolerance (1e-6) beats the file's tensor entry and both op rules; rtol: only the
    # file's op rule gives one.
    assert (logits["atol"], logits["rtol"]) == (1e-6, 0.5)
    assert logits["tolerance_source"] == (
        "atol from --tolerance logits; rtol from tol.json op_types.Gemm"
    )
    assert code == 1


def test_partial_override_keeps_the_default_for_the_other_number(off_by_a_bit, capsys):
    argv = ["validate", SMALL_CNN, "--tolerance", "logits=,0.9", "--auto-cast", "none"]
    code, doc = run_json(argv, capsys)
    logits = _logits(doc)
    assert (logits["atol"], logits["rtol"]) == (FP32_ATOL, 0.9)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--tolerance", "logits=abc,1"], "not a number"),
        (["--tolerance", "logits=1e-3"], "NAME=ATOL,RTOL"),
        (["--op-tolerance", "Conv=-1,0"], ">= 0"),
        (["--tolerance-file", "/no/such/tol.json"], "no such tolerance file"),
    ],
)
def test_bad_tolerance_is_one_line_and_exit_2(capsys, flags, fragment):
    code, _, err = run(["validate", SMALL_CNN, *flags], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0]


def test_bad_tolerance_file_keys(capsys, tmp_path):
    path = tmp_path / "tol.json"
    path.write_text(json.dumps({"tensor": {"logits": {"atol": 1}}}))
    code, _, err = run(["validate", SMALL_CNN, "--tolerance-file", path], capsys)
    assert code == 2 and "unknown: tensor" in err


# --- the smallest passing tolerance -------------------------------------------------------
def _smallest(passes, high: float) -> float:
    """Bisection on a monotone predicate, independent of onnx2bir's formula."""
    low = 0.0
    if passes(low):
        return 0.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (low, mid) if passes(mid) else (mid, high)
    return high


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_minimal_passing_tolerance_matches_an_independent_bisection(seed):
    rng = np.random.default_rng(seed)
    reference = rng.standard_normal((64, 33)).astype(np.float32)
    actual = (reference + rng.normal(0, 1e-3, reference.shape)).astype(np.float32)
    atol, rtol = 1e-4, 1e-3
    result = compare_output("t", actual, reference, atol, rtol)
    a, r = actual.astype(np.float64), reference.astype(np.float64)
    want_atol = _smallest(lambda x: np.all(np.isclose(a, r, rtol=rtol, atol=x)), 1.0)
    want_rtol = _smallest(lambda x: np.all(np.isclose(a, r, rtol=x, atol=atol)), 1e6)
    assert result.min_atol == pytest.approx(want_atol, rel=1e-9)
    assert result.min_rtol == pytest.approx(want_rtol, rel=1e-9)
    assert compare_output("t", actual, reference, result.min_atol, rtol).passed
    assert compare_output("t", actual, reference, atol, result.min_rtol).passed
    assert not compare_output("t", actual, reference, result.min_atol * 0.999, rtol).passed
    assert not compare_output("t", actual, reference, atol, result.min_rtol * 0.999).passed


def test_minimal_rtol_is_inf_where_the_reference_is_zero():
    result = compare_output("t", np.array([0.5, 1.0]), np.array([0.0, 1.0]), 1e-4, 1e-3)
    assert result.min_rtol == math.inf and result.min_atol == pytest.approx(0.5)


def test_reported_minimum_rethresholds_a_failing_run(off_by_a_bit, capsys):
    _, doc = run_json(["validate", SMALL_CNN], capsys)
    minimum = _logits(doc)["min_atol"]
    assert minimum == pytest.approx(OFFSET, rel=0.05)
    code, _ = run_json(["validate", SMALL_CNN, "--atol", repr(minimum)], capsys)
    assert code == 0
    code, _ = run_json(["validate", SMALL_CNN, "--atol", repr(minimum * 0.99)], capsys)
    assert code == 1


# --- defaults by path ----------------------------------------------------------------------
def test_low_precision_bound_grows_with_the_reduction_length():
    small = low_precision_tolerance("bf16", 100, term_rms=0.05)
    large = low_precision_tolerance("bf16", 400, term_rms=0.05)
    assert large.atol == pytest.approx(2 * small.atol)  # √K
    assert small.atol == pytest.approx(6 * 2**-8 * math.sqrt(2 / 3) * 10 * 0.05)
    assert small.rtol == 2**-6 and low_precision_tolerance("fp16", 1).rtol == 1e-3
    reference = np.full(1000, 3.0)  # rms 3: √K·ρ is measured as rms(reference)
    estimated = low_precision_tolerance("bf16", 576, reference=reference)
    assert estimated.atol == pytest.approx(6 * 2**-8 * math.sqrt(2 / 3) * 3.0)


def _bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def test_bf16_bound_passes_storage_rounding_and_fails_bf16_accumulation():
    rng = np.random.default_rng(0)
    k = 576
    x = np.maximum(rng.standard_normal((128, k)), 0).astype(np.float32)
    w = (rng.standard_normal((k, 32)) * math.sqrt(2 / k)).astype(np.float32)
    reference = x.astype(np.float64) @ w.astype(np.float64)
    stored = _bf16(_bf16(x) @ _bf16(w))  # bf16 operands and result, fp32 accumulation
    accumulated = np.zeros(reference.shape, np.float32)
    for i in range(k):  # the bug: a bf16 running sum
        accumulated = _bf16(accumulated + np.outer(_bf16(x[:, i]), _bf16(w[i])))
    tol = low_precision_tolerance("bf16", k, reference=reference)
    assert compare_output("y", stored, reference, tol.atol, tol.rtol).passed
    assert not compare_output("y", accumulated, reference, tol.atol, tol.rtol).passed


def test_a_models_own_fp16_taints_downstream_and_integers_are_exact():
    """onnxruntime computes a model's own fp16 ops its own way: those tensors and what they
    feed get the statistical bound; an fp32 branch that never meets them keeps the fp32 one."""
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT),
        helper.make_node("ArgMax", ["y"], ["i"], axis=1),
        helper.make_node("Relu", ["x"], ["z"]),
    ]
    proto = model(
        nodes,
        {"x": (F32, [2, 5])},
        {"y": (F32, [2, 5]), "i": (TensorProto.INT64, [2, 1]), "z": (F32, [2, 5])},
    )
    graph = import_graph(proto)
    found = taints(graph, CastPlan(), set())
    assert found["h"].path == found["r"].path == "fp16"
    assert found["y"].path == "fp16"  # fp32 storage, but fp16 error upstream
    assert "i" not in found and "z" not in found
    policy = TolerancePolicy()
    assert bound_for(policy, graph, "i", np.zeros((2, 1)), None)[1] == "exact"
    tol, kind = bound_for(policy, graph, "y", np.ones((2, 5)), found["y"])
    assert kind == "statistical" and tol.rtol == 1e-3
    assert bound_for(policy, graph, "z", np.ones((2, 5)), None)[0] == (
        Tolerance(FP32_ATOL, FP32_RTOL, "fp32 path default")
    )


def test_policy_layers_resolve_atol_and_rtol_independently():
    policy = TolerancePolicy(
        atol=0.5,
        file_default=Partial(0.7, 0.07, "file default"),
        op_types={"Conv": Partial(None, 0.2, "--op-tolerance Conv")},
    )
    tol = policy.for_tensor("t", "Conv", "fp32")
    assert (tol.atol, tol.rtol) == (0.5, 0.2)
    assert tol.source == "atol from --atol/--rtol; rtol from --op-tolerance Conv"
    tol = policy.for_tensor("t", "Relu", "fp32")
    assert (tol.atol, tol.rtol) == (0.5, 0.07)


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("bij,bjk->bik", [(2, 3, 5), (2, 5, 7)]),
        ("ij,jk", [(3, 5), (5, 7)]),  # implicit output: the letters named once
        ("...ij,...jk->...ik", [(4, 2, 3, 5), (4, 2, 5, 7)]),
        ("bhqd,bhkd->bhqk", [(1, 2, 8, 16), (1, 2, 8, 16)]),
        ("i,i", [(6,), (6,)]),
        ("bid,bjd->bij", [(2, 3, 4), (2, 5, 4)]),
    ],
)
def test_an_einsums_terms_are_what_numpy_sums_over_ones(equation, shapes):
    """Summing ones, each output element of the einsum counts its products."""
    ones = [np.ones(shape) for shape in shapes]
    counted = np.einsum(equation, *ones)
    assert np.all(counted == einsum_terms(equation, shapes))
