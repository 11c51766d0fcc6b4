"""estimate_instances against the number of instructions the machine actually executes.

The executed count comes from the interpreter's observer (one call per executed instruction),
independent of the estimate's walk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onnx2bir.codegen.instances import estimate_instances
from onnx2bir.compiler import compile_model
from onnx2bir.reporting.document import build_report, format_report
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import synthesize_inputs

MODELS = Path(__file__).parents[2] / "models"


def executed(compilation, feeds) -> int:
    count = 0

    def observer(ins, loop_values) -> None:
        nonlocal count
        count += 1

    run_function(compilation.module, feeds, observer=observer)
    return count


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "loop_cumsum", "loop_while"])
def test_dynamic_count_matches_or_bounds_the_executed_count(name):
    compilation = compile_model(MODELS / f"{name}.onnx")
    estimate = estimate_instances(compilation.module.functions[0])
    feeds = synthesize_inputs(compilation.graph, 0)
    ran = executed(compilation, feeds)
    assert estimate.static == sum(1 for _ in compilation.module.functions[0].instructions())
    if estimate.exact:
        assert estimate.dynamic == ran
    else:
        assert estimate.runtime_loops == 1 and estimate.dynamic <= ran
    assert sum(estimate.dynamic_per_engine.values()) == estimate.dynamic


def test_static_loops_multiply_their_bodies():
    """A constant trip count: the body's instructions count once per trip."""
    from test_loop import cumsum_model, x_feed  # the same models the Loop tests validate

    compilation = compile_model(cumsum_model(6))
    estimate = estimate_instances(compilation.module.functions[0])
    assert estimate.exact and estimate.dynamic > estimate.static
    assert estimate.dynamic == executed(compilation, {"x": x_feed()})


def test_report_prints_dynamic_instances():
    compilation = compile_model(MODELS / "loop_while.onnx")
    doc = build_report("loop_while", compilation)
    inst = doc["instructions"]
    assert inst["dynamic_exact"] is False
    assert inst["dynamic_instances"] == estimate_instances(compilation.module.functions[0]).dynamic
    text = format_report(doc)
    assert f"dynamic instances (loop trips expanded): at least {inst['dynamic_instances']}" in text
    doc = build_report("resnet18", compile_model(MODELS / "resnet18.onnx"))
    assert doc["instructions"]["dynamic_exact"] is True
    assert f"expanded): {doc['instructions']['dynamic_instances']} (" in format_report(doc)
    assert doc["instructions"]["total"] <= doc["instructions"]["dynamic_instances"]
