"""Generic lowering of the index-driven ops: Trilu, CumSum and Range, built around Iota.

- Trilu: rows on partitions, columns on the free dim. The keep mask `j − i ≥ k` (upper) or
  `j − i ≤ k` (lower) is one TensorScalar on an Iota of column numbers, with the row number a
  per-partition column (an Iota `p + 128·t` per row tile) and k an immediate or, when k is a
  run-time input, a broadcast column. Floats select with the inf-safe min/max select against 0
  (a triu of a −inf matrix is the usual causal mask), integers multiply by the mask. Masks are
  built once per (row, column) tile and reused across the leading (batch) dims.
- CumSum, floats: a triangular-ones matmul on the PE array. The scanned axis goes on
  partitions in blocks of 128: `psum[l, c] = Σ_l' T[l', l] · x[l', c]` with T[l', l] = 1 for
  l' ≤ l (l' < l when exclusive), plus the carry of the earlier blocks, kept as a running
  column sum `ones[K, 1]ᵀ · x` in PSUM and broadcast back to every row by a matmul with a ones
  row. `reverse` reads and writes the axis through negative-stride DMAs.
- CumSum, integers: a sequential scan along the free dim, exact in int32 on GpSimd: one
  TensorTensor add per position, in a BIR loop, with a carry column across chunks.
- Range: `start + i · delta` from an Iota of i and one TensorScalar; start and delta are
  immediates when constant (integers stay exact), broadcast columns when run-time inputs.
  The output length must be static (the importer folds Range of constants entirely).
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import fill_exact, iota, scalar_op
from onnx2bir.codegen.lower.logic import INF
from onnx2bir.codegen.tiling import Affine, tile_index, tiles
from onnx2bir.graph import Node

FREE_TILE = 2048
SCAN_CHUNK = 4096


def scalar_operand(cg: BirCodeGen, name: str, tile, integer: bool) -> float | int | AccessPattern:
    """A scalar input as an immediate (constant) or a [128, 1] column broadcast by DMA."""
    info = cg.graph.tensors[name]
    if info.is_const:
        value = info.const.reshape(-1)[0]
        return int(value) if integer else float(value)
    column = cg.ap(tile)
    cg.dma(column, cg.dram_ap(cg.dram(name).name, Affine(), [(0, NUM_PARTITIONS), (1, 1)]))
    return column


def _rows(ap: AccessPattern, partitions: int) -> AccessPattern:
    return AccessPattern(ap.loc, ap.pattern, ap.offset, ap.offset_terms, 0, partitions)


def lower_trilu(cg: BirCodeGen, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x].shape)
    rows, cols = shape[-2:]
    batch = math.prod(shape[:-2])
    if batch * rows * cols == 0:
        return
    upper = bool(node.attr("upper", 1))
    dtype = cg.graph.tensors[x].dtype
    integer = not dtype.is_float
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    k: float | AccessPattern = 0.0
    if len(node.inputs) > 1 and node.inputs[1]:
        k = scalar_operand(cg, node.inputs[1], cg.sb_tile("k", p, 1, fp32), False)
    row_ids = cg.sb_tile("row_ids", p, -(-rows // p), fp32)
    iota(cg, cg.ap(row_ids), 0, 1, [p])
    width = min(cols, FREE_TILE)
    mask = cg.sb_tile("mask", p, width, Dtype.INT64 if integer else fp32)
    low = cg.sb_tile("low", p, width, fp32)
    data = cg.sb_tile("data", p, width, dtype)
    x_loc, y_loc = cg.dram(x).name, cg.dram(out).name
    for c0 in range(0, cols, width):  # unrolled: the column numbers are Iota immediates
        size = min(width, cols - c0)
        for r in tiles(cg, rows, p, "r"):
            keep = cg.ap(mask, [(1, size)], partitions=r.size)
            iota(cg, keep, c0, 0, [1])
            row = cg.ap(row_ids, [(1, 1)], tile_index(r, p), partitions=r.size)
            k_op = _rows(k, r.size) if isinstance(k, AccessPattern) else k
            cg.tensor_scalar(
                keep, keep, AluOp.SUBTRACT, row, AluOp.IS_GE if upper else AluOp.IS_LE, k_op
            )
            if not integer:  # keep → +inf / -inf bounds; low = min(-bound, 0)
                floor = cg.ap(low, [(1, size)], partitions=r.size)
                cg.tensor_scalar(floor, keep, AluOp.SUBTRACT, 0.5, AluOp.MULTIPLY, -INF)
                cg.tensor_scalar(floor, floor, AluOp.MIN, 0.0)
                cg.tensor_scalar(keep, keep, AluOp.SUBTRACT, 0.5, AluOp.MULTIPLY, INF)
            for b in tiles(cg, batch, 1, "b"):
                start = b.start * (rows * cols) + r.start * cols + c0
                pattern = [(cols, r.size), (1, size)]
                tile = cg.ap(data, [(1, size)], partitions=r.size)
                cg.dma(tile, cg.dram_ap(x_loc, start, pattern))
                if integer:
                    cg.tensor_tensor(tile, tile, keep, AluOp.MULTIPLY)
                else:
                    cg.tensor_tensor(tile, tile, keep, AluOp.MIN)
                    cg.tensor_tensor(
                        tile, tile, cg.ap(low, [(1, size)], partitions=r.size), AluOp.MAX
                    )
                cg.dma(cg.dram_ap(y_loc, start, pattern), tile)


def _cumsum_layout(shape: tuple[int, ...], axis: int) -> tuple[int, int, int, int, int, int]:
    """(loops, loop stride, length, axis stride, columns, column stride) of a scan."""
    outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    if inner == 1:
        return 1, 0, length, 1, outer, length
    return outer, length * inner, length, inner, inner, 1


def scan_axis(cg: BirCodeGen, node: Node) -> int:
    """The constant axis input of a CumSum/CumProd, made non-negative."""
    axis_info = cg.graph.tensors[node.inputs[1]]
    if not axis_info.is_const:
        raise cg.fail(f"the {node['op_type']} axis must be a constant")
    rank = len(cg.graph.tensors[node.inputs[0]].shape)
    return int(axis_info.const.reshape(-1)[0]) % rank


def lower_cumsum(cg: BirCodeGen, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x].shape)
    axis = scan_axis(cg, node)
    if math.prod(shape) == 0:
        return
    exclusive = bool(node.attr("exclusive", 0))
    reverse = bool(node.attr("reverse", 0))
    layout = _cumsum_layout(shape, axis)
    if cg.graph.tensors[x].dtype.is_float:
        _cumsum_pe(cg, cg.dram(x).name, cg.dram(out).name, layout, exclusive, reverse)
    else:
        _cumsum_dve(cg, cg.dram(x).name, cg.dram(out).name, layout, exclusive, reverse)


def _axis_walk(length: int, axis_stride: int, reverse: bool) -> tuple[int, int]:
    """(offset of position 0, stride) along the scanned axis, reversed if asked."""
    if reverse:
        return (length - 1) * axis_stride, -axis_stride
    return 0, axis_stride


def _cumsum_pe(cg, x_loc, y_loc, layout, exclusive: bool, reverse: bool) -> None:
    loops, loop_stride, length, axis_stride, columns, col_stride = layout
    base, step = _axis_walk(length, axis_stride, reverse)
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    tri = cg.sb_tile("triangle", p, p, fp32)
    iota(cg, cg.ap(tri), 0, 1, [-1])  # l' − l
    cg.tensor_scalar(cg.ap(tri), cg.ap(tri), AluOp.IS_LT if exclusive else AluOp.IS_LE, 0.0)
    ones = cg.sb_tile("ones", p, p, fp32)
    cg.memset(cg.ap(ones), 1.0)
    width = min(columns, MATMUL_MAX_MOVING_FREE)
    block = cg.sb_tile("block", p, width, fp32)
    carry_sb = cg.sb_tile("carry", 1, width, fp32)
    result = cg.sb_tile("result", p, width, fp32)
    acc = cg.psum_tile("acc", p, MATMUL_MAX_MOVING_FREE)
    carry = cg.psum_tile("carry", 1, MATMUL_MAX_MOVING_FREE)
    for o in tiles(cg, loops, 1, "o"):
        for c in tiles(cg, columns, width, "c"):
            carry_ps = cg.ap(carry, [(1, c.size)])
            for blk in tiles(cg, length, p, "l", peel_first=True):
                start = o.start * loop_stride + c.start * col_stride + base + blk.start * step
                pattern = [(step, blk.size), (col_stride, c.size)]
                data = cg.ap(block, [(1, c.size)], partitions=blk.size)
                cg.dma(data, cg.dram_ap(x_loc, start, pattern))
                psum = cg.ap(acc, [(1, c.size)], partitions=blk.size)
                cg.matmul(
                    psum, cg.ap(tri, [(1, blk.size)], partitions=blk.size), data, accumulate=False
                )
                if not blk.first:
                    cg.matmul(
                        psum,
                        cg.ap(ones, [(1, blk.size)], partitions=1),
                        cg.ap(carry_sb, [(1, c.size)]),
                        accumulate=True,
                    )
                if blk.size == p and length > p:  # a later block needs the running total
                    cg.matmul(
                        carry_ps,
                        cg.ap(ones, [(1, 1)], partitions=blk.size),
                        data,
                        accumulate=not blk.first,
                    )
                    cg.activation(cg.ap(carry_sb, [(1, c.size)]), carry_ps, ActFunc.COPY)
                res = cg.ap(result, [(1, c.size)], partitions=blk.size)
                cg.activation(res, psum, ActFunc.COPY)
                cg.dma(cg.dram_ap(y_loc, start, pattern), res)


def _cumsum_dve(
    cg,
    x_loc,
    y_loc,
    layout,
    exclusive: bool,
    reverse: bool,
    op: AluOp = AluOp.ADD,
    dtype: Dtype = Dtype.INT64,
) -> None:
    """The scan one column at a time on VectorE (a BIR loop along the axis): exact for integers;
    `op` MULTIPLY makes it CumProd's."""
    loops, loop_stride, length, axis_stride, columns, col_stride = layout
    base, step = _axis_walk(length, axis_stride, reverse)
    p, i64 = NUM_PARTITIONS, dtype
    chunk = min(length, SCAN_CHUNK)
    data = cg.sb_tile("data", p, chunk, i64)
    scan = cg.sb_tile("scan", p, chunk, i64)
    running = cg.sb_tile("running", p, 1, i64)
    start_value = 1 if op is AluOp.MULTIPLY else 0
    for o in tiles(cg, loops, 1, "o"):
        for r in tiles(cg, columns, p, "r"):
            run = cg.ap(running, partitions=r.size)

            def col(tile, index, r=r):
                offset = index if isinstance(index, Affine) else Affine(index)
                return cg.ap(tile, [(1, 1)], offset, partitions=r.size)

            for piece in tiles(cg, length, chunk, "l", peel_first=True):
                start = o.start * loop_stride + r.start * col_stride + base + piece.start * step
                pattern = [(col_stride, r.size), (step, piece.size)]
                cg.dma(
                    cg.ap(data, [(1, piece.size)], partitions=r.size),
                    cg.dram_ap(x_loc, start, pattern),
                )
                if piece.first:
                    fill_exact(cg, run, start_value, not dtype.is_float)
                if exclusive:
                    cg.tensor_copy(col(scan, 0), run)
                else:
                    cg.tensor_tensor(col(scan, 0), run, col(data, 0), op)
                if piece.size > 1:
                    with cg.loop("t", 1, piece.size) as t:
                        at = Affine.axis(t)
                        cg.tensor_tensor(
                            col(scan, at),
                            col(scan, at + -1),
                            col(data, at + -1 if exclusive else at),
                            op,
                        )
                last = piece.size - 1
                if exclusive:
                    cg.tensor_tensor(run, col(scan, last), col(data, last), op)
                else:
                    cg.tensor_copy(run, col(scan, last))
                cg.dma(
                    cg.dram_ap(y_loc, start, pattern),
                    cg.ap(scan, [(1, piece.size)], partitions=r.size),
                )


def lower_range(cg: BirCodeGen, node: Node) -> None:
    start_name, _, delta_name = node.inputs[:3]
    out = node.outputs[0]
    count = math.prod(cg.graph.tensors[out].shape)
    if count == 0:
        return
    dtype = cg.graph.tensors[out].dtype
    integer = not dtype.is_float
    p = NUM_PARTITIONS
    work = Dtype.INT64 if integer else Dtype.FP32
    start = scalar_operand(cg, start_name, cg.sb_tile("start", p, 1, work), integer)
    delta = scalar_operand(cg, delta_name, cg.sb_tile("delta", p, 1, work), integer)
    width = min(-(-count // p), 16 * FREE_TILE)
    values = cg.sb_tile("values", p, width, work)
    y_loc = cg.dram(out).name
    for first in range(0, count, p * width):  # unrolled: the Iota base is an immediate
        rows, rest = divmod(min(p * width, count - first), width)
        for block_rows, size, offset in ((rows, width, 0), (1 if rest else 0, rest, rows * width)):
            if not block_rows:
                continue
            tile = cg.ap(values, [(1, size)], partitions=block_rows)
            iota(cg, tile, first + offset, width, [1])
            scale, shift = (
                _rows(v, block_rows) if isinstance(v, AccessPattern) else v for v in (delta, start)
            )
            scalar_op(cg, tile, tile, integer, AluOp.MULTIPLY, scale, AluOp.ADD, shift)
            cg.dma(
                cg.dram_ap(y_loc, Affine(first + offset), [(width, block_rows), (1, size)]), tile
            )
