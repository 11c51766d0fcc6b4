"""What people and tools read: the terminal summary, the JSON document, the statistics, and
the progress bar."""

from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest
from validation_helpers import SMALL_CNN, run, run_json

from onnx2bir.compiler import compile_model
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.progress import ProgressBar, dynamic_instruction_count, progress_for
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import synthesize_inputs


def test_terminal_summary_puts_the_verdict_first(capsys):
    code, out, _ = run(["validate", SMALL_CNN], capsys)
    lines = out.splitlines()
    assert (
        code == 0 and lines[0].startswith("PASS  ") and "1/1 outputs match onnxruntime" in lines[0]
    )
    assert any(line.split()[:3] == ["input", "input", "float32[1,"] for line in lines)
    for row in ("max", "mean", "median", "p99"):
        assert any(line.split()[:1] == [row] for line in lines), row
    assert "closest to its tolerance: element" in out and "cosine" in out
    # A pass states its margin, not a "would pass" condition it already meets.
    assert "margin: it would still pass down to atol" in out and "would pass with" not in out


def test_json_keeps_the_contract_and_adds_statistics(capsys):
    code, doc = run_json(["validate", SMALL_CNN], capsys)
    assert code == 0 and doc["passed"] is True and doc["model"] == str(SMALL_CNN)
    (logits,) = doc["outputs"]
    assert {
        "name",
        "shape",
        "max_abs_err",
        "max_rel_err",
        "cosine",
        "atol",
        "rtol",
        "passed",
    } <= set(logits)
    assert {"max", "mean", "median", "p99"} == set(logits["abs_err"]) == set(logits["rel_err"])
    assert {"index", "machine", "onnxruntime"} <= set(logits["worst"])
    assert {"min_atol", "min_rtol", "nonfinite", "mismatches", "tolerance_source"} <= set(logits)
    assert logits["abs_err"]["max"] == logits["max_abs_err"]
    assert doc["oracle"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
    assert doc["inputs"] == [
        {"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32", "source": "standard normal"}
    ]
    assert {"import", "passes", "codegen", "simulate", "onnxruntime"} <= set(doc["timings"])


def test_statistics_of_one_comparison():
    reference = np.array([[1.0, 2.0, 0.0], [4.0, np.nan, np.inf]], np.float32)
    actual = np.array([[1.0, 2.5, 0.0], [4.0, np.nan, 7.0]], np.float32)
    result = compare_output("t", actual, reference, 1e-4, 1e-3)
    assert not result.passed and result.mismatches == 2  # 2.5 vs 2, and 7 vs inf
    assert result.nonfinite["onnxruntime"] == {
        "nan": 1,
        "posinf": 1,
        "neginf": 0,
        "first": [[1, 1], [1, 2]],
    }
    assert result.nonfinite["machine"]["first"] == [[1, 1]]
    assert result.nonfinite_mismatches == 1 and result.finite_pairs == 4
    assert result.worst == {
        "index": [0, 1],
        "machine": 2.5,
        "onnxruntime": 2.0,
        "abs_err": 0.5,
        "rel_err": 0.25,
    }
    assert result.abs_err["max"] == 0.5 and result.abs_err["mean"] == pytest.approx(0.125)
    finite = compare_output("t", actual[0], reference[0], 1e-4, 1e-3)
    assert finite.abs_err == {"max": 0.5, "mean": pytest.approx(0.5 / 3), "median": 0.0, "p99": 0.5}
    assert finite.max_ulp > 0 and finite.min_atol == pytest.approx(0.5 - 2e-3)
    shape = compare_output("t", np.zeros(3), np.zeros(4))
    assert not shape.passed and "shape" in shape.shape_error


def test_ulp_distance_counts_representable_values_between():
    """max_ulp is how many floats of the reference's format lie between the two values:
    three steps up from 1, across zero from the smallest negative to the smallest positive
    subnormal (two steps, -0 and +0 being one value), and not over the non-finite pairs."""
    up = np.float32(1.0)
    for _ in range(3):
        up = np.nextafter(up, np.float32(2))
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    assert compare_output("t", np.array([up]), np.array([1.0], np.float32)).max_ulp == 3
    assert compare_output("t", np.array([tiny]), np.array([-tiny])).max_ulp == 2
    assert compare_output("t", np.array([-0.0], np.float32), np.zeros(1, np.float32)).max_ulp == 0
    half = np.array([1.0, 1.0078125], ml_dtypes.bfloat16)  # neighbours in bfloat16
    assert compare_output("t", half[::-1], half).max_ulp == 1
    nan = np.float32(np.nan)
    masked = compare_output("t", np.array([nan, up]), np.array([nan, 1.0], np.float32))
    assert masked.max_ulp == 3


def test_progress_counts_every_executed_instruction():
    compilation = compile_model(SMALL_CNN)
    function = compilation.module.functions[0]
    stream = io.StringIO()
    bar = ProgressBar(function, stream, delay=0.0, interval=0.0)
    run_function(compilation.module, synthesize_inputs(compilation.graph), observer=bar.observer)
    assert bar.count == bar.total == dynamic_instruction_count(function.entry)
    bar.draw()
    assert "100.0%" in stream.getvalue() and f"{bar.total}/{bar.total}" in stream.getvalue()
    bar.close()
    assert stream.getvalue().endswith("\r\033[K")


def test_no_progress_bar_unless_stderr_is_a_terminal(capsys):
    function = compile_model(SMALL_CNN).module.functions[0]
    assert progress_for(function, enabled=True) is None  # pytest captures stderr
    code, _, err = run(["validate", SMALL_CNN], capsys)
    assert code == 0 and err == ""


def test_progress_gives_no_time_left_from_the_first_few_instructions():
    function = compile_model(SMALL_CNN).module.functions[0]
    stream = io.StringIO()
    bar = ProgressBar(function, stream, delay=0.0, interval=0.0)
    bar.count = 1  # far below 5% of the run: an estimate from here would be noise
    bar.draw(bar.start + 10.0)
    assert "estimating time left" in stream.getvalue() and "s left" not in stream.getvalue()
    bar.count = bar.total // 2  # half done after 10 s: about 10 s left
    bar.draw(bar.start + 10.0)
    assert "~10s left" in stream.getvalue().split("\r")[-1]
