"""Per-instruction predicates on edge tiles and the loop mode the finalizer stamps
(docs/predicates.md), against onnxruntime where numbers are involved."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, one_node_model

from onnx2bir.bir.enums import Dtype, Engine, LoopMode, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    Function,
    Instruction,
    Loop,
    MemoryLocation,
    Module,
    Origin,
    Predicate,
)
from onnx2bir.bir.json_io import module_from_json, module_to_json
from onnx2bir.bir.verify import verify_module
from onnx2bir.compiler import compile_model
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine.interpreter import run_function

SCHEMA = json.loads((Path(__file__).parents[2] / "onnx2bir" / "bir" / "schema.json").read_text())


@pytest.mark.parametrize("rows", [129, 300, 383])
def test_edge_row_tile_runs_in_the_loop_under_a_predicate(rows):
    model = one_node_model("Add", {"a": (rows, 7), "b": (7,)})
    module = compile_model(model).module
    instructions = [i for i in module.functions[0].instructions() if i.origin.node == "Add_0"]
    # b is the same for every row: it is loaded once, before the row loop.
    (hoisted,) = [i for i in instructions if i.predicate is None]
    assert hoisted.opcode is Opcode.DMA_COPY and hoisted.srcs["in"].loc == "b"
    assert hoisted.loopnest == instructions[0].loopnest[:1]  # in the node's scope, no loop
    # One loop body, no separate edge code: the load of a, the add, the store; with more than
    # two row tiles, once for each of the two buffer copies (docs/buffers.md#rotation), the
    # loop running groups of 2 tiles, padded to whole groups.
    node = [i for i in instructions if i.predicate is not None]
    trips = -(-rows // 128)
    groups = -(-trips // 2)
    body = [Opcode.DMA_COPY, Opcode.TENSOR_TENSOR, Opcode.DMA_COPY]
    assert [i.opcode for i in node] == body * (1 if trips == 2 else 2)
    # Every trip's bound is the rows left from its first row: 128 or more runs the whole tile,
    # the edge tile gets its remainder, the padding trips get <= 0 and skip.
    bounds = []
    for instruction in node[:: len(body)]:
        ((axis, coef),) = instruction.predicate.terms
        assert coef == (-128 if trips == 2 else -256)
        count = 2 if trips == 2 else groups
        bounds += [instruction.predicate.bound({axis: value}) for value in range(count)]
    expected = [rows - 128 * t for t in range(2 * groups if trips > 2 else 2)]
    assert sorted(bounds, reverse=True) == expected
    if trips == 2:  # a copy per trip: no hazard between the trips, the loop is Affine
        assert all(i.loop_mode is LoopMode.AFFINE for i in node)
    else:  # the second tile of a group needs nothing of the first
        first = {i.id for i in node[: len(body)]}
        assert not any(dep.source in first for i in node[len(body) :] for dep in i.deps)
    assert_matches_onnxruntime(model)


def test_whole_tiles_need_no_predicate():
    module = compile_model(one_node_model("Relu", {"x": (256, 5)})).module
    assert all(i.predicate is None for i in module.functions[0].instructions())


def test_predicates_and_loop_modes_survive_json_and_follow_the_schema():
    module = compile_model(one_node_model("Add", {"a": (300, 7), "b": (7,)})).module
    doc = module_to_json(module)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    again = module_from_json(doc, module.constants)
    assert module_to_json(again) == doc
    before = [(i.predicate, i.loop_mode) for i in module.functions[0].instructions()]
    assert before == [(i.predicate, i.loop_mode) for i in again.functions[0].instructions()]


def _copy_rows_module(rows: int, bound_const: int):
    """Copy `rows` rows of a DRAM tensor through SBUF in 128-row tiles, edge by predicate."""
    x = MemoryLocation("x", MemoryType.DRAM, MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (rows, 4))
    y = MemoryLocation("y", MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32, (rows, 4))
    t = MemoryLocation("t", MemoryType.SB, MemoryKind.INTERNAL, Dtype.FP32, (128, 4), 128, 0, 16)
    pred = Predicate(bound_const, (("r", -128),))
    tile = AccessPattern("t", ((1, 4),), 0, (), 0, 128)

    def dram(name):
        return AccessPattern(name, ((4, 128), (1, 4)), 0, (("r", 512),))

    body = [
        Instruction(
            Opcode.DMA_COPY,
            Engine.DMA,
            tile,
            {"in": dram("x")},
            {"queue": 0},
            Origin("n", "t"),
            0,
            ("r",),
            predicate=pred,
        ),
        Instruction(
            Opcode.DMA_COPY,
            Engine.DMA,
            dram("y"),
            {"in": tile},
            {"queue": 0},
            Origin("n", "t"),
            1,
            ("r",),
            predicate=pred,
        ),
    ]
    trips = -(-rows // 128)
    fn = Function("main", {m.name: m for m in (x, y, t)}, ["x"], ["y"])
    fn.entry.items = [Loop("r", 0, trips, body=BasicBlock("block0", body))]
    return Module("m", [fn])


def test_machine_and_verifier_honour_the_predicate():
    rows = 200
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    good = _copy_rows_module(rows, rows)
    assert not verify_module(good)
    np.testing.assert_array_equal(run_function(good, {"x": x})["y"], x)
    # A bound one row too loose: the last trip (r = 1) copies 73 rows from element 512,
    # reaching element 512 + 72·4 + 3 = 803 of 800.
    loose = _copy_rows_module(rows, rows + 1)
    problems = verify_module(loose)
    assert any("touches elements [512, 803] outside [0, 800)" in p for p in problems), problems
    with pytest.raises(MachineError, match="outside location"):
        run_function(loose, {"x": x})


def test_loop_modes_follow_the_loops():
    module = _copy_rows_module(256, 256)
    loop = module.functions[0].entry.items[0]
    from onnx2bir.codegen.driver import stamp_loop_modes

    stamp_loop_modes(module.functions[0].entry)
    assert {i.loop_mode for i in loop.body.items} == {LoopMode.SEQUENTIAL}
    loop.parallel = True
    stamp_loop_modes(module.functions[0].entry)
    assert {i.loop_mode for i in loop.body.items} == {LoopMode.AFFINE}
