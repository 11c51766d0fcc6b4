"""Generic lowering of ScatterElements (reduction none, add, mul, max, min).

data, indices and updates are walked as [outer, length, inner] along `axis` (indices and
updates with their own length J): the (outer, inner) positions go on partitions in tiles of
128, the axis on the free dim. Per row tile the data row [P, L] is loaded, GpSimd's Iota
numbers the axis once, and a BIR loop over the J updates, in order (so a later duplicate
wins, as onnxruntime's in-order loop does), marks the target position
(is_equal against the index column, a negative index wrapped by + L), broadcasts the update
value over the row, and either copies it in where marked (CopyPredicated) or combines it:
add and mul through the mask (x + m·u, x·(1 + m·(u − 1))), max and min as a combine then a
predicated copy. The row goes back by DMA.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.tiling import Affine, tiles
from onnx2bir.graph import Node

MAX_LENGTH = 8192
_COMBINE = {"max": AluOp.MAX, "min": AluOp.MIN}


def lower_scatter_elements(cg: BirCodeGen, node: Node) -> None:
    data, indices, updates = node.inputs[:3]
    out = node.outputs[0]
    shape = tuple(cg.graph.tensors[data].shape)
    idx_shape = tuple(cg.graph.tensors[indices].shape)
    reduction = node.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise cg.fail(f"ScatterElements reduction {reduction!r} is not supported")
    axis = int(node.attr("axis", 0)) % len(shape)
    if idx_shape[:axis] != shape[:axis] or idx_shape[axis + 1 :] != shape[axis + 1 :]:
        raise cg.fail("ScatterElements: indices must match data outside the axis")
    outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    count = idx_shape[axis]
    if outer * length * inner == 0:
        return
    if length > MAX_LENGTH:
        raise cg.fail(f"ScatterElements along {length} positions (at most {MAX_LENGTH})")
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    row, numbers = cg.sb_tile("row", p, length, fp32), cg.sb_tile("numbers", p, length, fp32)
    marks, spread = (
        cg.sb_tile("marks", p, length, Dtype.INT32),
        cg.sb_tile("spread", p, length, fp32),
    )
    idx_t, upd_t = cg.sb_tile("indices", p, count, fp32), cg.sb_tile("updates", p, count, fp32)
    wrap = cg.sb_tile("wrap", p, count, fp32)
    iota(cg, cg.ap(numbers), 0, 0, [1])
    locs = {name: cg.dram(name).name for name in (data, indices, updates, out)}
    if inner == 1:
        loops, rows = 1, outer
        strides = {"data": (0, length, 1), "upd": (0, count, 1)}  # (loop, row, axis)
    else:
        loops, rows = outer, inner
        strides = {"data": (length * inner, 1, inner), "upd": (count * inner, 1, inner)}
    for o in tiles(cg, loops, 1, "o"):
        for r in tiles(cg, rows, p, "r"):

            def ap(tile, r=r):
                return cg.ap(tile, partitions=r.size)

            def window(kind: str, extent: int, o=o, r=r):
                loop_s, row_s, axis_s = strides[kind]
                return o.start * loop_s + r.start * row_s, [(row_s, r.size), (axis_s, extent)]

            start, pattern = window("data", length)
            cg.dma(ap(row), cg.dram_ap(locs[data], start, pattern))
            start, pattern = window("upd", count)
            cg.dma(ap(idx_t), cg.dram_ap(locs[indices], start, pattern))
            cg.dma(ap(upd_t), cg.dram_ap(locs[updates], start, pattern))
            cg.tensor_scalar(ap(wrap), ap(idx_t), AluOp.IS_LT, 0.0, AluOp.MULTIPLY, float(length))
            cg.tensor_tensor(ap(idx_t), ap(idx_t), ap(wrap), AluOp.ADD)
            with cg.loop("j", 0, count) as j:
                index = cg.ap(idx_t, [(1, 1)], Affine.axis(j), partitions=r.size)
                value = cg.ap(upd_t, [(1, 1)], Affine.axis(j), partitions=r.size)
                cg.tensor_scalar(ap(marks), ap(numbers), AluOp.IS_EQUAL, index)
                _apply(cg, reduction, ap(row), ap(marks), ap(spread), value)
            start, pattern = window("data", length)
            cg.dma(cg.dram_ap(locs[out], start, pattern), ap(row))


def _apply(cg: BirCodeGen, reduction: str, row, marks, spread, value) -> None:
    """row ← row combined with `value` (a [P, 1] column) where marks is 1."""
    if reduction == "add":  # x + m·u
        cg.tensor_scalar(spread, marks, AluOp.MULTIPLY, value)
        cg.tensor_tensor(row, row, spread, AluOp.ADD)
        return
    if reduction == "mul":  # x·(1 + m·(u − 1))
        cg.tensor_scalar(spread, marks, AluOp.MULTIPLY, value)
        cg.tensor_tensor(spread, spread, marks, AluOp.SUBTRACT)
        cg.tensor_scalar(spread, spread, AluOp.ADD, 1.0)
        cg.tensor_tensor(row, row, spread, AluOp.MULTIPLY)
        return
    if reduction == "none":  # u everywhere, copied in where marked
        cg.tensor_scalar(spread, marks, AluOp.MULTIPLY, 0.0, AluOp.ADD, value)
    else:
        cg.tensor_scalar(spread, row, _COMBINE[reduction], value)
    cg.copy_predicated(row, marks, spread)
