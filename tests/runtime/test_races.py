"""The race detector and the schedules on compiled models."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.compiler import compile_model
from onnx2bir.errors import UserError
from onnx2bir.runtime.machine.program import unroll
from onnx2bir.runtime.machine.schedule import order, parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import synthesize_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from race_helpers import detect, necessary_edges, without  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MUTATION_MODELS = ("small_cnn", "mha", "gpt2", "t5_encoder")
PER_MODEL = 15  # 60 edges in all


def _function(name: str):
    return compile_model(ROOT / "models" / f"{name}.onnx").module.functions[0]


@pytest.mark.parametrize("name", MUTATION_MODELS)
def test_deleting_a_needed_edge_makes_the_detector_report_that_pair(name):
    fn = _function(name)
    assert not detect(fn).races
    needed = necessary_edges(fn)
    rng = random.Random(name)
    sample = rng.sample(needed, min(PER_MODEL, len(needed)))
    # loop-carried edges are in the sample when the model has any
    carried = [edge for edge in needed if edge[1].carried_by]
    if carried and not any(dep.carried_by for _, dep in sample):
        sample[-1] = carried[0]
    assert len(sample) == PER_MODEL
    for target, dep in sample:
        restore = without(fn, target, dep)
        try:
            races = detect(fn).races
        finally:
            restore()
        pairs = {race.pair for race in races}
        assert (dep.source, target) in pairs or (target, dep.source) in pairs, (target, dep)
        race = next(r for r in races if {r.first.id, r.second.id} == {dep.source, target})
        assert race.first.stream != race.second.stream
        assert "write" in (race.first.access, race.second.access)


def test_a_program_without_edges_races_and_the_report_names_both_sides():
    fn = _function("small_cnn")
    for inst in fn.instructions():
        inst.deps = []
    races = detect(fn).races
    assert races
    race = races[0]
    message = race.message()
    for side in (race.first, race.second):
        assert f"instruction {side.id} {side.opcode} on {side.stream}" in message
        assert side.node in message and side.rule in message
    low, high = race.byte_range
    assert 0 <= low <= high
    assert f"bytes [{low}, {high}]" in message


def _feeds(name: str):
    compilation = compile_model(ROOT / "models" / f"{name}.onnx")
    return compilation.module, synthesize_inputs(compilation.graph, 0)


@pytest.mark.parametrize("name", ["small_cnn", "mha"])
def test_every_schedule_gives_bit_identical_outputs(name):
    module, feeds = _feeds(name)
    reference = run_scheduled(module, feeds, parse_schedule("program"), True)
    assert reference.races == []
    for spec in ("random:1", "random:2", "timeline"):
        other = run_scheduled(module, feeds, parse_schedule(spec), True)
        assert other.races == []
        for key, value in reference.outputs.items():
            assert np.array_equal(value, other.outputs[key], equal_nan=True), (spec, key)


def test_random_schedules_are_real_interleavings_that_keep_every_constraint():
    program = unroll(_function("mha"))
    position = {}
    orders = {}
    for spec in ("random:1", "random:2", "timeline"):
        sequence = order(program, parse_schedule(spec))
        assert sorted(sequence) == list(range(len(program)))
        position = {index: k for k, index in enumerate(sequence)}
        for index, preds in enumerate(program.preds):
            assert all(position[p] < position[index] for p in preds)
        orders[spec] = sequence
    assert orders["random:1"] != list(range(len(program)))
    assert orders["random:1"] != orders["random:2"]
    assert order(program, parse_schedule("random:1")) == orders["random:1"]  # seeded


def test_schedule_spelling():
    assert str(parse_schedule("random:7")) == "random:7"
    for bad in ("random", "random:x", "random:-1", "fifo"):
        with pytest.raises(UserError, match="program | random:SEED | timeline"):
            parse_schedule(bad)
