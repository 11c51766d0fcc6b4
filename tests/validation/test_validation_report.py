"""What people and tools read: the terminal summary, the JSON document, the statistics, and
the progress bar."""

from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import make_model
from onnx import helper
from validation_helpers import SMALL_CNN, run, run_json

from onnx2bir.compiler import compile_model
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.progress import ProgressBar, dynamic_instruction_count, progress_for
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import synthesize_inputs
from onnx2bir.validation.text import format_output


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


def test_relative_error_leaves_out_exact_zero_references():
    """|m - o| / 0 is inf whatever m is: the relative figures are over the nonzero references
    (counted apart), while the absolute error and the verdict still see every element."""
    reference = np.array([0.0, 0.0, 2.0, 4.0, 0.0], np.float32)
    actual = np.array([1e-6, 0.0, 2.002, 4.0, 9.9e-5], np.float32)
    result = compare_output("t", actual, reference, 1e-4, 1e-3)
    assert result.passed and result.zero_references == 3 and result.finite_pairs == 5
    assert np.isfinite(result.max_rel_err) and result.max_rel_err == pytest.approx(1e-3, rel=1e-3)
    assert all(np.isfinite(v) for v in result.rel_err.values())
    assert result.rel_err["mean"] == pytest.approx(5e-4, rel=1e-3)  # over the 2 nonzero
    assert result.abs_err["max"] == pytest.approx(2e-3, rel=1e-3)
    # The element nearest its bound has a zero reference (9.9e-5 of an atol of 1e-4).
    assert result.worst["index"] == [4] and result.worst["rel_err"] is None
    assert not compare_output("t", actual * 10, reference, 1e-4, 1e-3).passed
    # With NaN pairs too, and with no nonzero reference at all.
    with_nan = compare_output("t", np.append(actual, np.nan), np.append(reference, np.nan))
    assert with_nan.zero_references == 3 and np.isfinite(with_nan.max_rel_err)
    zeros = compare_output("t", np.full(3, 1e-6, np.float32), np.zeros(3, np.float32))
    assert zeros.zero_references == 3 and zeros.max_rel_err == 0.0 and zeros.passed
    assert compare_output("t", actual, reference).to_json()["zero_references"] == 3


def _entry(actual, reference, atol=1e-4, rtol=1e-3, **extra) -> dict:
    return {**compare_output("t", actual, reference, atol, rtol, "given").to_json(), **extra}


def test_the_error_table_says_how_many_zero_references_it_left_out():
    reference = np.array([0.0, 0.0, 2.0, 4.0], np.float32)
    lines = format_output(_entry(np.array([1e-6, 0, 2.002, 4], np.float32), reference))
    text = "\n".join(lines)
    assert "/ |o| over the 2 nonzero references: 2 exact zeros left out" in text
    rows = {line.split()[0]: line.split() for line in lines[2:7] if line.split()}
    assert all(np.isfinite(float(rows[key][2])) for key in ("max", "mean", "median", "p99"))
    # All zeros: no relative figure at all.
    zeros = format_output(_entry(np.full(2, 1e-6, np.float32), np.zeros(2, np.float32)))
    (row,) = [line.split() for line in zeros if line.split()[:1] == ["max"]]
    assert row[2] == "-"


def test_relu_zeros_give_a_finite_relative_error_end_to_end(tmp_path, capsys):
    proto = make_model(helper.make_node("Relu", ["x"], ["y"]), {"x": (4, 16)}, {"y": (4, 16)})
    path = tmp_path / "relu.onnx"
    onnx.save(proto, path)
    code, doc = run_json(["validate", path], capsys)
    (y,) = doc["outputs"]
    assert code == 0 and y["zero_references"] > 0 and y["max_rel_err"] is not None
    assert all(value is not None for value in y["rel_err"].values())
    code, out, _ = run(["validate", path], capsys)
    assert code == 0 and f"{y['zero_references']} exact zeros left out" in out


def test_a_failure_never_offers_a_wider_bound_as_a_fix():
    reference = np.array([1.0, 2.0, 3.0], np.float32)
    failing = _entry(np.array([1.0, 2.5, 3.0], np.float32), reference)
    text = "\n".join(format_output(failing))
    assert "FAIL (1 of 3)" in text and "would pass" not in text and "margin:" not in text
    assert "smallest bound holding this error: atol 0.498" in text
    assert "a wider bound would hide the error, not fix it" in text
    # Failed by something else than its own elements (--max-drift): no bound line at all.
    gated = _entry(reference, reference, passed=False, drift_failures=["cosine 0.9 < 0.99"])
    text = "\n".join(format_output(gated))
    assert "FAIL (--max-drift)" in text and "would pass" not in text
    assert "smallest bound" not in text


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
