"""Probes read a tensor out of the machine where the program keeps it: an SBUF home read back
must equal the same tensor in DRAM when the memory planner is off (the plan moves tensors, not
arithmetic), and a home misread (rows dealt the wrong way) would not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.bir.enums import MemoryType
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine import interpreter
from onnx2bir.runtime.machine.probes import ProbeReader
from onnx2bir.runtime.oracle.ort import synthesize_inputs

MODELS = Path(__file__).resolve().parents[2] / "models"


def _probe(model: str, memory_plan: bool) -> tuple[dict, dict]:
    compilation = compile_model(MODELS / model, CompileOptions(memory_plan=memory_plan))
    graph, function = compilation.graph, compilation.module.functions[0]
    plan = compilation.cast_plan
    reader = ProbeReader(function, plan.probes, {t: graph.tensors[t].shape for t in plan.probes})
    feeds = synthesize_inputs(graph, 0)
    interpreter.run_function(compilation.module, feeds, before=reader.before())
    kinds = {t: function.memory_locations[p.location].memory for t, p in plan.probes.items()}
    return reader.values, kinds, reader.stored()


@pytest.mark.parametrize("model", ["resnet18.onnx", "bert.onnx", "unet.onnx"])
def test_a_tensor_read_from_its_sbuf_home_equals_it_in_dram(model):
    on_chip, kinds, _ = _probe(model, True)
    in_dram, _, stored = _probe(model, False)
    homes = [t for t, memory in kinds.items() if memory is MemoryType.SB]
    assert homes, "the planner kept none of the probed tensors on chip"
    assert set(on_chip) == set(in_dram)
    for tensor, value in on_chip.items():
        # A tensor only ever loaded into bf16 tiles is stored bf16 in DRAM
        # (codegen/weight_cast.py); its home keeps fp32, which rounds to the same values.
        narrow = stored[tensor].numpy
        np.testing.assert_array_equal(
            value.astype(narrow).astype(np.float32), in_dram[tensor], err_msg=tensor
        )


def test_a_home_read_with_the_wrong_row_length_is_not_the_tensor():
    """The layout matters: reading the same home with rows of another length gives other
    values, so the test above would catch a wrong layout."""
    compilation = compile_model(MODELS / "resnet18.onnx")
    graph, function = compilation.graph, compilation.module.functions[0]
    plan = compilation.cast_plan
    tensor, probe = next(
        (t, p) for t, p in plan.probes.items() if p.inner and p.inner > 1 and graph.tensors[t]
    )
    wrong = {tensor: dataclasses.replace(probe, inner=probe.inner // 2)}
    shapes = {tensor: graph.tensors[tensor].shape}
    right_reader = ProbeReader(function, {tensor: probe}, shapes)
    wrong_reader = ProbeReader(function, wrong, shapes)
    feeds = synthesize_inputs(graph, 0)
    hooks = {**right_reader.before()}
    both = {ins: _both(right_reader, wrong_reader) for ins in hooks}
    interpreter.run_function(compilation.module, feeds, before=both)
    assert not np.array_equal(right_reader.values[tensor], wrong_reader.values[tensor])


def _both(first: ProbeReader, second: ProbeReader):
    def hook(machine, ins, loop_values) -> None:
        first.before()[ins](machine, ins, loop_values)
        second.before()[ins](machine, ins, loop_values)

    return hook
