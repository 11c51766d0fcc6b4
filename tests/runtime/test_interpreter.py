"""run_function: inputs and constants in, loops walking tiles through offset terms, outputs out."""

from __future__ import annotations

import ml_dtypes
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
)
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine.interpreter import run_function

RNG = np.random.default_rng(1)
_ids = iter(range(10**6))


def dram(name, shape, kind, dtype=Dtype.FP32):
    return MemoryLocation(name, MemoryType.DRAM, kind, dtype, shape)


def tile(name, partitions, elems, memory=MemoryType.SB, address=0, dtype=Dtype.FP32):
    nbytes = elems * dtype.itemsize
    shape = (partitions, elems)
    return MemoryLocation(
        name, memory, MemoryKind.INTERNAL, dtype, shape, partitions, address, nbytes
    )


def ins(opcode, engine, dst, srcs=None, node="n", **attrs):
    return Instruction(opcode, engine, dst, srcs or {}, attrs, Origin(node, "test"), next(_ids))


def module(locs, items, inputs, outputs, constants=None):
    fn = Function("main", {loc.name: loc for loc in locs}, inputs, outputs, BasicBlock("Block1"))
    fn.entry.items = items
    return Module("m", [fn], constants or {})


def loop(axis, stop, items, start=0, step=1):
    return Loop(axis, start, stop, step, body=BasicBlock("block0", items))


def exp_tiles_module(rows, cols, tile_rows, step=1):
    """out = exp(x) over row tiles: DMA in, Activation, DMA out, offsets from the loop axis."""
    x = dram("x", (rows, cols), MemoryKind.EXTERNAL_INPUT)
    y = dram("y", (rows, cols), MemoryKind.EXTERNAL_OUTPUT)
    a, b = tile("a", tile_rows, cols), tile("b", tile_rows, cols, address=cols * 4)
    terms = (("t", tile_rows * cols),)
    dram_ap = {n: AccessPattern(n, ((cols, tile_rows), (1, cols)), 0, terms) for n in "xy"}
    a_ap = AccessPattern("a", ((1, cols),), 0, (), 0, tile_rows)
    b_ap = AccessPattern("b", ((1, cols),), 0, (), 0, tile_rows)
    body = [
        ins(Opcode.DMA_COPY, Engine.DMA, a_ap, {"in": dram_ap["x"]}, queue=0),
        ins(Opcode.ACTIVATION, Engine.ACT, b_ap, {"in": a_ap}, func="exp", scale=1.0),
        ins(Opcode.DMA_COPY, Engine.DMA, dram_ap["y"], {"in": b_ap}, queue=1),
    ]
    items = [loop("t", rows // tile_rows, body, step=step)]
    return module([x, y, a, b], items, ["x"], ["y"])


def test_loop_walks_row_tiles():
    x = RNG.standard_normal((256, 48)).astype(np.float32)
    out = run_function(exp_tiles_module(256, 48, 128), {"x": x})
    assert out["y"].shape == (256, 48) and out["y"].dtype == np.float32
    np.testing.assert_allclose(out["y"], np.exp(x), rtol=1e-6)


def test_loop_step_skips_tiles_and_unwritten_output_stays_nan():
    x = RNG.standard_normal((128, 8)).astype(np.float32)
    out = run_function(exp_tiles_module(128, 8, 32, step=2), {"x": x})["y"]
    for t in range(4):
        rows = out[32 * t : 32 * t + 32]
        if t % 2 == 0:
            np.testing.assert_allclose(rows, np.exp(x[32 * t : 32 * t + 32]), rtol=1e-6)
        else:
            assert np.isnan(rows).all()


def test_observer_sees_every_execution_with_loop_values():
    seen = []
    x = np.zeros((64, 4), np.float32)
    run_function(
        exp_tiles_module(64, 4, 16), {"x": x}, observer=lambda i, lv: seen.append(dict(lv))
    )
    assert len(seen) == 12
    assert [v["t"] for v in seen[::3]] == [0, 1, 2, 3]


def test_tiled_matmul_with_nested_loops_and_psum_accumulation():
    """C[m, n] = Σ_k A[k, m] B[k, n] with K in 3 tiles of 128 and N in 2 tiles of 256."""
    k_size, m_size, n_size, kt, nt = 384, 64, 512, 128, 256
    a_dram = dram("A", (k_size, m_size), MemoryKind.EXTERNAL_INPUT)
    b_dram = dram("B", (k_size, n_size), MemoryKind.CONST)
    c_dram = dram("C", (m_size, n_size), MemoryKind.EXTERNAL_OUTPUT)
    a_sb, b_sb = tile("a", kt, m_size), tile("b", kt, nt, address=m_size * 4)
    ps = tile("ps", m_size, nt, MemoryType.PSUM)
    c_sb = tile("c", m_size, nt, address=4096)
    a_ap = AccessPattern("a", ((1, m_size),), 0, (), 0, kt)
    b_ap = AccessPattern("b", ((1, nt),), 0, (), 0, kt)
    ps_ap = AccessPattern("ps", ((1, nt),), 0, (), 0, m_size)
    c_ap = AccessPattern("c", ((1, nt),), 0, (), 0, m_size)

    def k_tile(accumulate):
        a_src = AccessPattern("A", ((m_size, kt), (1, m_size)), 0, (("k", kt * m_size),))
        b_src = AccessPattern("B", ((n_size, kt), (1, nt)), 0, (("k", kt * n_size), ("n", nt)))
        return [
            ins(Opcode.DMA_COPY, Engine.DMA, a_ap, {"in": a_src}, queue=0),
            ins(Opcode.DMA_COPY, Engine.DMA, b_ap, {"in": b_src}, queue=1),
            ins(
                Opcode.MATMULT,
                Engine.PE,
                ps_ap,
                {"stationary": a_ap, "moving": b_ap},
                accumulate=accumulate,
            ),
        ]

    c_dst = AccessPattern("C", ((n_size, m_size), (1, nt)), 0, (("n", nt),))
    n_body = [
        loop("k", 1, k_tile(False)),  # the first K tile overwrites the bank...
        loop("k", k_size // kt, k_tile(True), start=1),  # ...the others accumulate
        ins(Opcode.TENSOR_COPY, Engine.DVE, c_ap, {"in": ps_ap}),
        ins(Opcode.DMA_COPY, Engine.DMA, c_dst, {"in": c_ap}, queue=2),
    ]
    a = RNG.standard_normal((k_size, m_size)).astype(np.float32)
    b = RNG.standard_normal((k_size, n_size)).astype(np.float32)
    mod = module(
        [a_dram, b_dram, c_dram, a_sb, b_sb, ps, c_sb],
        [loop("n", n_size // nt, n_body)],
        ["A"],
        ["C"],
        {"B": b},
    )
    out = run_function(mod, {"A": a})
    np.testing.assert_allclose(out["C"], a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "inputs, words",
    [
        ({}, "missing input 'x'"),
        ({"x": np.zeros((64, 4), np.float64)}, "float64"),
        ({"x": np.zeros((4, 64), np.float32)}, "[4, 64]"),
        ({"x": np.zeros((64, 4), np.float32), "z": np.zeros(1)}, "'z'"),
    ],
)
def test_inputs_are_checked(inputs, words):
    with pytest.raises(ValueError) as info:
        run_function(exp_tiles_module(64, 4, 16), inputs)
    assert words in str(info.value)


def test_missing_constant_and_unknown_function():
    c = dram("c", (2,), MemoryKind.CONST)
    with pytest.raises(ValueError, match="constant 'c'"):
        run_function(module([c], [], [], []), {})
    with pytest.raises(KeyError):
        run_function(exp_tiles_module(64, 4, 16), {}, function_name="other")


def test_machine_error_inside_a_loop_names_the_origin():
    """A fifth trip over a 4-tile input runs off the end of DRAM."""
    mod = exp_tiles_module(64, 4, 16)
    mod.functions[0].entry.items[0].stop = 5
    mod.functions[0].entry.items[0].body.items[0].origin = Origin("relu_7", "rule.tile")
    with pytest.raises(MachineError, match=r"DmaCopy \(node 'relu_7', rule 'rule.tile'\)"):
        run_function(mod, {"x": np.zeros((64, 4), np.float32)})


def test_outputs_are_copies():
    x = np.ones((16, 4), np.float32)
    mod = exp_tiles_module(16, 4, 16)
    first = run_function(mod, {"x": x})["y"]
    first[...] = 0
    np.testing.assert_allclose(run_function(mod, {"x": x})["y"], np.e, rtol=1e-6)


def test_dtype_casts_through_dma_and_parameter_fallback_to_constants():
    """bf16 input, fp32 tile, fp16 output; a weight parameter comes from module.constants."""
    x = dram("x", (4, 8), MemoryKind.EXTERNAL_INPUT, Dtype.BF16)
    w = dram("w", (4, 8), MemoryKind.EXTERNAL_INPUT_PARAMETER)
    y = dram("y", (4, 8), MemoryKind.EXTERNAL_OUTPUT, Dtype.FP16)
    a, b = tile("a", 4, 8), tile("b", 4, 8, address=32)
    a_ap = AccessPattern("a", ((1, 8),), 0, (), 0, 4)
    b_ap = AccessPattern("b", ((1, 8),), 0, (), 0, 4)
    flat = {n: AccessPattern(n, ((1, 32),)) for n in "xwy"}
    items = [
        ins(Opcode.DMA_COPY, Engine.DMA, a_ap, {"in": flat["x"]}, queue=0),
        ins(Opcode.DMA_COPY, Engine.DMA, b_ap, {"in": flat["w"]}, queue=1),
        ins(Opcode.TENSOR_TENSOR, Engine.DVE, a_ap, {"in0": a_ap, "in1": b_ap}, op="multiply"),
        ins(Opcode.DMA_COPY, Engine.DMA, flat["y"], {"in": a_ap}, queue=0),
    ]
    xv = RNG.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)
    wv = RNG.standard_normal(32).astype(np.float32)  # a flat payload is accepted for constants
    out = run_function(module([x, w, y, a, b], items, ["x", "w"], ["y"], {"w": wv}), {"x": xv})
    expected = (xv.astype(np.float32) * wv.reshape(4, 8)).astype(np.float16)
    assert out["y"].dtype == np.float16 and out["y"].tobytes() == expected.tobytes()
