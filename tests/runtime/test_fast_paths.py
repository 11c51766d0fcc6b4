"""The machine's fast paths give the bits of the plain computation (docs/simulation_speed.md).

- stores that are a plain cast go straight into the view, converted in the source's memory
  order: same bits as `alu.store_as` (the general path) and as ml_dtypes' own cast;
- Matmult's float64 scratch arrays, reused across instructions and loop iterations: every
  result is the float64 product rounded once to fp32, independent of what ran before;
- a Matmult whose moving operand is the identity (a PE transpose) copies the stationary
  transposed: the bits of the float64 product, -0 becoming +0, and the product itself when a
  value is not finite;
- inputs and constants that nothing writes are read in place, read-only, and are not changed.
"""

from __future__ import annotations

import numpy as np
import pytest

from onnx2bir.bir.dtypes import store_as
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
)
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine.interpreter import execute, load_machine, run_function
from onnx2bir.runtime.machine.machine import Machine
from onnx2bir.runtime.machine.semantics import SEMANTICS

RNG = np.random.default_rng(5)
ORIGIN = Origin("n", "test")
_ids = iter(range(10**6))


def _tile(name, partitions, elems, dtype=Dtype.FP32, memory=MemoryType.SB, address=0):
    shape = (partitions, elems)
    nbytes = elems * dtype.itemsize
    return MemoryLocation(
        name, memory, MemoryKind.INTERNAL, dtype, shape, partitions, address, nbytes
    )


def _dram(name, shape, kind=MemoryKind.INTERNAL, dtype=Dtype.FP32):
    return MemoryLocation(name, MemoryType.DRAM, kind, dtype, shape)


def _ins(opcode, engine, dst, srcs, **attrs):
    return Instruction(opcode, engine, dst, srcs, attrs, ORIGIN, next(_ids))


# ---- stores -------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN and inf cast to integers
@pytest.mark.parametrize(
    "source, target",
    [
        (Dtype.FP32, Dtype.BF16),
        (Dtype.FP32, Dtype.FP16),
        (Dtype.FP32, Dtype.FP32),
        (Dtype.BF16, Dtype.FP32),
        (Dtype.FP16, Dtype.FP32),
        (Dtype.BF16, Dtype.BF16),
        (Dtype.INT32, Dtype.INT32),
        (Dtype.INT32, Dtype.FP16),  # through fp32: not a fast path
        (Dtype.FP32, Dtype.INT32),
        (Dtype.FP32, Dtype.TF32),
        (Dtype.FP32, Dtype.FP8_E4M3),
    ],
)
def test_a_transposing_dma_stores_the_bits_of_store_as(source, target):
    """A column-by-column walk of a DRAM matrix (how weights are loaded) into a tile."""
    rows, cols = 48, 40
    src, dst = _dram("w", (rows, cols), dtype=source), _tile("t", cols, rows, target)
    machine = Machine(Function("f", {"w": src, "t": dst}))
    if source is Dtype.INT32:
        values = RNG.integers(-(2**20), 2**20, (rows, cols)).astype(np.int32)
    else:
        values = (RNG.standard_normal((rows, cols)) * 300).astype(np.float32)
        values[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
        values = values.astype(source.numpy)
    machine.load("w", values)
    column_walk = AccessPattern("w", ((1, cols), (cols, rows)))  # partition p = column p
    ins = _ins(
        Opcode.DMA_COPY,
        Engine.DMA,
        AccessPattern("t", ((1, rows),), 0, (), 0, cols),
        {"in": column_walk},
        queue=0,
    )
    SEMANTICS[Opcode.DMA_COPY](machine, ins, {})
    got = machine.location_view("t")
    expected = store_as(values.T, target)
    assert got.dtype == expected.dtype
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()
    if source is Dtype.FP32 and target in (Dtype.BF16, Dtype.FP16):
        assert got.tobytes() == values.T.astype(target.numpy).tobytes()  # ml_dtypes / numpy


def test_a_strided_store_of_a_compute_result_matches_store_as():
    """Activation writes every other element of a bf16 tile from a strided fp32 source."""
    src, dst = _tile("x", 16, 64), _tile("y", 16, 64, Dtype.BF16, address=256)
    machine = Machine(Function("f", {"x": src, "y": dst}))
    x = RNG.standard_normal((16, 64)).astype(np.float32) * 1e3
    machine.location_view("x")[...] = x
    machine.location_view("y")[...] = 0
    every_other = {"in": AccessPattern("x", ((2, 32),), 1, (), 0, 16)}
    dst_ap = AccessPattern("y", ((2, 32),), 0, (), 0, 16)
    ins = _ins(Opcode.ACTIVATION, Engine.ACT, dst_ap, every_other, func="copy", scale=3.0)
    SEMANTICS[Opcode.ACTIVATION](machine, ins, {})
    got = machine.location_view("y")
    assert got[:, 0::2].tobytes() == store_as(x[:, 1::2] * np.float32(3.0), Dtype.BF16).tobytes()
    assert not got[:, 1::2].astype(np.float32).any()  # untouched


# ---- Matmult scratch --------------------------------------------------------------------------


def _rounded_once(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64).T @ b.astype(np.float64)).astype(np.float32)


def test_matmults_sharing_scratch_in_a_loop_each_round_their_own_float64_product():
    """Two Matmults of one shape (bf16 and fp16 operands) alternate over a loop walking four
    moving tiles; the second accumulates onto the first. Scratch is shared by shape."""
    k, m, n, tiles = 128, 64, 96, 4
    st = _tile("st", k, m, Dtype.BF16)
    st2 = _tile("st2", k, m, Dtype.FP16, address=m * 2)
    mv = _tile("mv", k, n * tiles, Dtype.BF16, address=4 * m)
    mv2 = _tile("mv2", k, n * tiles, Dtype.FP16, address=4 * m + 2 * n * tiles)
    ps = _tile("ps", m, n * tiles, memory=MemoryType.PSUM)
    locs = {loc.name: loc for loc in (st, st2, mv, mv2, ps)}
    machine = Machine(Function("f", locs))
    a, a2 = RNG.standard_normal((k, m)), RNG.standard_normal((k, m)) * 1e-3
    b, b2 = RNG.standard_normal((k, n * tiles)), RNG.standard_normal((k, n * tiles)) * 1e4
    for name, values in (("st", a), ("st2", a2), ("mv", b), ("mv2", b2)):
        machine.location_view(name)[...] = values.astype(locs[name].dtype.numpy)
    stationary = AccessPattern("st", ((1, m),), 0, (), 0, k)
    stationary2 = AccessPattern("st2", ((1, m),), 0, (), 0, k)
    moving = AccessPattern("mv", ((1, n),), 0, (("j", n),), 0, k)
    moving2 = AccessPattern("mv2", ((1, n),), 0, (("j", n),), 0, k)
    out = AccessPattern("ps", ((1, n),), 0, (("j", n),), 0, m)
    body = [
        _ins(
            Opcode.MATMULT,
            Engine.PE,
            out,
            {"stationary": stationary, "moving": moving},
            accumulate=False,
        ),
        _ins(
            Opcode.MATMULT,
            Engine.PE,
            out,
            {"stationary": stationary2, "moving": moving2},
            accumulate=True,
        ),
    ]
    execute(machine, BasicBlock("b", [Loop("j", 0, tiles, 1, body=BasicBlock("l", body))]))
    bf, fp = [locs[x].dtype.numpy for x in ("st", "st2")]
    first = _rounded_once(a.astype(bf), b.astype(bf))
    second = _rounded_once(a2.astype(fp), b2.astype(fp))
    assert machine.location_view("ps").tobytes() == (second + first).tobytes()


def test_a_matmult_crossing_a_psum_bank_in_a_later_iteration_is_still_refused():
    """The bank check runs on every execution: iteration 1 lands across a 2 KiB bank."""
    k, m, n = 8, 4, 384  # 1536 bytes per row: the second tile starts 1536 bytes in
    st, mv = _tile("st", k, m), _tile("mv", k, n, address=64)
    ps = _tile("ps", m, 2 * n, memory=MemoryType.PSUM)
    machine = Machine(Function("f", {x.name: x for x in (st, mv, ps)}))
    machine.location_view("st")[...] = 1
    machine.location_view("mv")[...] = 1
    out = AccessPattern("ps", ((1, n),), 0, (("j", n),), 0, m)
    srcs = {
        "stationary": AccessPattern("st", ((1, m),), 0, (), 0, k),
        "moving": AccessPattern("mv", ((1, n),), 0, (), 0, k),
    }
    body = [_ins(Opcode.MATMULT, Engine.PE, out, srcs, accumulate=False)]
    block = BasicBlock("b", [Loop("j", 0, 2, 1, body=BasicBlock("l", body))])
    with pytest.raises(MachineError, match="cross a 2048-byte PSUM bank"):
        execute(machine, block)
    assert (machine.location_view("ps")[:, :n] == k).all()  # iteration 0 ran


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf * 0 in the reference product
@pytest.mark.parametrize("dtype", [Dtype.FP32, Dtype.BF16])
@pytest.mark.parametrize("special", [None, -0.0, np.inf, np.nan])
def test_a_matmult_against_the_identity_gives_the_bits_of_the_product(dtype, special):
    """The transpose shortcut: stationary[K, M] against moving = I[K, K] equals the float64
    product rounded once, also for -0 (which the sum from +0 turns into +0) and, through
    the product itself, for inf and NaN (whose zeros become NaN)."""
    k, m = 96, 40
    st, eye = _tile("st", k, m, dtype), _tile("eye", k, k, dtype, address=256)
    ps = _tile("ps", m, k, memory=MemoryType.PSUM)
    machine = Machine(Function("f", {x.name: x for x in (st, eye, ps)}))
    a = RNG.standard_normal((k, m)).astype(np.float32)
    a[::7, ::5] = 0.0
    if special is not None:
        a[3, 4] = special
    a = a.astype(dtype.numpy)
    identity = np.eye(k, dtype=dtype.numpy)
    machine.location_view("st")[...] = a
    machine.location_view("eye")[...] = identity
    srcs = {
        "stationary": AccessPattern("st", ((1, m),), 0, (), 0, k),
        "moving": AccessPattern("eye", ((1, k),), 0, (), 0, k),
    }
    out = AccessPattern("ps", ((1, k),), 0, (), 0, m)
    execute(
        machine, BasicBlock("b", [_ins(Opcode.MATMULT, Engine.PE, out, srcs, accumulate=False)])
    )
    expected = _rounded_once(a, identity)
    assert machine.location_view("ps").tobytes() == expected.tobytes()
    if special is not None and not np.isfinite(special):
        assert not np.isfinite(machine.location_view("ps")[4]).any()  # not a plain transpose


# ---- loading ------------------------------------------------------------------------------


def _scale_module(weight_written: bool):
    """y = x * w over one tile; optionally an instruction also writes into w."""
    x = _dram("x", (4, 8), MemoryKind.EXTERNAL_INPUT)
    w = _dram("w", (4, 8), MemoryKind.CONST)
    y = _dram("y", (4, 8), MemoryKind.EXTERNAL_OUTPUT)
    a, b = _tile("a", 4, 8), _tile("b", 4, 8, address=32)
    flat = {name: AccessPattern(name, ((1, 32),)) for name in "xwy"}
    tile_ap = {name: AccessPattern(name, ((1, 8),), 0, (), 0, 4) for name in "ab"}
    items = [
        _ins(Opcode.DMA_COPY, Engine.DMA, tile_ap["a"], {"in": flat["x"]}, queue=0),
        _ins(Opcode.DMA_COPY, Engine.DMA, tile_ap["b"], {"in": flat["w"]}, queue=1),
        _ins(
            Opcode.TENSOR_TENSOR,
            Engine.DVE,
            tile_ap["a"],
            {"in0": tile_ap["a"], "in1": tile_ap["b"]},
            op="multiply",
        ),
        _ins(Opcode.DMA_COPY, Engine.DMA, flat["y"], {"in": tile_ap["a"]}, queue=0),
    ]
    if weight_written:
        items.append(_ins(Opcode.DMA_COPY, Engine.DMA, flat["w"], {"in": tile_ap["a"]}, queue=1))
    fn = Function(
        "main", {loc.name: loc for loc in (x, w, y, a, b)}, ["x"], ["y"], BasicBlock("B", items)
    )
    weights = RNG.standard_normal((4, 8)).astype(np.float32)
    return Module("m", [fn], {"w": weights}), weights


def test_unwritten_inputs_and_constants_are_read_in_place_and_left_unchanged():
    module, weights = _scale_module(weight_written=False)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    machine = load_machine(module, module.functions[0], {"x": x})
    for name, payload in (("w", weights), ("x", x)):
        assert np.shares_memory(machine.dram[name], payload)
        assert not machine.dram[name].flags.writeable
    before = weights.copy()
    out = run_function(module, {"x": x})["y"]
    assert out.tobytes() == (x * before).tobytes()
    assert weights.tobytes() == before.tobytes()


def test_a_constant_an_instruction_writes_is_a_private_copy():
    module, weights = _scale_module(weight_written=True)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    machine = load_machine(module, module.functions[0], {"x": x})
    assert not np.shares_memory(machine.dram["w"], weights)
    before = weights.copy()
    out = run_function(module, {"x": x})["y"]
    assert out.tobytes() == (x * before).tobytes()
    assert weights.tobytes() == before.tobytes()  # the run wrote its own copy


# ---- pooling windows ----------------------------------------------------------------------


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("specials", ["none", "zeros", "negative zeros", "nans"])
def test_a_windowed_max_or_min_reduce_gives_numpys_bits(op, specials):
    """3 x 3 windows at stride 2 over 8 partitions of a 9 x 11 image (a max pool), with NaNs
    of random payloads and zeros of either sign mixed in: the same bits as numpy's reduce
    over the same strided view, whichever path the machine takes."""
    rows, cols, out_h, out_w = 9, 11, 4, 5
    src, dst = _tile("x", 8, rows * cols), _tile("y", 8, out_h * out_w, address=4096)
    machine = Machine(Function("f", {"x": src, "y": dst}))
    x = RNG.standard_normal((8, rows * cols)).astype(np.float32)
    if specials != "none":
        picks = RNG.random(x.shape) < 0.3
        if specials == "zeros":
            x[picks] = 0.0
        elif specials == "negative zeros":
            x[picks] = RNG.choice([0.0, -0.0], picks.sum())
        else:
            x[picks] = np.nan
            bits = x.view(np.uint32)
            bits[picks] ^= RNG.integers(0, 1 << 22, picks.sum()).astype(np.uint32)
    machine.location_view("x")[...] = x
    windows = ((2 * cols, out_h), (2, out_w), (cols, 3), (1, 3))
    ins = _ins(
        Opcode.TENSOR_REDUCE,
        Engine.DVE,
        AccessPattern("y", ((1, out_h * out_w),), 0, (), 0, 8),
        {"in": AccessPattern("x", windows, 0, (), 0, 8)},
        op=op,
        axes=2,
    )
    SEMANTICS[Opcode.TENSOR_REDUCE](machine, ins, {})
    view = np.lib.stride_tricks.as_strided(
        x, (8, out_h, out_w, 3, 3), (x.strides[0], 2 * cols * 4, 8, cols * 4, 4)
    )
    ufunc = np.maximum if op == "max" else np.minimum
    expected = ufunc.reduce(view, axis=(3, 4)).reshape(8, -1)
    assert machine.location_view("y").tobytes() == expected.tobytes()
