"""The training losses exported graphs keep: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.

Registered through `LOWERINGS`, which `onnx2bir.codegen.lower.GENERIC_LOWERINGS` merges.

Both take scores [N, C, d1, ...] and class indices [N, d1, ...] (int64 or int32); with
D = d1 · ... the positions (n, d) are the rows of the loss and the C classes the line each
picks from. SoftmaxCrossEntropyLoss is LogSoftmax over the class axis (the passes of
`lower.softmax`, into its `log_prob` output or a DRAM scratch) followed by the
NegativeLogLikelihoodLoss of that.

The NLL puts positions on partitions: when D < 128, whole batch items of D positions each
(a tile of ⌊128 / D⌋ items), else 128 positions of one item at a time; the class line of a
position is read with stride D. Per tile of positions:

- the targets are loaded into an fp32 column (exact below 2^24); `valid` = 1 − (t == ignore_index)
  (1 everywhere without the attribute);
- an Iota of class numbers compared with t is the one-hot mask; the weight of the class, when
  there is a weight input (its line broadcast to every partition), is Σ w · mask, else 1, times
  `valid`;
- the picked score is the inf-safe select of `gather_elements`, max_c min(x[c], ±inf) with
  +inf at the target only, so a −inf log-probability elsewhere costs nothing;
- loss = −picked · weight, and 0 where the position is ignored (a CopyPredicated: an ignored
  target outside [0, C) picks −inf, and −inf · 0 would be NaN).

Lines longer than SELECT_CHUNK classes are selected a chunk at a time, each leaving a partial
max (and weight sum). `reduction = none` stores the loss column at the positions' offsets
(the targets' layout). `sum` and `mean` add the loss and weight columns of every tile into a
running [128, 2] column pair, summed across partitions at the end by one matmul with a ones
column; `mean` divides the loss sum by the weight sum (the count of positions not ignored
without a weight input), as onnxruntime does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.lower.gather import SELECT_CHUNK
from onnx2bir.codegen.lower.logic import INF
from onnx2bir.codegen.lower.softmax import ROW_CHUNK, _emit_chunked, _emit_rows, _Rows
from onnx2bir.codegen.tiling import Affine, tiles
from onnx2bir.graph import Node

_REDUCTIONS = ("none", "sum", "mean")
_EXACT_CLASSES = 1 << 24  # class numbers and targets are compared in fp32


def lower_negative_log_likelihood_loss(cg: BirCodeGen, node: Node) -> None:
    shape = _check(cg, node)
    _emit_nll(cg, node, cg.dram(node.inputs[0]).name, shape)


def lower_softmax_cross_entropy_loss(cg: BirCodeGen, node: Node) -> None:
    """LogSoftmax over the class axis into `log_prob` (or a scratch), then its NLL."""
    shape = _check(cg, node)
    n, c, d = shape
    scores = node.inputs[0]
    log_prob = node.output(1)
    if log_prob:
        y = cg.dram(log_prob).name
    else:
        y = cg.dram_scratch("log_prob", tuple(cg.graph.tensors[scores].shape), Dtype.FP32).name
    if n * c * d:
        # Opset 13's LogSoftmax at axis 1: rows (n, d) of C elements with stride D.
        if d == 1:
            loops, loop_stride, rows, row_stride = 1, 0, n, c
        else:
            loops, loop_stride, rows, row_stride = n, c * d, d, 1
        dtype = cg.graph.tensors[scores].dtype
        spec = _Rows(
            cg.dram(scores).name, y, dtype, loops, loop_stride, rows, row_stride, c, d, True
        )
        (_emit_rows if c <= ROW_CHUNK else _emit_chunked)(cg, spec)
    _emit_nll(cg, node, y, shape)


def _check(cg: BirCodeGen, node: Node) -> tuple[int, int, int]:
    """(N, C, D) of the node's scores, after refusing what the lowering does not take."""
    tensors = cg.graph.tensors
    scores, target = node.inputs[0], node.inputs[1]
    shape = tuple(tensors[scores].shape)
    if len(shape) < 2:
        raise cg.fail(f"scores of rank {len(shape)}: the op takes [N, C] or [N, C, d1, ...]")
    if not all(isinstance(s, int) for s in shape):
        raise cg.fail(f"scores of shape {shape}: the shape must be static")
    if not tensors[scores].dtype.is_float:
        raise cg.fail(f"scores of dtype {tensors[scores].dtype}")
    if tensors[target].dtype not in (Dtype.INT64, Dtype.INT32):
        raise cg.fail(f"targets of dtype {tensors[target].dtype}: int64 or int32 expected")
    if tuple(tensors[target].shape) != (shape[0], *shape[2:]):
        raise cg.fail(
            f"targets of shape {tuple(tensors[target].shape)} for scores of shape {shape}"
        )
    weight = node.input(2)
    if weight and tuple(tensors[weight].shape) != (shape[1],):
        raise cg.fail(f"weight of shape {tuple(tensors[weight].shape)} for {shape[1]} classes")
    reduction = _reduction(node)
    if reduction not in _REDUCTIONS:
        raise cg.fail(f"reduction {reduction!r}: none, sum or mean expected")
    if shape[1] >= _EXACT_CLASSES:
        raise cg.fail(f"{shape[1]} classes: class numbers are compared in fp32 (below 2^24)")
    n, c, d = shape[0], shape[1], math.prod(shape[2:])
    if n * d == 0 and reduction != "none":
        raise cg.fail(f"a {reduction} over no positions (scores of shape {shape})")
    return n, c, d


def _reduction(node: Node) -> str:
    value = node.attr("reduction", "mean")
    return value.decode() if isinstance(value, bytes) else str(value)


def _emit_nll(cg: BirCodeGen, node: Node, x_loc: str, shape: tuple[int, int, int]) -> None:
    """The NLL of the log-probabilities at DRAM location `x_loc` (module docstring)."""
    n, c, d = shape
    if n * d * c == 0:
        return
    target, weight, out = node.inputs[1], node.input(2), node.outputs[0]
    reduction = _reduction(node)
    ignore_index = node.attr("ignore_index")
    t_loc, y_loc = cg.dram(target).name, cg.dram(out).name
    w_loc = cg.dram(weight).name if weight else None
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    chunk = min(c, SELECT_CHUNK)
    chunks = -(-c // chunk)

    ids = cg.sb_tile("ids", p, chunk, fp32)
    line = cg.sb_tile("line", p, chunk, fp32)
    mask = cg.sb_tile("mask", p, chunk, fp32)
    select = cg.sb_tile("select", p, chunk, fp32)
    weights = cg.sb_tile("weights", p, chunk, fp32) if weight else None
    picked = cg.sb_tile("picked", p, chunks, fp32)
    taken = cg.sb_tile("taken", p, chunks, fp32) if weight else None
    t_col = cg.sb_tile("target", p, 1, fp32)
    valid = cg.sb_tile("valid", p, 1, Dtype.INT32)
    pair = cg.sb_tile("loss", p, 2, fp32)  # the loss column and its weight column
    acc = None
    if reduction != "none":
        acc = cg.sb_tile("acc", p, 2, fp32)
        cg.memset(cg.ap(acc), 0.0)
    if chunks == 1:
        iota(cg, cg.ap(ids), 0, 0, [1])
        if weight:  # the weight line, the same on every partition, loaded once
            cg.dma(cg.ap(weights), cg.dram_ap(w_loc, Affine(), [(0, p), (1, c)]))

    def positions(body: Callable) -> None:
        """body(rows, x offset, x pattern of the rows, target offset) for every tile."""
        if d < p:
            items = p // d
            for t in tiles(cg, n, items, "n"):
                rows = [(c * d, t.size), (1, d)] if d > 1 else [(c, t.size)]
                body(t.size * d, t.start * (c * d), rows, t.start * d)
            return
        for o in tiles(cg, n, 1, "n"):
            for t in tiles(cg, d, p, "p"):
                body(t.size, o.start * (c * d) + t.start, [(1, t.size)], o.start * d + t.start)

    def tile_loss(size: int, x_off: Affine, rows: list, t_off: Affine) -> None:
        def col(tile, index: int = 0):
            return cg.ap(tile, [(1, 1)], index, partitions=size)

        def lane(tile, width: int):
            return cg.ap(tile, [(1, width)], partitions=size)

        target_col = col(t_col)
        cg.dma(target_col, cg.dram_ap(t_loc, t_off, [(1, size), (1, 1)]))
        valid_col = col(valid)
        if ignore_index is None:
            cg.memset(valid_col, 1)
        else:  # 1 − (t == ignore_index)
            cg.tensor_scalar(
                valid_col,
                target_col,
                AluOp.IS_EQUAL,
                float(ignore_index),
                AluOp.SUBTRACT,
                1.0,
                reverse1=True,
            )
        for number, first in enumerate(range(0, c, chunk)):
            width = min(chunk, c - first)
            ids_ap, mask_ap, select_ap = lane(ids, width), lane(mask, width), lane(select, width)
            if chunks > 1:
                iota(cg, ids_ap, first, 0, [1])
            cg.tensor_scalar(mask_ap, ids_ap, AluOp.IS_EQUAL, target_col)
            if weight:
                weights_ap = lane(weights, width)
                if chunks > 1:
                    cg.dma(weights_ap, cg.dram_ap(w_loc, Affine(first), [(0, size), (1, width)]))
                cg.tensor_tensor(select_ap, weights_ap, mask_ap, AluOp.MULTIPLY)
                cg.tensor_reduce(col(taken, number), select_ap, AluOp.ADD, axes=1)
            # ±inf: +inf at the target, −inf elsewhere; min with the line keeps x[t] alone.
            cg.tensor_scalar(select_ap, mask_ap, AluOp.SUBTRACT, 0.5, AluOp.MULTIPLY, INF)
            line_ap = lane(line, width)
            cg.dma(line_ap, cg.dram_ap(x_loc, x_off + first * d, [*rows, (d, width)]))
            cg.tensor_tensor(line_ap, line_ap, select_ap, AluOp.MIN)
            cg.tensor_reduce(col(picked, number), line_ap, AluOp.MAX, axes=1)
        pick, loss, applied = col(picked), col(pair, 0), col(pair, 1)
        if chunks > 1:
            cg.tensor_reduce(loss, lane(picked, chunks), AluOp.MAX, axes=1)
            pick = loss
            if weight:
                cg.tensor_reduce(applied, lane(taken, chunks), AluOp.ADD, axes=1)
        elif weight:
            cg.tensor_copy(applied, col(taken))
        if weight:
            cg.tensor_scalar(applied, applied, AluOp.MULTIPLY, valid_col)
        else:
            cg.tensor_copy(applied, valid_col)
        cg.tensor_scalar(loss, pick, AluOp.MULTIPLY, applied, AluOp.MULTIPLY, -1.0)
        cg.copy_predicated(loss, valid_col, 0.0, reverse=True)
        if acc is None:
            cg.dma(cg.dram_ap(y_loc, t_off, [(1, size), (1, 1)]), loss)
        else:
            both = lane(pair, 2)
            cg.tensor_tensor(lane(acc, 2), lane(acc, 2), both, AluOp.ADD)

    positions(tile_loss)
    if acc is None:
        return
    # Σ over partitions: ones[128, 1]ᵀ · acc[128, 2].
    ones = cg.sb_tile("ones", p, 1, fp32)
    cg.memset(cg.ap(ones), 1.0)
    total = cg.psum_tile("total", 1, 2)
    cg.matmul(cg.ap(total), cg.ap(ones), cg.ap(acc), accumulate=False)
    result = cg.sb_tile("result", 1, 2, fp32)
    cg.activation(cg.ap(result), cg.ap(total), ActFunc.COPY)
    first = cg.ap(result, [(1, 1)])
    if reduction == "mean":
        cg.tensor_tensor(first, first, cg.ap(result, [(1, 1)], 1), AluOp.DIVIDE)
    cg.dma(cg.dram_ap(y_loc, Affine(), [(1, 1), (1, 1)]), first)


LOWERINGS: dict[str, Callable] = {
    "NegativeLogLikelihoodLoss": lower_negative_log_likelihood_loss,
    "SoftmaxCrossEntropyLoss": lower_softmax_cross_entropy_loss,
}
