"""Pruning of covered accesses: fewer edges, the same order (docs/dependencies.md#pruning).

Order is reachability over plain edges plus each stream's program order (networkx); races
come from the race detector over the unrolled program. Both are independent of
`codegen/deps.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import networkx as nx

from onnx2bir.bir.enums import Dtype, Engine
from onnx2bir.bir.ir import RuntimeValue, runtime_loops
from onnx2bir.codegen.tiling import Affine
from onnx2bir.runtime.machine.program import unroll
from onnx2bir.runtime.machine.races import RaceDetector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deps_equivalence import relu_codegen  # noqa: E402
from test_deps import _order_graph  # noqa: E402


def _races(function, trips: int = 0) -> list:
    program = unroll(function, {id(loop): [trips] for loop in runtime_loops(function.entry)})
    detector = RaceDetector(program)
    for index in range(len(program)):
        detector.check(index)
    return detector.races


def _reader_loop_writer(runtime: bool):
    """A reads tile t whole on ACT (into u); a loop rewrites t a slice per iteration on the
    DMA queues; then B overwrites t whole on DVE (from v). In a counted loop the slices cover what A
    read, so B's conflict with A is ordered through them."""
    cg = relu_codegen()
    with cg.scope("s"):
        t = cg.sb_tile("t", 128, 256, Dtype.FP32)
        u = cg.sb_tile("u", 128, 256, Dtype.FP32)
        v = cg.sb_tile("v", 128, 256, Dtype.FP32)
        load = cg.dma(cg.ap(t), cg.dram_ap("x", Affine(), [(512, 128), (1, 256)]))
        cg.dma(cg.ap(v), cg.dram_ap("x", Affine(), [(512, 128), (1, 256)]))
        a = cg.activation(cg.ap(u), cg.ap(t), "relu")

        def body(i: str) -> list:
            return [
                cg.dma(
                    cg.ap(t, [(1, 128)], Affine.axis(i, 128)),
                    cg.dram_ap("x", Affine.axis(i, 128), [(512, 128), (1, 128)]),
                )
            ]

        if runtime:
            item = cg.dynamic_loop("r", 0, RuntimeValue("x", 0))
            with cg.runtime_loop(item) as i:
                slices = body(i)
        else:
            with cg.loop("i", 0, 2) as i:  # as many trips as the view of a runtime loop
                slices = body(i)
        b = cg.tensor_copy(cg.ap(t), cg.ap(v), Engine.DVE)
        store = cg.dma(cg.dram_ap("y", Affine(), [(512, 128), (1, 256)]), cg.ap(t))
        cg.dma(cg.dram_ap("y", Affine(), [(512, 128), (1, 256)]), cg.ap(u))
    cg.after_function()
    return cg.function, load, a, slices[0], b, store


def test_a_loop_rewriting_what_was_read_orders_the_next_writer_through_it():
    function, _, a, write, b, _ = _reader_loop_writer(runtime=False)
    assert {d.source for d in write.deps} >= {a.id}  # each slice waits for the read of t
    # B overwrites what A read: no edge of its own, ordered through the slices' writes
    assert a.id not in {d.source for d in b.deps}
    assert write.id in {d.source for d in b.deps}
    assert a.id in nx.ancestors(_order_graph(function), b.id)
    assert not _races(function)


def test_a_runtime_loop_covers_nothing_as_it_may_not_run():
    function, _, a, write, b, _ = _reader_loop_writer(runtime=True)
    assert a.id in {d.source for d in b.deps}
    assert not _races(function, trips=0) and not _races(function, trips=3)
    # the edge is needed: without it, a run of no trips leaves A and B unordered
    b.deps = [d for d in b.deps if d.source != a.id]
    assert _races(function, trips=0)


def test_a_whole_tile_write_in_a_runtime_loop_keeps_what_it_covers_for_after_the_loop():
    cg = relu_codegen()
    with cg.scope("s"):
        t = cg.sb_tile("t", 128, 256, Dtype.FP32)
        u = cg.sb_tile("u", 128, 256, Dtype.FP32)
        v = cg.sb_tile("v", 128, 256, Dtype.FP32)
        whole = [(512, 128), (1, 256)]
        cg.dma(cg.ap(t), cg.dram_ap("x", Affine(), whole))
        cg.dma(cg.ap(v), cg.dram_ap("x", Affine(), whole))
        a = cg.activation(cg.ap(u), cg.ap(t), "relu")
        with cg.runtime_loop(cg.dynamic_loop("r", 0, RuntimeValue("x", 0))):
            w = cg.dma(cg.ap(t), cg.dram_ap("x", Affine(), whole))
            inside = cg.tensor_copy(cg.ap(u), cg.ap(t), Engine.POOL)
        b = cg.tensor_copy(cg.ap(t), cg.ap(v), Engine.DVE)
        cg.dma(cg.dram_ap("y", Affine(), whole), cg.ap(t))
        cg.dma(cg.dram_ap("y", Affine(), whole), cg.ap(u))
    cg.after_function()
    assert w.id in {d.source for d in inside.deps}
    # after a loop that may not run, B still waits for A's read of t
    assert a.id in {d.source for d in b.deps}
    assert not _races(cg.function, trips=0) and not _races(cg.function, trips=2)
