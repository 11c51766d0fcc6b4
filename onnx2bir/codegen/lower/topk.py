"""Generic lowering of TopK: the k largest (or smallest) values along `axis`, sorted, and their
indices; among equal values the lower index comes first.

The input is walked as [outer, length, inner], as ArgMax is: rows on partitions, `length` on
the free dim. Per row tile, a BIR loop of k selections: VectorE reduces the row's max (min)
into column j of the values tile, marks the positions equal to it, and the smallest marked
position (Iota numbering, eq·(idx − L) + L reduced by min) goes to column j of the indices
tile; that position is then knocked out with CopyPredicated (−inf, or +inf for the smallest).
The two [rows, k] tiles are stored by strided DMAs (the index store converts to int64).
k is the outputs' static size along `axis`; length ≤ MAX_LENGTH (positions exact in fp32).
Inputs that already hold ±inf at the knocked-out end are not supported.
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


def lower_topk(cg: BirCodeGen, node: Node) -> None:
    x_name = node.inputs[0]
    values_out, indices_out = node.output(0), node.output(1)
    shape = tuple(cg.graph.tensors[x_name].shape)
    axis = int(node.attr("axis", -1)) % len(shape)
    some_out = values_out or indices_out
    if not some_out:
        return
    k = cg.graph.tensors[some_out].shape[axis]  # k's value, as the static output shape has it
    largest = bool(node.attr("largest", 1))
    outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    if outer * inner * k == 0:
        return
    if length > MAX_LENGTH:
        raise cg.fail(f"TopK over {length} positions (at most {MAX_LENGTH})")
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    data, marks = cg.sb_tile("data", p, length, fp32), cg.sb_tile("marks", p, length, fp32)
    ids, shifted = cg.sb_tile("ids", p, length, fp32), cg.sb_tile("shifted", p, length, fp32)
    knock = cg.sb_tile("knock", p, length, Dtype.INT32)
    vals, poss = cg.sb_tile("values", p, k, fp32), cg.sb_tile("indices", p, k, fp32)
    iota(cg, cg.ap(ids), 0, 0, [1])
    cg.tensor_scalar(cg.ap(shifted), cg.ap(ids), AluOp.SUBTRACT, float(length))
    extreme = AluOp.MAX if largest else AluOp.MIN
    gone = float("-inf") if largest else float("inf")
    x_loc = cg.dram(x_name).name
    if inner == 1:
        loops, loop_stride, rows, row_stride = 1, 0, outer, length
    else:
        loops, loop_stride, rows, row_stride = outer, length * inner, inner, 1
    for o in tiles(cg, loops, 1, "o"):
        for r in tiles(cg, rows, p, "r"):

            def ap(tile, r=r):
                return cg.ap(tile, partitions=r.size)

            first = o.start * loop_stride + r.start * row_stride
            cg.dma(ap(data), cg.dram_ap(x_loc, first, [(row_stride, r.size), (inner, length)]))
            with cg.loop("j", 0, k) as j:
                value = cg.ap(vals, [(1, 1)], Affine.axis(j), partitions=r.size)
                position = cg.ap(poss, [(1, 1)], Affine.axis(j), partitions=r.size)
                cg.tensor_reduce(value, ap(data), extreme, axes=1)
                cg.tensor_scalar(ap(marks), ap(data), AluOp.IS_EQUAL, value)
                cg.tensor_tensor(ap(marks), ap(marks), ap(shifted), AluOp.MULTIPLY)
                cg.tensor_scalar(ap(marks), ap(marks), AluOp.ADD, float(length))
                cg.tensor_reduce(position, ap(marks), AluOp.MIN, axes=1)
                cg.tensor_scalar(ap(knock), ap(ids), AluOp.IS_EQUAL, position)
                cg.copy_predicated(ap(data), ap(knock), gone)
            # out[o, j, i] for the row tile: rows (i or o) with their stride, j with `inner`
            out_first = o.start * (k * inner) + r.start * (k if inner == 1 else 1)
            out_pattern = [(k if inner == 1 else 1, r.size), (inner, k)]
            for name, tile in ((values_out, vals), (indices_out, poss)):
                if name:
                    cg.dma(cg.dram_ap(cg.dram(name).name, out_first, out_pattern), ap(tile))
