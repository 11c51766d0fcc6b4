"""Dependency edges between streams: exact enough to order every conflict, no window.

Overlap in these tests is computed independently of `codegen/deps.py`: by enumerating the
element indices of each access pattern with numpy. Order is reachability over the edges plus
each stream's program order (networkx).
"""

from __future__ import annotations

import sys
from pathlib import Path

import networkx as nx
import numpy as np
from onnx import TensorProto, helper

from onnx2bir.bir.enums import DepKind, Dtype, Engine, Opcode
from onnx2bir.bir.ir import AccessPattern, Loop
from onnx2bir.codegen import GENERIC_LOWERINGS, BirCodeGen
from onnx2bir.codegen.tiling import Affine
from onnx2bir.compiler import compile_model, import_graph, kernel_table
from onnx2bir.options import CompileOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from race_helpers import detect  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _elements(ap: AccessPattern, trips: dict[str, range] | None = None) -> set[int]:
    """Element indices (per partition) an access pattern touches over every value of its
    loop axes (`trips`: the values each axis takes)."""
    index = np.array([ap.offset])
    for axis, coef in ap.offset_terms:
        values = np.array(trips[axis]) if trips else np.zeros(1, dtype=int)
        index = (index[:, None] + coef * values[None, :]).reshape(-1)
    for stride, count in ap.pattern:
        index = (index[:, None] + stride * np.arange(count)[None, :]).reshape(-1)
    return set(index.tolist())


def _trips(block, found: dict[str, range] | None = None) -> dict[str, range]:
    """The values of every loop axis in `block`, nested loops included."""
    found = {} if found is None else found
    for item in block.items:
        if isinstance(item, Loop):
            found[item.axis] = range(item.start, item.stop, item.step)
            _trips(item.body, found)
    return found


def _order_graph(function) -> nx.DiGraph:
    """Edges plus each stream's program order, as a graph over instruction ids."""
    graph = nx.DiGraph()
    last: dict[str, int] = {}
    for inst in function.instructions():
        graph.add_node(inst.id)
        if inst.stream in last:
            graph.add_edge(last[inst.stream], inst.id)
        last[inst.stream] = inst.id
        for dep in inst.deps:
            if dep.carried_by is None:
                graph.add_edge(dep.source, inst.id)
    return graph


def test_a_600_input_concat_orders_every_writer_before_the_relu():
    n = 600
    names = [f"x{i}" for i in range(n)]
    graph = helper.make_graph(
        [
            helper.make_node("Concat", names, ["c"], axis=1, name="concat"),
            helper.make_node("Relu", ["c"], ["y"], name="relu"),
        ],
        "g",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 2, 4]) for x in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2 * n, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    # Every tensor in DRAM: the 600 writers and the reader meet in one DRAM buffer.
    fn = compile_model(model, CompileOptions(memory_plan=False)).module.functions[0]
    instructions = list(fn.instructions())
    writers = [i for i in instructions if i.origin.node == "concat"]
    readers = [
        i
        for i in instructions
        if i.origin.node == "relu" and "in" in i.srcs and i.srcs["in"].loc == "c"
    ]
    assert len(writers) == n and readers
    order = _order_graph(fn)
    trips = _trips(fn.entry)
    pairs = 0
    for reader in readers:
        read = _elements(reader.srcs["in"], trips)
        before = nx.ancestors(order, reader.id)
        for writer in writers:
            if _elements(writer.dst) & read:
                pairs += 1
                assert writer.id in before, (writer.id, reader.id)
    assert pairs >= n  # every writer meets some reader
    # More than the old 512-entry window: one reader has an edge from every writer on
    # another DMA queue.
    widest = max(len(reader.deps) for reader in readers)
    assert widest > 512
    assert not detect(fn).races


def test_every_edge_joins_two_streams_and_models_are_race_free():
    for name in ("small_cnn", "mha"):
        fn = compile_model(ROOT / "models" / f"{name}.onnx").module.functions[0]
        streams = {inst.id: inst.stream for inst in fn.instructions()}
        for inst in fn.instructions():
            for dep in inst.deps:
                assert streams[dep.source] != inst.stream, (inst.id, dep)
        assert not detect(fn).races


def _codegen(shape=(128, 64)) -> BirCodeGen:
    graph = import_graph(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Relu", ["x"], ["y"])],
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
            ),
            opset_imports=[helper.make_opsetid("", 18)],
            ir_version=10,
        )
    )
    cg = BirCodeGen(graph, CompileOptions(), GENERIC_LOWERINGS, kernel_table())
    cg.before_function()
    return cg


def test_interleaved_strided_writes_on_two_queues_get_no_edge_but_the_reader_gets_both():
    cg = _codegen()
    fn = cg.function
    with cg.scope("s"):
        tile = cg.sb_tile("t", 1, 64, Dtype.FP32)
        even = cg.dma(cg.dram_ap("y", Affine(), [(2, 32)]), cg.ap(tile, [(2, 32)]))
        odd = cg.dma(cg.dram_ap("y", Affine(1), [(2, 32)]), cg.ap(tile, [(2, 32)], 1))
        load = cg.dma(cg.ap(tile), cg.dram_ap("y", Affine(), [(1, 64)]))
    assert even.stream != odd.stream
    assert odd.deps == [] or all(d.source != even.id for d in odd.deps)
    kinds = {d.source: d.kind for d in load.deps}
    assert kinds.get(even.id) is DepKind.FLOW and kinds.get(odd.id) is DepKind.FLOW
    assert fn.memory_locations["y"].shape == (128, 64)


def test_a_loop_reusing_one_tile_gets_carried_edges_and_is_not_parallel():
    cg = _codegen((128, 512))
    with cg.scope("s"):
        tile = cg.sb_tile("t", 128, 64, Dtype.FP32)
        out = cg.sb_tile("u", 128, 64, Dtype.FP32)
        with cg.loop("i", 0, 8) as i:
            load = cg.dma(cg.ap(tile), cg.dram_ap("x", Affine.axis(i, 64), [(512, 128), (1, 64)]))
            act = cg.activation(cg.ap(out), cg.ap(tile), "relu")
            store = cg.dma(cg.dram_ap("y", Affine.axis(i, 64), [(512, 128), (1, 64)]), cg.ap(out))
    cg.after_function()
    loop = next(
        item
        for scope in cg.function.entry.items
        if isinstance(scope, Loop)
        for item in scope.body.items
        if isinstance(item, Loop)
    )
    assert loop.trip_count == 8 and not loop.parallel
    carried = {
        (d.source, inst.id, d.kind)
        for inst in (load, act, store)
        for d in inst.deps
        if d.carried_by == loop.axis
    }
    # iteration k's load overwrites the tile iteration k-1's activation read; k's activation
    # overwrites the tile k-1's store read
    assert (act.id, load.id, DepKind.ANTI) in carried
    assert (store.id, act.id, DepKind.ANTI) in carried
    assert all(d.distance == 1 for inst in (load, act, store) for d in inst.deps if d.carried_by)
    fn = cg.function
    assert not detect(fn).races
    for inst in (load, act):
        inst.deps = [d for d in inst.deps if d.carried_by is None]
    pairs = {race.pair for race in detect(fn).races}
    assert (act.id, load.id) in pairs and (store.id, act.id) in pairs


def test_a_loop_writing_its_own_slice_each_iteration_is_parallel():
    cg = _codegen((128, 512))
    with cg.scope("s"):
        tile = cg.sb_tile("t", 128, 512, Dtype.FP32)
        with cg.loop("i", 0, 8) as i:
            cg.dma(
                cg.ap(tile, [(1, 64)], Affine.axis(i, 64)),
                cg.dram_ap("x", Affine.axis(i, 64), [(512, 128), (1, 64)]),
            )
            cg.activation(
                cg.ap(tile, [(1, 64)], Affine.axis(i, 64)),
                cg.ap(tile, [(1, 64)], Affine.axis(i, 64)),
                "relu",
            )
        cg.dma(cg.dram_ap("y", Affine(), [(512, 128), (1, 512)]), cg.ap(tile))
    cg.after_function()
    loops = [
        item
        for scope in cg.function.entry.items
        if isinstance(scope, Loop)
        for item in scope.body.items
        if isinstance(item, Loop)
    ]
    assert len(loops) == 1 and loops[0].parallel
    assert not any(d.carried_by for inst in cg.function.instructions() for d in inst.deps)
    assert not detect(cg.function).races


def test_an_accumulating_matmul_loop_is_sequential_on_one_stream():
    cg = _codegen((128, 512))
    with cg.scope("s"):
        a = cg.sb_tile("a", 128, 512, Dtype.FP32)
        acc = cg.psum_tile("acc", 128, 128)
        with cg.loop("k", 0, 4) as k:
            cg.matmul(
                cg.ap(acc),
                cg.ap(a, [(1, 128)], Affine.axis(k, 128)),
                cg.ap(a, [(1, 128)], Affine.axis(k, 128)),
                accumulate=True,
            )
    loop = next(
        item
        for scope in cg.function.entry.items
        if isinstance(scope, Loop)
        for item in scope.body.items
        if isinstance(item, Loop)
    )
    # the hazard is the matmul against itself: no edge (one stream), but not parallel
    assert not loop.parallel
    assert all(
        inst.engine is Engine.PE or inst.opcode is Opcode.DMA_COPY
        for inst in loop.body.instructions()
    )
