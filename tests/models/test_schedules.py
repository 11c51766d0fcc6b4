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
from onnx2bir.runtime.oracle import synthesize_inputs
from onnx2bir.runtime.schedule import parse_schedule, run_scheduled

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))

from light import LIGHT_MODELS, light_model_path  # noqa: E402

# ONNX Loop models lower to loops whose trip count is known only at run time; the unrolled
# schedules refuse them (test below).
RUNTIME_LOOP_MODELS = ["loop_cumsum", "loop_while"]
MODELS = sorted(
    path.stem
    for path in (ROOT / "models").glob("*.onnx")
    if path.stem not in RUNTIME_LOOP_MODELS
)
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
def test_runtime_trip_loops_are_refused_by_the_unrolled_schedules(name):
    compilation = compile_model(ROOT / "models" / f"{name}.onnx")
    feeds = synthesize_inputs(compilation.graph, 0)
    with pytest.raises(UserError, match="static trip counts"):
        run_scheduled(compilation.module, feeds, parse_schedule("random:1"), check_races=True)
