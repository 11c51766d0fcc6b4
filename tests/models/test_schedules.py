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
from onnx2bir.runtime.oracle import synthesize_inputs
from onnx2bir.runtime.schedule import parse_schedule, run_scheduled

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))

from light import light_model_path  # noqa: E402

MODELS = sorted(path.stem for path in (ROOT / "models").glob("*.onnx"))
LIGHT = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]


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
