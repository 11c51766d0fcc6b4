"""Generic lowering of the Reduce ops on VectorE: Mean, Sum, Max, Min, Prod, L1, L2, SumSquare,
LogSum and LogSumExp.

Kept positions go on partitions (the last kept dim; earlier kept dims become loops), the
reduced dims on the free dims, read through strided DMAs. Neighbouring reduced dims that are
contiguous merge into runs. The innermost runs that fit in a chunk of REDUCE_CHUNK elements are
read whole, the run before them in pieces, and any earlier runs loop; each piece leaves a
partial result, and the partial results are reduced again. ReduceMean scales the sum by 1/n on
ScalarE. L1 and L2/SumSquare map each piece to |x| or x² first (ScalarE abs/square; VectorE
max(x, −x) and x·x on integers, exact), L2 finishes with √ (VectorE pow) and LogSum with ln
kept inside ScalarE's range (`act_range`: a sum may be 0 or past 2^64, rule ACT-RANGE).
LogSumExp runs the pieces twice: a max pass, then Σ exp(x − max) with −max as ScalarE's
per-partition bias, and ln(Σ) + max; Σ lies in [1, n], inside the range of ln.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2bir.bir.dtypes import on_chip
from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.opcodes import DMA_MAX_DIMS, NUM_PARTITIONS
from onnx2bir.codegen.act_range import natural_log, square_root
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import like, scalar_op
from onnx2bir.codegen.lower.fill import fill_tensor
from onnx2bir.codegen.tiling import Affine, contiguous_strides, tile_index, tiles
from onnx2bir.graph import Node

REDUCE_CHUNK = 8192
_OPS = {
    "ReduceMean": AluOp.ADD,
    "ReduceSum": AluOp.ADD,
    "ReduceMax": AluOp.MAX,
    "ReduceMin": AluOp.MIN,
    "ReduceProd": AluOp.MULTIPLY,
    "ReduceL1": AluOp.ADD,
    "ReduceL2": AluOp.ADD,
    "ReduceSumSquare": AluOp.ADD,
    "ReduceLogSum": AluOp.ADD,
    "ReduceLogSumExp": AluOp.ADD,
}


def _empty_value(op_type: str, dtype) -> float | int:
    """What a reduction of no elements is: 0 for sums, 1 for products, the lowest value for
    a max, the highest for a min, -inf for the log sums."""
    if op_type in ("ReduceMax", "ReduceMin"):
        low = op_type == "ReduceMax"
        if dtype.is_float:
            return -math.inf if low else math.inf
        if dtype.numpy == np.bool_:
            return 0 if low else 1
        info = np.iinfo(on_chip(dtype).numpy)
        return int(info.min if low else info.max)
    if op_type == "ReduceProd":
        return 1
    if op_type in ("ReduceLogSum", "ReduceLogSumExp"):
        return -math.inf
    return 0


def reduce_axes(cg: BirCodeGen, node: Node, rank: int) -> list[int]:
    attrs = node.attrs
    axes = attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        info = cg.graph.tensors[node.inputs[1]]
        if not info.is_const:
            raise cg.fail("the reduction axes must be a constant")
        axes = [int(a) for a in info.const.ravel()]
    if not axes:
        return [] if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def lower_reduce(cg: BirCodeGen, node: Node) -> None:
    op = _OPS[node.op_type]
    x_name, out_name = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x_name].shape)
    axes = reduce_axes(cg, node, len(shape))
    strides = contiguous_strides(shape)
    kept = [d for d in range(len(shape)) if d not in axes and shape[d] != 1]
    runs: list[tuple[int, int]] = []  # (stride, count) of the reduced dims, merged
    for d in axes:
        if runs and runs[-1][0] == strides[d] * shape[d]:
            runs[-1] = (strides[d], runs[-1][1] * shape[d])
        else:
            runs.append((strides[d], shape[d]))
    runs = runs or [(0, 1)]  # no axes (noop_with_empty_axes): each element reduces alone
    count = math.prod(shape[d] for d in axes)
    if count == 0:  # over an empty set: the reduction's identity (onnx's definition)
        fill_tensor(cg, out_name, _empty_value(node.op_type, cg.graph.tensors[out_name].dtype))
        return
    # Chunking: the innermost runs that fit in a chunk are read whole, the run before them in
    # pieces of `step`, the runs before that loop. Each piece leaves one partial result.
    split = len(runs) - 1
    while split > 0 and math.prod(c for _, c in runs[split:]) <= REDUCE_CHUNK:
        split -= 1
    inner = math.prod(c for _, c in runs[split + 1 :])
    if len(runs) - split > DMA_MAX_DIMS - 1:
        raise cg.fail(f"reading the reduced runs {runs} needs more than {DMA_MAX_DIMS} DMA dims")
    outer_runs, (chunk_stride, chunk_count) = runs[:split], runs[split]
    step = min(chunk_count, REDUCE_CHUNK // inner)
    pieces = -(-chunk_count // step)
    partials = math.prod(c for _, c in outer_runs) * pieces
    if partials > REDUCE_CHUNK:
        raise cg.fail(f"reducing {count} elements needs {partials} partial results")
    dtype = cg.graph.tensors[x_name].dtype
    x_loc, y_loc = cg.dram(x_name).name, cg.dram(out_name).name
    data = cg.sb_tile("data", NUM_PARTITIONS, step * inner, dtype)
    partial = cg.sb_tile("partial", NUM_PARTITIONS, partials, dtype)
    total = cg.sb_tile("total", NUM_PARTITIONS, 1, dtype)
    neg_max = cg.sb_tile("neg_max", NUM_PARTITIONS, 1, dtype)
    out_strides = contiguous_strides(tuple(shape[d] for d in kept))
    part_dim = kept[-1] if kept else None
    loop_dims = kept[:-1]

    op_type = node.op_type
    integer = not dtype.is_float
    aux = cg.sb_tile("aux", NUM_PARTITIONS, step * inner, dtype) if integer else None
    log_scratch = None
    if op_type == "ReduceLogSum":
        tags = ("exponent", "scaled", "special")
        log_scratch = [cg.sb_tile(tag, NUM_PARTITIONS, 1, Dtype.FP32) for tag in tags]
        in_range = cg.sb_tile("in_range", NUM_PARTITIONS, 1, Dtype.UINT8)

    def prepare(src) -> None:
        """The elementwise map before the reduction: |x|, x² (exact on integers)."""
        if op_type == "ReduceL1" and integer:
            negated = like(src, aux)
            scalar_op(cg, negated, src, True, AluOp.MULTIPLY, -1)
            cg.tensor_tensor(src, src, negated, AluOp.MAX)
        elif op_type == "ReduceL1":
            cg.activation(src, src, ActFunc.ABS)
        elif op_type in ("ReduceL2", "ReduceSumSquare") and integer:
            cg.tensor_tensor(src, src, src, AluOp.MULTIPLY)
        elif op_type in ("ReduceL2", "ReduceSumSquare"):
            cg.activation(src, src, ActFunc.SQUARE)

    def reduce_runs(p, x_off: Affine, slot: Affine, depth: int, op=op, prepare=prepare) -> None:
        """Partial results of the reduced runs from `depth` on, starting at `slot`."""
        if depth < len(outer_runs):
            stride, extent = outer_runs[depth]
            weight = math.prod(c for _, c in outer_runs[depth + 1 :]) * pieces
            for index in tiles(cg, extent, 1, "j"):
                reduce_runs(
                    p,
                    x_off + index.start * stride,
                    slot + index.start * weight,
                    depth + 1,
                    op,
                    prepare,
                )
            return
        for piece in tiles(cg, chunk_count, step, "l"):
            src = cg.ap(data, [(1, piece.size * inner)], partitions=p.size)
            cg.dma(
                src,
                cg.dram_ap(
                    x_loc,
                    x_off + piece.start * chunk_stride,
                    [(row_stride, p.size), (chunk_stride, piece.size), *runs[split + 1 :]],
                ),
            )
            prepare(src)
            cg.tensor_reduce(
                cg.ap(partial, [(1, 1)], slot + tile_index(piece, step), partitions=p.size),
                src,
                op,
                axes=1,
            )

    rows = shape[part_dim] if part_dim is not None else 1
    row_stride = strides[part_dim] if part_dim is not None else 0

    def walk(depth: int, x_off: Affine, y_off: Affine) -> None:
        if depth < len(loop_dims):
            d = loop_dims[depth]
            for index in tiles(cg, shape[d], 1, "i"):
                walk(
                    depth + 1,
                    x_off + index.start * strides[d],
                    y_off + index.start * out_strides[depth],
                )
            return
        for p in tiles(cg, rows, NUM_PARTITIONS, "p"):
            result = cg.ap(total, partitions=p.size)
            if op_type == "ReduceLogSumExp":
                # Stable: max first, then Σ exp(x − max) with −max as ScalarE's bias.
                shift = cg.ap(neg_max, partitions=p.size)
                reduce_runs(
                    p, x_off + p.start * row_stride, Affine(), 0, AluOp.MAX, lambda src: None
                )
                cg.tensor_reduce(
                    shift, cg.ap(partial, partitions=p.size), AluOp.MAX, axes=1, negate=True
                )
                reduce_runs(
                    p,
                    x_off + p.start * row_stride,
                    Affine(),
                    0,
                    AluOp.ADD,
                    lambda src, shift=shift: cg.activation(src, src, ActFunc.EXP, bias=shift),
                )
            else:
                reduce_runs(p, x_off + p.start * row_stride, Affine(), 0)
            cg.tensor_reduce(result, cg.ap(partial, partitions=p.size), op, axes=1)
            if op_type == "ReduceMean":
                cg.activation(result, result, ActFunc.COPY, scale=1.0 / count)
            elif op_type == "ReduceL2":
                square_root(cg, result, result)
            elif op_type == "ReduceLogSum":
                scratch = tuple(cg.ap(tile, partitions=p.size) for tile in log_scratch)
                natural_log(cg, result, result, scratch, cg.ap(in_range, partitions=p.size))
            elif op_type == "ReduceLogSumExp":
                cg.activation(result, result, ActFunc.LOG)
            if op_type == "ReduceLogSumExp":
                cg.tensor_scalar(result, result, AluOp.SUBTRACT, cg.ap(neg_max, partitions=p.size))
            cg.dma(cg.dram_ap(y_loc, y_off + p.start, [(1, p.size), (1, 1)]), result)

    walk(0, Affine(), Affine())
