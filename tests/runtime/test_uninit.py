"""The uninitialised-read check: an instruction reading elements nothing wrote is reported
unless it is marked can_read_uninit (docs/predicates.md)."""

from __future__ import annotations

import numpy as np
import pytest

from onnx2bir.bir.enums import Dtype, Engine, MemoryKind, MemoryType, Opcode
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
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine.uninit import run_checked

_ids = iter(range(10**6))


def ins(opcode, engine, dst, srcs=None, **attrs):
    return Instruction(opcode, engine, dst, srcs or {}, attrs, Origin("n", "t"), next(_ids))


X = MemoryLocation("x", MemoryType.DRAM, MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (4, 8))
Y = MemoryLocation("y", MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32, (4, 1))
SCRATCH = MemoryLocation("s", MemoryType.DRAM, MemoryKind.INTERNAL, Dtype.FP32, (4, 8))
T = MemoryLocation("t", MemoryType.SB, MemoryKind.INTERNAL, Dtype.FP32, (4, 8), 4, 0, 32)
R = MemoryLocation("r", MemoryType.SB, MemoryKind.INTERNAL, Dtype.FP32, (4, 1), 4, 64, 4)


def module(items):
    fn = Function("main", {m.name: m for m in (X, Y, SCRATCH, T, R)}, ["x"], ["y"])
    fn.entry.items = items
    return Module("m", [fn])


def tile(cols=8, start=0):
    return AccessPattern("t", ((1, cols),), start, (), 0, 4)


def reduce_and_store(can_read_uninit=False):
    r = AccessPattern("r", ((1, 1),), 0, (), 0, 4)
    reduce = ins(Opcode.TENSOR_REDUCE, Engine.DVE, r, {"in": tile()}, op="max", axes=1)
    reduce.can_read_uninit = can_read_uninit
    store = ins(
        Opcode.DMA_COPY, Engine.DMA, AccessPattern("y", ((1, 4), (1, 1))), {"in": r}, queue=0
    )
    return [reduce, store]


X_FEED = {"x": np.arange(32, dtype=np.float32).reshape(4, 8)}


def half_written():
    """Load only columns 0..3 of the tile from x."""
    src = AccessPattern("x", ((8, 4), (1, 4)))
    return ins(Opcode.DMA_COPY, Engine.DMA, tile(4), {"in": src}, queue=0)


def test_a_read_of_unwritten_sbuf_is_reported():
    items = [half_written(), *reduce_and_store()]
    with pytest.raises(MachineError, match=r"reads 16 of 32 elements of 't' \(in\) that nothing"):
        run_checked(module(items), X_FEED)


def test_can_read_uninit_allows_it():
    items = [half_written(), *reduce_and_store(can_read_uninit=True)]
    run_checked(module(items), X_FEED)  # no error: the instruction says it may


def test_written_elements_and_loaded_inputs_pass():
    whole = ins(
        Opcode.DMA_COPY, Engine.DMA, tile(), {"in": AccessPattern("x", ((8, 4), (1, 8)))}, queue=0
    )
    got = run_checked(module([whole, *reduce_and_store()]), X_FEED)
    np.testing.assert_array_equal(got["y"][:, 0], [7, 15, 23, 31])


def test_an_unwritten_internal_dram_tensor_is_reported():
    load = ins(
        Opcode.DMA_COPY, Engine.DMA, tile(), {"in": AccessPattern("s", ((8, 4), (1, 8)))}, queue=0
    )
    with pytest.raises(MachineError, match="'s' \\(in\\) that nothing wrote"):
        run_checked(module([load, *reduce_and_store()]), X_FEED)


def test_a_predicated_read_is_checked_as_it_ran():
    """Rows 0..2 are written; a predicated reduce over rows below 3 reads only those."""
    rows3 = ins(
        Opcode.DMA_COPY,
        Engine.DMA,
        AccessPattern("t", ((1, 8),), 0, (), 0, 3),
        {"in": AccessPattern("x", ((8, 3), (1, 8)))},
        queue=0,
    )
    reduce, store = reduce_and_store()
    reduce.predicate = Predicate(3, (("k", 0),))
    reduce.loopnest = ("k",)
    loop = Loop("k", 0, 1, body=BasicBlock("block0", [reduce]))
    # The store reads all four rows of r; only three were written.
    with pytest.raises(MachineError, match="reads 1 of 4 elements of 'r'"):
        run_checked(module([rows3, loop, store]), X_FEED)
    reduce.predicate = Predicate(4, (("k", 0),))
    with pytest.raises(MachineError, match="reads 8 of 32 elements of 't'"):
        run_checked(module([rows3, loop, store]), X_FEED)
