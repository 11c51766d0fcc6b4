"""Generic lowering of OneHot: out[o, d, i] = on if indices[o, i] (a negative index counts
from the end) equals d, else off.

The output is walked as [outer, depth, inner] (depth inserted at `axis`): per outer index (a
BIR loop) the inner positions go on partitions in tiles of 128 and the depth on the free dim.
GpSimd's Iota numbers the depth once; per tile, VectorE wraps negative indices
(idx + depth·(idx < 0)), compares the numbering with the index column (is_equal) and maps the
mask to off + mask·(on − off) with [P, 1] columns of the two values (loaded by a stride-0 DMA, so
they may be runtime inputs); a strided DMA stores it (depth with stride `inner`). The depth is
the output's static size along `axis`; depth ≤ MAX_DEPTH.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.tiling import Affine, tiles
from onnx2bir.graph import Node

MAX_DEPTH = 16384


def lower_one_hot(cg: BirCodeGen, node: Node) -> None:
    indices, _, values_name = node.inputs[:3]
    out = node.outputs[0]
    out_shape = tuple(cg.graph.tensors[out].shape)
    axis = int(node.attr("axis", -1)) % len(out_shape)
    depth = out_shape[axis]  # the depth input's value, as the static output shape has it
    outer, inner = math.prod(out_shape[:axis]), math.prod(out_shape[axis + 1 :])
    if outer * inner * depth == 0:
        return
    if depth > MAX_DEPTH:
        raise cg.fail(f"OneHot depth {depth} (at most {MAX_DEPTH})")
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    numbers = cg.sb_tile("numbers", p, depth, fp32)
    column = cg.sb_tile("index", p, 1, fp32)
    wrap = cg.sb_tile("wrap", p, 1, fp32)
    off, diff = cg.sb_tile("off", p, 1, fp32), cg.sb_tile("on_minus_off", p, 1, fp32)
    values = cg.dram(values_name).name
    cg.dma(cg.ap(off), cg.dram_ap(values, Affine(0), [(0, p), (1, 1)]))
    cg.dma(cg.ap(diff), cg.dram_ap(values, Affine(1), [(0, p), (1, 1)]))
    cg.tensor_tensor(cg.ap(diff), cg.ap(diff), cg.ap(off), AluOp.SUBTRACT)
    result = cg.sb_tile("result", p, depth, fp32)
    iota(cg, cg.ap(numbers), 0, 0, [1])
    idx_loc, y_loc = cg.dram(indices).name, cg.dram(out).name
    for o in tiles(cg, outer, 1, "o"):
        for r in tiles(cg, inner, p, "r"):
            col, wrp = cg.ap(column, partitions=r.size), cg.ap(wrap, partitions=r.size)
            res = cg.ap(result, partitions=r.size)
            cg.dma(col, cg.dram_ap(idx_loc, o.start * inner + r.start, [(1, r.size), (1, 1)]))
            cg.tensor_scalar(wrp, col, AluOp.IS_LT, 0.0, AluOp.MULTIPLY, float(depth))
            cg.tensor_tensor(col, col, wrp, AluOp.ADD)
            cg.tensor_scalar(res, cg.ap(numbers, partitions=r.size), AluOp.IS_EQUAL, col)
            cg.tensor_scalar(
                res,
                res,
                AluOp.MULTIPLY,
                cg.ap(diff, partitions=r.size),
                AluOp.ADD,
                cg.ap(off, partitions=r.size),
            )
            cg.dma(
                cg.dram_ap(
                    y_loc, o.start * (depth * inner) + r.start, [(1, r.size), (inner, depth)]
                ),
                res,
            )
