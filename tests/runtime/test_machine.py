"""Machine state: sentinel fill, operand views from access patterns, location and bounds rules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnx2bir.bir.enums import Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import AccessPattern, Function, Instruction, MemoryLocation, Origin
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine.machine import Machine
from onnx2bir.runtime.machine.semantics import SEMANTICS

ORIGIN = Origin("conv_3", "kernel.conv")


def tile(name, partitions, elems, dtype=Dtype.FP32, memory=MemoryType.SB, address=0, nbytes=None):
    return MemoryLocation(
        name,
        memory,
        MemoryKind.INTERNAL,
        dtype,
        (partitions, elems),
        partitions,
        address,
        elems * dtype.itemsize if nbytes is None else nbytes,
    )


def copy_ins(dst, src, ins_id=3):
    return Instruction(Opcode.TENSOR_COPY, Engine.DVE, dst, {"in": src}, {}, ORIGIN, id=ins_id)


def machine(*locs):
    return Machine(Function("f", {loc.name: loc for loc in locs}))


def rejects(mach, ins, words, loop_values=None):
    with pytest.raises(MachineError) as info:
        SEMANTICS[ins.opcode](mach, ins, loop_values or {})
    message = str(info.value)
    for word in [f"instruction {ins.id}", str(ins.opcode), "conv_3", "kernel.conv", *words]:
        assert word in message, (word, message)


def test_memories_start_as_nan_in_every_float_dtype():
    dram = MemoryLocation("out", MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, Dtype.BF16, (3, 5))
    mach = machine(dram)
    assert mach.sbuf.shape == (128, 196608) and mach.psum.shape == (128, 16384)
    assert (mach.sbuf == 0xFF).all() and (mach.psum == 0xFF).all()
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float16):
        assert np.isnan(mach.sbuf[:, :64].view(dtype).astype(np.float32)).all()
    assert mach.dram["out"].dtype == ml_dtypes.bfloat16 and mach.dram["out"].shape == (15,)
    assert np.isnan(mach.read("out").astype(np.float32)).all()
    assert mach.read("out").shape == (3, 5)


def test_uninitialised_read_shows_up_as_nan():
    written, fresh, out = (
        tile("w", 4, 8),
        tile("u", 4, 8, address=64),
        tile("o", 4, 16, address=128),
    )
    mach = machine(written, fresh, out)
    mach.location_view("w")[...] = 1.0
    whole = AccessPattern("o", ((1, 8),), 0, (), 0, 4)
    SEMANTICS[Opcode.TENSOR_COPY](
        mach, copy_ins(whole, AccessPattern("w", ((1, 8),), 0, (), 0, 4)), {}
    )
    later = AccessPattern("o", ((1, 8),), 8, (), 0, 4)
    SEMANTICS[Opcode.TENSOR_COPY](
        mach, copy_ins(later, AccessPattern("u", ((1, 8),), 0, (), 0, 4), 4), {}
    )
    result = mach.location_view("o")
    assert (result[:, :8] == 1.0).all() and np.isnan(result[:, 8:]).all()


def test_views_follow_partitions_offset_broadcast_and_negative_strides():
    loc = tile("t", 16, 32, address=256)
    mach = machine(loc)
    whole = mach.location_view("t")
    whole[...] = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    assert np.shares_memory(whole, mach.sbuf)
    assert (mach.sbuf[0, 256:260].view(np.float32) == 0.0).all()  # the location's byte address
    ap = AccessPattern("t", ((0, 3), (-2, 4)), 10, (), 4, 8)  # partitions 4..11, broadcast dim
    view = mach.operands(copy_ins(ap, ap))["in"].view({})
    assert view.shape == (8, 3, 4)
    p, b, j = np.indices((8, 3, 4))
    assert (view == whole[4 + p, 10 - 2 * j]).all()


def test_dram_view_is_flat_with_pattern_dims():
    loc = MemoryLocation("x", MemoryType.DRAM, MemoryKind.INTERNAL, Dtype.INT32, (4, 6))
    mach = machine(loc)
    mach.load("x", np.arange(24, dtype=np.int32).reshape(4, 6))
    ap = AccessPattern("x", ((1, 6), (6, 4)), 0)
    ops = mach.operands(copy_ins(ap, ap))
    assert (ops["in"].view({}) == np.arange(24).reshape(4, 6).T).all()


def test_loop_terms_move_the_view_and_are_bounds_checked():
    loc = tile("t", 2, 10)
    mach = machine(loc)
    mach.location_view("t")[...] = np.arange(20, dtype=np.float32).reshape(2, 10)
    ap = AccessPattern("t", ((1, 3),), 1, (("i", 3),), 0, 2)
    ins = copy_ins(ap, ap)
    operand = mach.operands(ins)["in"]
    assert operand.view({"i": 0}).tolist() == [[1, 2, 3], [11, 12, 13]]
    assert operand.view({"i": 2}).tolist() == [[7, 8, 9], [17, 18, 19]]
    rejects(mach, ins, ["outside location 't'", "[10, 12]"], {"i": 3})
    rejects(mach, ins, ["axis 'i'"], {})


@pytest.mark.parametrize(
    "loc, words",
    [
        (tile("big", 129, 4), ["129 partitions"]),
        (tile("far", 4, 4, address=196608 - 8), ["exceed", "196608"]),
        (tile("ps", 4, 4, memory=MemoryType.PSUM, address=16384 - 8), ["exceed", "16384"]),
        (tile("odd", 4, 4, address=2), ["aligned"]),
    ],
)
def test_location_rules(loc, words):
    mach = machine(loc)
    ap = AccessPattern(loc.name, ((1, 1),), 0, (), 0, 1)
    rejects(mach, copy_ins(ap, ap), [loc.name, *words])


@pytest.mark.parametrize(
    "ap, words",
    [
        (AccessPattern("t", ((1, 9),), 0, (), 0, 4), ["[0, 8]", "[0, 8)"]),
        (AccessPattern("t", ((-1, 3),), 1, (), 0, 4), ["[-1, 1]"]),
        (AccessPattern("t", ((1, 2),), 0, (), 4, 2), ["partitions [4, 6)"]),
        (AccessPattern("nope", ((1, 2),), 0, (), 0, 4), ["unknown memory location 'nope'"]),
        (AccessPattern("t", ((1, 0),), 0, (), 0, 4), ["empty"]),
    ],
)
def test_access_pattern_rules(ap, words):
    mach = machine(tile("t", 4, 8), tile("u", 4, 8, address=64))
    good = AccessPattern("u", ((1, 1),), 0, (), 0, 4)
    rejects(mach, copy_ins(good, ap), words)


def test_dram_patterns_have_no_partitions():
    loc = MemoryLocation("x", MemoryType.DRAM, MemoryKind.INTERNAL, Dtype.FP32, (4, 6))
    mach = machine(loc, tile("t", 4, 6))
    ap = AccessPattern("x", ((1, 6),), 0, (), 0, 4)
    dst = AccessPattern("t", ((1, 6),), 0, (), 0, 4)
    ins = Instruction(Opcode.DMA_COPY, Engine.DMA, dst, {"in": ap}, {"queue": 0}, ORIGIN, id=9)
    rejects(mach, ins, ["no partition dim"])
