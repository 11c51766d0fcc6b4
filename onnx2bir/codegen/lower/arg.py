"""Generic lowering of ArgMax and ArgMin: the first (or, with select_last_index, the last)
position of the extreme value along `axis`.

The input is viewed as [outer, length, inner], as Softmax is: rows (outer, or the inner positions
of one outer row at a time) go on partitions, `length` on the free dim. Per row tile, VectorE
takes the row's max (min), marks the positions equal to it (is_equal against the [P, 1] column),
and GpSimd's Iota numbers the positions. A candidate is the position where marked and a sentinel
elsewhere: eq·(idx − L) + L reduced by min gives the first, eq·(idx + 1) − 1 reduced by max the
last. Positions are exact in fp32 (length ≤ MAX_LENGTH); the store converts to int64.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.tiling import tiles
from onnx2bir.graph import Node

MAX_LENGTH = 8192


def lower_arg(cg: BirCodeGen, node: Node) -> None:
    x_name, out_name = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x_name].shape)
    rank = max(1, len(shape))
    axis = int(node.attr("axis", 0)) % rank
    last = bool(node.attr("select_last_index", 0))
    outer, length = math.prod(shape[:axis]), shape[axis] if shape else 1
    inner = math.prod(shape[axis + 1 :])
    if outer * inner == 0:
        return
    if length > MAX_LENGTH:
        raise cg.fail(f"{node['op_type']} over {length} positions (at most {MAX_LENGTH})")
    extreme = AluOp.MAX if node.op_type == "ArgMax" else AluOp.MIN
    fp32 = Dtype.FP32
    data = cg.sb_tile("data", NUM_PARTITIONS, length, fp32)
    marks = cg.sb_tile("marks", NUM_PARTITIONS, length, fp32)
    ids = cg.sb_tile("ids", NUM_PARTITIONS, length, fp32)
    best = cg.sb_tile("best", NUM_PARTITIONS, 1, fp32)
    iota(cg, cg.ap(ids), 0, 0, [1])
    if last:
        cg.tensor_scalar(cg.ap(ids), cg.ap(ids), AluOp.ADD, 1.0)
    else:
        cg.tensor_scalar(cg.ap(ids), cg.ap(ids), AluOp.SUBTRACT, float(length))
    x_loc, y_loc = cg.dram(x_name).name, cg.dram(out_name).name
    if inner == 1:
        loops, loop_stride, rows, row_stride = 1, 0, outer, length
    else:
        loops, loop_stride, rows, row_stride = outer, length * inner, inner, 1
    for o in tiles(cg, loops, 1, "o"):
        for r in tiles(cg, rows, NUM_PARTITIONS, "r"):
            x_tile = cg.ap(data, partitions=r.size)
            m_tile, i_tile = cg.ap(marks, partitions=r.size), cg.ap(ids, partitions=r.size)
            column = cg.ap(best, partitions=r.size)
            cg.dma(
                x_tile,
                cg.dram_ap(
                    x_loc,
                    o.start * loop_stride + r.start * row_stride,
                    [(row_stride, r.size), (inner, length)],
                ),
            )
            cg.tensor_reduce(column, x_tile, extreme, axes=1)
            cg.tensor_scalar(m_tile, x_tile, AluOp.IS_EQUAL, column)
            cg.tensor_tensor(m_tile, m_tile, i_tile, AluOp.MULTIPLY)
            if last:  # eq·(idx + 1) − 1, the largest
                cg.tensor_scalar(m_tile, m_tile, AluOp.SUBTRACT, 1.0)
                cg.tensor_reduce(column, m_tile, AluOp.MAX, axes=1)
            else:  # eq·(idx − L) + L, the smallest
                cg.tensor_scalar(m_tile, m_tile, AluOp.ADD, float(length))
                cg.tensor_reduce(column, m_tile, AluOp.MIN, axes=1)
            cg.dma(
                cg.dram_ap(y_loc, o.start * inner + r.start, [(1, r.size), (1, 1)]),
                column,
            )
