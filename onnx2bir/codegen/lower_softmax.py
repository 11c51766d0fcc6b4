"""Generic lowering of Softmax: the numerically stable exp(x − rowmax) / Σ exp(x − rowmax), and
of LogSoftmax: x − rowmax − log Σ exp(x − rowmax).

Opset < 13 flattens the input to 2-D at `axis` and normalises each row of the flattened view;
opset ≥ 13 normalises along `axis` alone. Either way the tensor becomes
[outer, length, inner] with the softmax over `length`: rows (outer · inner) go on partitions,
`length` on the free dim, read with stride `inner`.

Per tile: VectorE takes the negated row max, ScalarE computes exp(x + (−max)) with the max as
its per-partition bias, VectorE sums and divides. Rows longer than one tile are processed in
chunks: a pass for the max, a pass for the sum, a pass to write the normalised values.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import ActFunc, AluOp
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.registry import lowering
from onnx2bir.codegen.tiling import tile_index, tiles

ROW_CHUNK = 8192


@lowering("Softmax")
def lower_softmax(cg: BirCodeGen, node: dict) -> None:
    _emit_softmax(cg, node, log=False)


@lowering("LogSoftmax")
def lower_log_softmax(cg: BirCodeGen, node: dict) -> None:
    """x − max − log Σ exp(x − max): the same passes; the last subtracts instead of dividing."""
    _emit_softmax(cg, node, log=True)


def _emit_softmax(cg: BirCodeGen, node: dict, log: bool) -> None:
    x_name, out_name = node["inputs"][0], node["outputs"][0]
    shape = tuple(cg.graph.tensors[x_name].shape)
    rank = max(1, len(shape))
    default_axis = -1 if cg.graph.opset >= 13 else 1
    axis = node["attrs"].get("axis", default_axis) % rank
    if cg.graph.opset < 13:
        outer, length, inner = math.prod(shape[:axis]), math.prod(shape[axis:]), 1
    else:
        outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    if outer * length * inner == 0:
        return
    dtype = cg.graph.tensors[x_name].dtype
    chunk = min(length, ROW_CHUNK)
    chunks = -(-length // chunk)
    data = cg.sb_tile("data", NUM_PARTITIONS, chunk, dtype)
    partial = cg.sb_tile("partial", NUM_PARTITIONS, chunks, dtype)
    neg_max = cg.sb_tile("neg_max", NUM_PARTITIONS, 1, dtype)
    total = cg.sb_tile("sum", NUM_PARTITIONS, 1, dtype)
    # LogSoftmax keeps x for the last pass: the exponentials go to a tile of their own.
    exps = cg.sb_tile("exp", NUM_PARTITIONS, chunk, dtype) if log else data
    x_loc, y_loc = cg.dram(x_name).name, cg.dram(out_name).name
    # Rows on partitions: the outer rows when the softmax runs along the last dim, else the
    # inner positions of one outer row at a time.
    if inner == 1:
        loops, loop_stride, rows, row_stride = 1, 0, outer, length
    else:
        loops, loop_stride, rows, row_stride = outer, length * inner, inner, 1

    for o in tiles(cg, loops, 1, "o"):
        for r in tiles(cg, rows, NUM_PARTITIONS, "r"):

            def chunk_aps(piece, loc, r=r, o=o):
                dram = cg.dram_ap(
                    loc,
                    o.start * loop_stride + r.start * row_stride + piece.start * inner,
                    [(row_stride, r.size), (inner, piece.size)],
                )
                return dram, cg.ap(data, [(1, piece.size)], partitions=r.size)

            def partial_ap(piece, r=r):
                return cg.ap(partial, [(1, 1)], tile_index(piece, chunk), partitions=r.size)

            def column(tile, r=r):
                return cg.ap(tile, partitions=r.size)

            # Pass 1: the row max, negated, becomes ScalarE's bias.
            for piece in tiles(cg, length, chunk, "l"):
                dram, sb = chunk_aps(piece, x_loc)
                cg.dma(sb, dram)
                cg.tensor_reduce(partial_ap(piece), sb, AluOp.MAX, axes=1)
            cg.tensor_reduce(
                column(neg_max), cg.ap(partial, partitions=r.size), AluOp.MAX, axes=1, negate=True
            )
            # Pass 2: Σ exp(x − max). With one chunk the exponentials stay in SBUF.
            for piece in tiles(cg, length, chunk, "l"):
                dram, sb = chunk_aps(piece, x_loc)
                if chunks > 1:
                    cg.dma(sb, dram)
                ex = cg.ap(exps, [(1, piece.size)], partitions=r.size)
                cg.activation(ex, sb, ActFunc.EXP, bias=column(neg_max))
                cg.tensor_reduce(partial_ap(piece), ex, AluOp.ADD, axes=1)
            cg.tensor_reduce(column(total), cg.ap(partial, partitions=r.size), AluOp.ADD, axes=1)
            if log:
                cg.activation(column(total), column(total), ActFunc.LOG)
            # Pass 3: normalise and store.
            for piece in tiles(cg, length, chunk, "l"):
                dram_in, sb = chunk_aps(piece, x_loc)
                if chunks > 1:
                    cg.dma(sb, dram_in)
                if log:  # x + (−max) − log Σ
                    cg.tensor_scalar(
                        sb, sb, AluOp.ADD, column(neg_max), AluOp.SUBTRACT, column(total)
                    )
                    dram_out, _ = chunk_aps(piece, y_loc)
                    cg.dma(dram_out, sb)
                    continue
                if chunks > 1:
                    cg.activation(sb, sb, ActFunc.EXP, bias=column(neg_max))
                cg.tensor_scalar(sb, sb, AluOp.DIVIDE, column(total))
                dram_out, _ = chunk_aps(piece, y_loc)
                cg.dma(dram_out, sb)
