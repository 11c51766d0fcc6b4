"""Every model is race-free and computes bit-identical outputs under random schedules.

Slow: each model runs three times (program order, then `random:1` and `random:2` with the
race detector on), and the light models are large.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.compiler import compile_model
from onnx2bir.errors import UserError
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import synthesize_inputs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))

from light import LIGHT_MODELS, light_model_path  # noqa: E402

MODELS = sorted(path.stem for path in (ROOT / "models").glob("*.onnx"))
# ONNX Loop models lower to loops whose trip count is known only at run time: the unrolled
# schedules take their trip counts from a run in program order (runtime/machine/schedule.py).
RUNTIME_LOOP_MODELS = ["loop_cumsum", "loop_while"]
LIGHT = sorted(LIGHT_MODELS.values())


def _check(path: Path) -> None:
    compilation = compile_model(path)
    feeds = synthesize_inputs(compilation.graph, 0)
    module = compilation.module
    reference = run_scheduled(module, feeds, parse_schedule("program"), check_races=False)
    for spec in ("random:1", "random:2"):
        run = run_scheduled(module, feeds, parse_schedule(spec), check_races=True)
        assert run.races == [], [race.message() for race in run.races[:5]]
        for name, value in reference.outputs.items():
            assert np.array_equal(value, run.outputs[name], equal_nan=True), (spec, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_is_race_free_and_schedule_independent(name):
    _check(ROOT / "models" / f"{name}.onnx")


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT)
def test_light_model_is_race_free_and_schedule_independent(name):
    _check(light_model_path(name))


@pytest.mark.parametrize("name", RUNTIME_LOOP_MODELS)
def test_runtime_trip_loops_run_under_random_schedules_race_free(name):
    """In the default suite: the two ONNX Loop models (a DynamicFor and a DoWhile)."""
    _check(ROOT / "models" / f"{name}.onnx")


def test_a_runtime_loop_without_recorded_trips_is_refused():
    from onnx2bir.runtime.machine.program import unroll

    compilation = compile_model(ROOT / "models" / "loop_while.onnx")
    with pytest.raises(UserError, match="no recorded run"):
        unroll(compilation.module.functions[0])


@pytest.mark.parametrize("name", RUNTIME_LOOP_MODELS)
def test_a_runtime_loop_without_its_edges_races(name):
    """The edges are what orders the streams inside a runtime loop: stripped, the detector
    reports races (the loop-carried ones come from the two-trip view of the analysis)."""
    compilation = compile_model(ROOT / "models" / f"{name}.onnx")
    module = compilation.module
    carried = [
        dep for inst in module.functions[0].instructions() for dep in inst.deps if dep.carried_by
    ]
    assert carried, "a runtime loop that reuses its buffers needs loop-carried edges"
    for inst in module.functions[0].instructions():
        inst.deps = []
    feeds = synthesize_inputs(compilation.graph, 0)
    run = run_scheduled(module, feeds, parse_schedule("program"), check_races=True)
    assert run.races
