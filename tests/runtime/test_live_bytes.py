"""The live-bytes check: the machine refuses a write into bytes of another SBUF/PSUM location
between that location's first write and its last read (docs/buffers.md#live-bytes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.bir.enums import Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    Function,
    Instruction,
    Loop,
    MemoryLocation,
    Module,
    Origin,
)
from onnx2bir.compiler import compile_model
from onnx2bir.errors import MachineError
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import load_machine, run_function
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import synthesize_inputs

ROOT = Path(__file__).resolve().parents[2]
_ids = iter(range(10**6))

X = MemoryLocation("x", MemoryType.DRAM, MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (4, 8))
Y = MemoryLocation("y", MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32, (4, 1))
Z = MemoryLocation("z", MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32, (4, 1))
# Tile "a" owns bytes [0, 32) of partitions 0..3; tile "b" owns [16, 48): they share [16, 32).
A = MemoryLocation("a", MemoryType.SB, MemoryKind.INTERNAL, Dtype.FP32, (4, 8), 4, 0, 32)
B = MemoryLocation("b", MemoryType.SB, MemoryKind.INTERNAL, Dtype.FP32, (4, 8), 4, 16, 32)
R = MemoryLocation("r", MemoryType.SB, MemoryKind.INTERNAL, Dtype.FP32, (4, 1), 4, 64, 4)
FEED = {"x": np.arange(32, dtype=np.float32).reshape(4, 8)}


def ins(opcode, engine, dst, srcs=None, node="n", **attrs):
    return Instruction(opcode, engine, dst, srcs or {}, attrs, Origin(node, "t"), next(_ids))


def module(items) -> Module:
    fn = Function("main", {m.name: m for m in (X, Y, Z, A, B, R)}, ["x"], ["y", "z"])
    fn.entry.items = items
    return Module("m", [fn])


def tile(name: str, cols: int = 8, start: int = 0, terms=()) -> AccessPattern:
    return AccessPattern(name, ((1, cols),), start, terms, 0, 4)


def load(name: str, cols: int = 8, start: int = 0, node: str = "n") -> Instruction:
    src = AccessPattern("x", ((8, 4), (1, cols)))
    return ins(Opcode.DMA_COPY, Engine.DMA, tile(name, cols, start), {"in": src}, node, queue=0)


def reduce_and_store(name: str, out: str, node: str = "n") -> list[Instruction]:
    r = tile("r", 1)
    return [
        ins(Opcode.TENSOR_REDUCE, Engine.DVE, r, {"in": tile(name)}, node, op="max", axes=1),
        ins(
            Opcode.DMA_COPY,
            Engine.DMA,
            AccessPattern(out, ((1, 4), (1, 1))),
            {"in": r},
            node,
            queue=0,
        ),
    ]


def test_a_write_into_a_live_tile_is_refused_naming_both_tiles_and_the_instruction():
    write_b = load("b", node="second")
    items = [load("a", node="first"), write_b, *reduce_and_store("a", "y", "first")]
    items += reduce_and_store("b", "z", "second")
    with pytest.raises(MachineError) as info:
        run_function(module(items), FEED)
    message = str(info.value)
    assert f"instruction {write_b.id} DmaCopy" in message
    assert "node 'second'" in message  # the writing instruction's ONNX node
    assert "through 'b'" in message and "belong to 'a', which is still live" in message
    assert "bytes [16, 32)" in message  # exactly the shared bytes


def test_the_same_bytes_are_free_once_the_tile_is_read_for_the_last_time():
    items = [load("a"), *reduce_and_store("a", "y"), load("b"), *reduce_and_store("b", "z")]
    out = run_function(module(items), FEED)
    assert out["y"].ravel().tolist() == [7, 15, 23, 31]
    assert out["z"].ravel().tolist() == [7, 15, 23, 31]


def test_a_write_to_the_part_of_a_tile_no_live_tile_owns_is_allowed():
    # b's elements 4..7 are bytes [32, 48): a owns [0, 32), so this write does not touch it.
    late_half = load("b", cols=4, start=4)
    items = [load("a"), late_half, *reduce_and_store("a", "y")]
    run_function(module(items), FEED)


def _reduce_part(name: str, out: str, start: int) -> list[Instruction]:
    """Max of columns start..start+3 of a tile, stored to `out`."""
    r = tile("r", 1)
    part = AccessPattern(name, ((1, 4),), start, (), 0, 4)
    return [
        ins(Opcode.TENSOR_REDUCE, Engine.DVE, r, {"in": part}, op="max", axes=1),
        ins(Opcode.DMA_COPY, Engine.DMA, AccessPattern(out, ((1, 4), (1, 1))), {"in": r}, queue=0),
    ]


def test_bytes_only_a_finished_reader_read_are_free_while_another_reader_is_pending():
    # a's columns 4..7 are bytes [16, 32), which b's columns 0..3 share; its columns 0..3,
    # bytes [0, 16), b cannot reach. Once the reader of columns 4..7 is done, b may be
    # written there although a is still live for the reader of columns 0..3.
    items = [load("a"), *_reduce_part("a", "y", 4), load("b", cols=4), *_reduce_part("a", "z", 0)]
    out = run_function(module(items), FEED)
    assert out["y"].ravel().tolist() == [7, 15, 23, 31]
    assert out["z"].ravel().tolist() == [3, 11, 19, 27]
    # With the two readers the other way round, b's write lands in bytes still to be read.
    items = [load("a"), *_reduce_part("a", "z", 0), load("b", cols=4), *_reduce_part("a", "y", 4)]
    with pytest.raises(MachineError, match="belong to 'a', which is still live"):
        run_function(module(items), FEED)


def test_a_tile_read_in_every_trip_stays_live_until_the_last_trip():
    # a is loaded once and read in each of 3 trips; b, written in trip 0 after the read, would
    # clobber what trips 1 and 2 still read.
    loop = Loop("i", 0, 3, 1)
    loop.body.items = [*reduce_and_store("a", "y"), load("b")]
    with pytest.raises(MachineError, match="belong to 'a', which is still live"):
        run_function(module([load("a"), loop]), FEED)
    # The same write after the loop is fine.
    loop = Loop("i", 0, 3, 1)
    loop.body.items = reduce_and_store("a", "y")
    run_function(module([load("a"), loop, load("b"), *reduce_and_store("b", "z")]), FEED)


@pytest.mark.parametrize("schedule", ["program"])
def test_the_scheduled_runs_check_too(schedule):
    items = [load("a"), load("b"), *reduce_and_store("a", "y"), *reduce_and_store("b", "z")]
    for i, item in enumerate(items):
        item.id = i
    with pytest.raises(MachineError, match="still live"):
        run_scheduled(module(items), FEED, parse_schedule(schedule), check_races=False)


def _small_cnn():
    compiled = compile_model(ROOT / "models" / "small_cnn.onnx", CompileOptions(auto_cast="none"))
    return compiled, synthesize_inputs(compiled.graph, 0)


def test_a_compiled_model_shares_bytes_between_nodes_and_runs_clean():
    compiled, feeds = _small_cnn()
    fn = compiled.module.functions[0]
    machine = load_machine(compiled.module, fn, feeds)
    live = machine.live_bytes
    names = list(live.boxes)
    sharing = sum(
        live.boxes[a].meets(live.boxes[b]) for i, a in enumerate(names) for b in names[i + 1 :]
    )
    assert sharing > 0  # nodes' tiles do share bytes: the check has something to check
    run_function(compiled.module, feeds)


def test_moving_a_tile_onto_a_live_tile_of_its_node_is_refused():
    compiled, feeds = _small_cnn()
    fn = compiled.module.functions[0]
    # Two SBUF tiles of one conv node, both live at once: put the band on the weights.
    node = next(i.origin.node for i in fn.instructions() if i.origin.rule.startswith("kernel."))
    tiles = {
        name.split("/")[1].split("#")[0]: loc
        for name, loc in fn.memory_locations.items()
        if name.startswith(f"{node}/") and loc.memory is MemoryType.SB
    }
    weights, band = tiles["weights"], tiles["band"]
    fn.memory_locations[band.name] = dataclasses.replace(band, address=weights.address)
    with pytest.raises(MachineError) as info:
        run_function(compiled.module, feeds)
    message = str(info.value)
    # The moved band now covers the weights and the bias just after them; both are live. The
    # band's side columns are set before the weights load (docs/memory_planner.md#framed-bands),
    # so whichever of the two is written second is the one refused.
    others = (weights, tiles["bias"])
    assert (
        f"through {band.name!r}" in message
        and any(f"belong to {t.name!r}" in message for t in others)
    ) or (
        f"belong to {band.name!r}" in message
        and any(f"through {t.name!r}" in message for t in others)
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_interleaved_parallel_iterations_run_clean_under_random_schedules(seed):
    # A batched MatMul whose batch loop rotates two copies (docs/buffers.md#rotation): a
    # random schedule interleaves the iterations' lives of each tile; nothing is refused.
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import one_node_model

    from onnx2bir.compiler import compile_graph, import_graph

    model = one_node_model("MatMul", {"a": (6, 8, 300), "b": (6, 300, 8)})
    compiled = compile_graph(import_graph(model), CompileOptions(auto_cast="none"), [])
    feeds = synthesize_inputs(compiled.graph, 0)
    reference = run_function(compiled.module, feeds)
    run = run_scheduled(compiled.module, feeds, parse_schedule(f"random:{seed}"), True)
    assert run.race_count == 0
    assert np.array_equal(run.outputs["y"], reference["y"])
