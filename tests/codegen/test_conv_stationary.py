"""The generic conv's weight-stationary order (onnx2bir/codegen/lower/conv_stationary.py,
docs/conv_selection.md#generic-conv): weights loaded once per node, each band once for every
output block, the output evicted into its SBUF home; compared with onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.bir.enums import Engine, MemoryType, Opcode
from onnx2bir.bir.ir import all_loops
from onnx2bir.codegen.lower import conv_stationary
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.uninit import run_checked
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs


def _w(seed: int, *shape: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _chain(batch: int = 2):
    """Conv(3 -> 300, 3x3) -> Relu -> Conv(300 -> 200, 3x3, stride 2) -> Relu ->
    Conv(200 -> 136, 1x1): input-channel tiles of 128 + 128 + 44 and 128 + 72, output blocks
    of 128 + 128 + 44, 128 + 72 and 128 + 8."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="c0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
        helper.make_node(
            "Conv", ["r0", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="c2"),
    ]
    inits = {
        "w0": _w(1, 300, 3, 3, 3),
        "b0": _w(2, 300, 1),
        "w1": _w(3, 200, 300, 3, 3),
        "b1": _w(4, 200, 1),
        "w2": _w(5, 136, 200, 1, 1),
    }
    inits["b0"], inits["b1"] = inits["b0"][:, 0], inits["b1"][:, 0]
    return make_model(nodes, {"x": (batch, 3, 10, 10)}, {"y": None}, initializers=inits)


def _compile(model):
    return compile_graph(import_graph(model), CompileOptions(auto_cast="none"), [])


def _weight_dma_bytes(module, weight: str) -> int:
    """Bytes the program's DMAs read from `weight`, every trip of their loops counted."""
    fn = module.functions[0]
    trips = {loop.axis: loop.trip_count for loop in all_loops(fn.entry)}
    itemsize = fn.memory_locations[weight].dtype.itemsize
    total = 0
    for inst in fn.instructions():
        if inst.opcode is Opcode.DMA_COPY and inst.srcs["in"].loc == weight:
            elements = math.prod(size for _, size in inst.srcs["in"].pattern)
            total += elements * itemsize * math.prod(trips[axis] for axis in inst.loopnest)
    return total


def test_a_conv_chain_with_resident_activations_matches_onnxruntime():
    # At batch 1 every intermediate is resident (at batch 2 the 300- and 200-channel images
    # would start inside a 128-row chunk of the home, docs/memory_planner.md#layout).
    model = _chain(batch=1)
    compiled = _compile(model)
    plan = compiled.memory_plan
    assert all(plan.decisions[t].resident for t in ("c0", "r0", "c1", "r1"))
    # c1's bands are read from r0's home and framed in SBUF: no padded copy of r0
    # (docs/memory_planner.md#framed-bands).
    assert not [t for t in plan.decisions if t.endswith("/padded")]
    fn = compiled.module.functions[0]
    # Each layer's output is evicted by ScalarE straight into its home: no copy after it.
    homes = {"c0", "c1"}
    evictions = [
        i
        for i in fn.instructions()
        if i.opcode is Opcode.ACTIVATION and i.dst.loc in homes and i.origin.rule == "generic.Conv"
    ]
    assert {i.dst.loc for i in evictions} == homes
    assert_matches_onnxruntime(model, passes=[])


def test_weights_are_loaded_once_whatever_the_batch():
    # Not once per image, nor once per output tile: one DMA per input-channel tile, each on
    # its own queue, every weight element read once (the loads are outside every loop).
    compiled = _compile(_chain(batch=2))
    fn = compiled.module.functions[0]
    for weight, shape in (("w1", (200, 300, 3, 3)), ("w2", (136, 200, 1, 1))):
        loads = [
            i
            for i in fn.instructions()
            if i.opcode is Opcode.DMA_COPY and i.srcs["in"].loc == weight
        ]
        assert len(loads) == -(-shape[1] // 128)
        assert len({i.attrs["queue"] for i in loads}) == len(loads)
        assert all(not i.loopnest or all("node_" in a for a in i.loopnest) for i in loads)
        assert _weight_dma_bytes(compiled.module, weight) == 4 * int(np.prod(shape))


def test_weights_beyond_the_budget_stream_block_by_block(monkeypatch):
    monkeypatch.setattr(conv_stationary, "RESIDENT_WEIGHT_BYTES", 1024)
    model = _chain()
    compiled = _compile(model)
    # the block-by-block order reads w1 once per image
    assert _weight_dma_bytes(compiled.module, "w1") == 2 * 4 * 200 * 300 * 9
    assert_matches_onnxruntime(model, passes=[])


def test_a_wrong_edge_channel_tile_is_caught():
    # The 44-channel edge tile of r0 feeds c1 through its own band copy; zeroing that copy's
    # input weights (channels 256..299 of w1) must make the comparison fail.
    model = _chain()
    compiled = _compile(model)
    feeds = synthesize_inputs(compiled.graph, 0)
    want = run_onnxruntime(model, feeds)["y"]
    got = run_checked(compiled.module, feeds)
    assert compare_output("y", got["y"], want, FP32_ATOL, FP32_RTOL).passed
    compiled.module.constants["w1"] = compiled.module.constants["w1"].copy()
    compiled.module.constants["w1"][:, 256:] = 0.0
    broken = run_checked(compiled.module, feeds)
    assert not compare_output("y", broken["y"], want, FP32_ATOL, FP32_RTOL).passed


@pytest.mark.parametrize("auto_cast", ["none", "matmult"])
def test_the_output_blocks_rotate_their_psum_banks(auto_cast):
    compiled = compile_graph(import_graph(_chain()), CompileOptions(auto_cast=auto_cast), [])
    fn = compiled.module.functions[0]
    psum = {
        i.dst.offset
        for i in fn.instructions()
        if i.engine is Engine.PE
        and i.origin.node == "c1"
        and fn.memory_locations[i.dst.loc].memory is MemoryType.PSUM
    }
    # c1's two output blocks (128 + 72 channels) accumulate in two banks
    assert psum == {0, 512}
    band_loads = [  # by DMA, or by an engine copy when r0 stays in SBUF (in image groups)
        i
        for i in fn.instructions()
        if i.origin.node == "c1" and "band" in i.dst.loc and i.opcode is not Opcode.MEMSET
    ]
    # the 128-channel tiles in one copy, the 44-channel edge tile in another, for each output
    # tile the program spells out (those whose bands are framed are emitted on their own)
    widths = sorted(i.dst.num_partitions for i in band_loads)
    assert set(widths) == {44, 128} and widths.count(44) == widths.count(128)
