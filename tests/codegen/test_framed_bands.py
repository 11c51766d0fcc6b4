"""Framed bands (onnx2bir/codegen/spatial.py `window_tiles`, `clip`, `frame_band`,
`frame_sides`, `read_band`; docs/memory_planner.md#framed-bands): the window pools, the
generic conv and the rep_nhwc conv read each band straight from the input and set its padding
in SBUF, with the tiles that reach into the padding emitted on their own. Compared with
onnxruntime on inputs a wrong frame would change (negative values under a max, so a 0 frame
wins a border window; rotating band copies, so a position left unset holds the previous
tile's values); and no padded copy of the input is made."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.bir.enums import MemoryKind, MemoryType, Opcode
from onnx2bir.codegen.lower import pool
from onnx2bir.codegen.spatial import clip
from onnx2bir.codegen.tiling import Affine
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions


def _positions(start: int, count: int, pad: int, size: int, step: int) -> tuple[int, int, int]:
    """(before, inside, after) counted one position at a time."""
    indices = [start - pad + i * step for i in range(count)]
    before = sum(1 for i in indices if i < 0)
    after = sum(1 for i in indices if i >= size)
    return before, count - before - after, after


@pytest.mark.parametrize("step", [1, 2, 3])
def test_clip_counts_the_positions_in_the_padding_on_each_side(step):
    for start in range(0, 12):
        for count in range(1, 9):
            for pad in range(0, 4):
                for size in range(1, 10):
                    got = clip(Affine(start), count, pad, size, step)
                    before, inside, after = _positions(start, count, pad, size, step)
                    assert (got.before, got.inside, got.after) == (before, inside, after)
                    if inside:
                        assert got.first == Affine(start - pad + before * step)


def _no_padded_copy(model, passes=None) -> None:
    """The model compiles without a padded scratch and without writing any DRAM tensor but
    its outputs (memory plan off: every intermediate would be a DRAM tensor of its own)."""
    options = CompileOptions(auto_cast="none", memory_plan=False)
    fn = compile_graph(import_graph(model), options, passes).module.functions[0]
    assert not [name for name in fn.memory_locations if "padded" in name]
    written = {
        inst.dst.loc
        for inst in fn.instructions()
        if inst.opcode is Opcode.DMA_COPY
        and fn.memory_locations[inst.dst.loc].memory is MemoryType.DRAM
    }
    kinds = {fn.memory_locations[name].kind for name in written}
    assert kinds == {MemoryKind.EXTERNAL_OUTPUT}


POOLS = [
    # op, input [N, C, H, W], attrs
    ("MaxPool", (1, 3, 30, 40), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    (
        "MaxPool",
        (2, 5, 23, 29),
        {"kernel_shape": [3, 2], "pads": [2, 0, 1, 1], "dilations": [2, 1]},
    ),
    ("MaxPool", (1, 2, 19, 21), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    (
        "AveragePool",
        (1, 4, 25, 31),
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    ),
    (
        "AveragePool",
        (1, 4, 25, 31),
        {"kernel_shape": [5, 3], "strides": [2, 1], "pads": [2, 1, 2, 1]},
    ),
]


@pytest.mark.parametrize("op, shape, attrs", POOLS)
@pytest.mark.parametrize("out_tile", [pool.POOL_OUT_TILE, 12])
def test_pools_with_padding_match_onnxruntime(monkeypatch, op, shape, attrs, out_tile):
    # out_tile 12: output tiles of 12 pixels, so the rows (and the columns of the wider
    # outputs) take several tiles: clipped ones alone, a loop over those inside the input,
    # clipped ones after it, rotating over the band's copies.
    monkeypatch.setattr(pool, "POOL_OUT_TILE", out_tile)
    model = make_model(
        helper.make_node(op, ["x"], ["y"], name="pool", **attrs), {"x": shape}, {"y": None}
    )
    x = -1.0 - np.random.default_rng(3).random(shape).astype(np.float32)
    assert_matches_onnxruntime(model, feeds={"x": x}, passes=[])
    _no_padded_copy(model, passes=[])


def _conv(shape, c_out, kernel, **attrs):
    rng = np.random.default_rng(5)
    c_in = shape[1] // attrs.get("group", 1)
    w = rng.standard_normal((c_out, c_in, *kernel)) / math.sqrt(c_in * math.prod(kernel))
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    return make_model(node, {"x": shape}, {"y": None}, initializers={"w": w.astype(np.float32)})


CONVS = [
    # ResNet's stem at a smaller size: 7 x 7 stride 2, pad 3; out 48 x 100, 5 rows a tile, so
    # the first and last row tiles are clipped and the ones between run in a loop.
    ((1, 3, 96, 200), 8, (7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    # Two images, kernel rows taken two at a time (64 channels), asymmetric pads.
    ((2, 64, 14, 9), 16, (3, 3), {"pads": [2, 1, 0, 1]}),
    # Output wider than one PSUM bank: two column tiles, the first clipped on the left, the
    # second on the right; their side columns are framed tile by tile.
    ((1, 4, 6, 600), 8, (3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("shape, c_out, kernel, attrs", CONVS)
def test_rep_nhwc_convs_with_padding_match_onnxruntime(shape, c_out, kernel, attrs):
    model = _conv(shape, c_out, kernel, **attrs)
    x = np.random.default_rng(6).random(shape).astype(np.float32) + 0.5  # no cancelling
    compiled = compile_graph(import_graph(model), CompileOptions(auto_cast="none"))
    rules = {inst.origin.rule for inst in compiled.module.functions[0].instructions()}
    assert "kernel.Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh" in rules
    assert_matches_onnxruntime(model, feeds={"x": x})
    _no_padded_copy(model)


GENERIC_CONVS = [
    # 150 channels: a 128-channel tile and a 22-channel edge tile; pads 2 above, 1 left, 3
    # below, 0 right.
    ((1, 150, 9, 11), 4, (3, 3), {"pads": [2, 1, 3, 0]}),
    # Weights too large to stay resident (3 x 9 x 640 fp32 a partition): the block-by-block
    # order; 17 rows a tile, so the top and bottom tiles are clipped and one runs between.
    ((1, 300, 40, 30), 640, (3, 3), {"pads": [1, 1, 1, 1]}),
    # Two groups, stride 2 (ResNet's stage transitions), two images.
    ((2, 32, 17, 15), 32, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2}),
]


@pytest.mark.parametrize("shape, c_out, kernel, attrs", GENERIC_CONVS)
def test_generic_convs_with_padding_match_onnxruntime(shape, c_out, kernel, attrs):
    model = _conv(shape, c_out, kernel, **attrs)
    x = np.random.default_rng(7).random(shape).astype(np.float32) + 0.5
    assert_matches_onnxruntime(model, feeds={"x": x}, passes=[])
    _no_padded_copy(model, passes=[])


DEPTHWISE = [
    # MobileNet's 3 x 3 stride 2, two images (f01b: a row's columns are two elements apart),
    # 40 rows: several row tiles, the first and last clipped.
    ((2, 24, 40, 30), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    # EfficientNet's 5 x 5, asymmetric pads, 150 channels (a tile of 128 and one of 22).
    ((1, 150, 13, 17), {"pads": [2, 1, 3, 2]}),
]


@pytest.mark.parametrize("shape, attrs", DEPTHWISE)
def test_depthwise_convs_with_padding_match_onnxruntime(shape, attrs):
    channels = shape[1]
    kernel = (5, 5) if attrs["pads"][0] == 2 else (3, 3)
    model = _conv(shape, channels, kernel, group=channels, **attrs)
    x = np.random.default_rng(8).random(shape).astype(np.float32) + 0.5
    compiled = compile_graph(import_graph(model), CompileOptions(auto_cast="none"))
    rules = {inst.origin.rule for inst in compiled.module.functions[0].instructions()}
    assert "kernel.conv2d_depthwise_f01b_o01i_bf01" in rules
    assert_matches_onnxruntime(model, feeds={"x": x})
    _no_padded_copy(model)
