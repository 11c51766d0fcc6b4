"""The padded copy of a window op's input (onnx2bir/codegen/spatial.py `padded_input`, used by
the generic conv): the pad value is stored around the interior only, and the input's copy
writes the interior, so every element of the copy is written once; compared with onnxruntime,
no element read unwritten. The window pools frame their bands in SBUF instead
(tests/codegen/test_framed_bands.py); the max pool here checks that frame's -inf."""

from __future__ import annotations

import math

import numpy as np
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.bir.enums import MemoryType, Opcode
from onnx2bir.bir.ir import all_loops
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions


def _conv(channels: int, pads: list[int], size: tuple[int, int]):
    """A 3 x 3 conv of `channels` channels with ONNX `pads` [top, left, bottom, right]."""
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((4, channels, 3, 3)) / (3 * math.sqrt(channels))).astype(
        np.float32
    )
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=pads)
    return make_model(node, {"x": (1, channels, *size)}, {"y": None}, initializers={"w": weight})


def _pool(pads: list[int], size: tuple[int, int]):
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], name="pool", kernel_shape=[7, 7], pads=pads, strides=[2, 2]
    )
    return make_model(node, {"x": (1, 2, *size)}, {"y": None})


def _stores_into_padded(model) -> tuple[int, int]:
    """(elements the DMAs store into the padded DRAM copy, every loop trip counted, and the
    copy's own elements). Without the memory plan, which might keep the copy on chip."""
    options = CompileOptions(auto_cast="none", memory_plan=False)
    compiled = compile_graph(import_graph(model), options, [])
    fn = compiled.module.functions[0]
    trips = {loop.axis: loop.trip_count for loop in all_loops(fn.entry)}
    padded = [
        loc
        for name, loc in fn.memory_locations.items()
        if name.endswith("/padded") and loc.memory is MemoryType.DRAM
    ]
    assert len(padded) == 1
    stored = 0
    for inst in fn.instructions():
        if inst.opcode is Opcode.DMA_COPY and inst.dst.loc == padded[0].name:
            elements = math.prod(size for _, size in inst.dst.pattern)
            stored += elements * math.prod(trips[axis] for axis in inst.loopnest)
    return stored, math.prod(padded[0].shape)


def test_an_asymmetrically_padded_conv_over_two_plane_tiles_matches_onnxruntime():
    # 150 planes: a tile of 128 and one of 22; pads 2 above, 1 left, 3 below, 0 right.
    assert_matches_onnxruntime(_conv(150, [2, 1, 3, 0], (9, 11)), passes=[])


def test_max_pool_frames_with_minus_infinity_in_strips_longer_than_one_store():
    # 3 columns of frame on each side of 700 rows: 2,100 elements a plane, more than one store
    # of the fill tile holds, so each side strip takes two stores. Negative inputs: a frame of
    # zeros instead of -inf would win every border window.
    model = _pool([3, 3, 3, 3], (700, 9))
    x = -1.0 - np.random.default_rng(1).random((1, 2, 700, 9)).astype(np.float32)
    assert_matches_onnxruntime(model, feeds={"x": x}, passes=[])


def test_every_element_of_the_padded_copy_is_stored_once():
    stored, size = _stores_into_padded(_conv(150, [2, 1, 3, 0], (9, 11)))
    assert stored == size
