"""Generic lowering of Softmax: the numerically stable exp(x − rowmax) / Σ exp(x − rowmax), and
of LogSoftmax: x − rowmax − log Σ exp(x − rowmax).

Opset < 13 flattens the input to 2-D at `axis` and normalises each row of the flattened view;
opset ≥ 13 normalises along `axis` alone. Either way the tensor becomes
[outer, length, inner] with the softmax over `length`: rows (outer · inner) go on partitions,
`length` on the free dim, read with stride `inner`.

Per tile of 128 rows: GpSimd (or VectorE) takes the negated row max, ScalarE computes
exp(x + (−max)) with the max as its per-partition bias, VectorE sums, and ScalarE (or VectorE)
divides (LogSoftmax: ScalarE takes the log of the sum, then x + (−max) − log Σ); the engines of
the max and of the last step balance the group's estimated load (`row_groups.EngineLoad`).
Up to four tiles go through each step before the next one, and their buffers rotate
(docs/row_loops.md), so the engines work on different tiles at once. The input is read
straight from its SBUF home and the result written straight into the output's when the memory
plan keeps them there (docs/memory_planner.md#direct-operands).

Rows longer than ROW_CHUNK are processed in chunks, one tile at a time: a pass for the max, a
pass for the sum, a pass to write the normalised values.

A Softmax that carries `NAN_ROW_FILL` (patterns/softmax_guard.py: the NaN guard
`Where(IsNaN(P), c, P)` exporters write after an attention's softmax) writes c over every row
whose result is NaN. Such a row is NaN whole: a NaN or +inf in the row, or a row of −inf,
makes its sum NaN, and every element is divided by it; any other row has a sum in [1, length]
and no NaN. So the row's test is one comparison of its sum with itself, and the fill one
CopyPredicated of the immediate c over the row, the test read with a zero stride.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.residency import preferred_group
from onnx2bir.codegen.row_groups import EngineLoad, emit_staged, plan_groups, row_groups
from onnx2bir.codegen.tiling import Tile, copy_stride, tile_index, tiles
from onnx2bir.graph import Node

ROW_CHUNK = 8192
NAN_ROW_FILL = "nan_row_fill"  # the value a NaN row of the result becomes (a fused NaN guard)


def lower_softmax(cg: BirCodeGen, node: Node) -> None:
    _emit_softmax(cg, node, log=False)


def lower_log_softmax(cg: BirCodeGen, node: Node) -> None:
    """x − max − log Σ exp(x − max): the same passes; the last subtracts instead of dividing."""
    _emit_softmax(cg, node, log=True)


@dataclass(frozen=True, slots=True)
class _Rows:
    """The softmax as rows: `loops` outer blocks of `rows` rows of `length` elements."""

    x: str  # DRAM view of the input
    y: str  # DRAM view of the output
    dtype: Dtype
    loops: int
    loop_stride: int
    rows: int
    row_stride: int
    length: int
    inner: int  # element stride along a row
    log: bool
    nan_fill: float | None = None  # NAN_ROW_FILL

    def view(self, loc: str, o, r, start: int = 0, size: int | None = None) -> tuple:
        """`dram_ap`'s (location, offset, pattern) for rows r (a tile) of loop block o,
        elements [start, start + size) of each row."""
        size = self.length if size is None else size
        offset = o.start * self.loop_stride + r.start * self.row_stride + start * self.inner
        return loc, offset, [(self.row_stride, r.size), (self.inner, size)]


def _emit_softmax(cg: BirCodeGen, node: Node, log: bool) -> None:
    x_name, out_name = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x_name].shape)
    rank = max(1, len(shape))
    default_axis = -1 if cg.graph.opset >= 13 else 1
    axis = node.attr("axis", default_axis) % rank
    if cg.graph.opset < 13:
        outer, length, inner = math.prod(shape[:axis]), math.prod(shape[axis:]), 1
    else:
        outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    if outer * length * inner == 0:
        return
    # Rows on partitions: the outer rows when the softmax runs along the last dim, else the
    # inner positions of one outer row at a time.
    group = preferred_group(cg.graph, x_name) if inner == 1 else 0
    if group and outer % group == 0:
        # The matrices of per-head scores one at a time, as their SBUF homes hold them
        # (docs/memory_planner.md#groups): no tile of rows straddles two heads.
        loops, loop_stride, rows, row_stride = outer // group, group * length, group, length
    elif inner == 1:
        loops, loop_stride, rows, row_stride = 1, 0, outer, length
    else:
        loops, loop_stride, rows, row_stride = outer, length * inner, inner, 1
    spec = _Rows(
        cg.dram(x_name).name,
        cg.dram(out_name).name,
        cg.graph.tensors[x_name].dtype,
        loops,
        loop_stride,
        rows,
        row_stride,
        length,
        inner,
        log,
        node.attr(NAN_ROW_FILL, None),
    )
    if length <= ROW_CHUNK:
        _emit_rows(cg, spec)
    else:
        _emit_chunked(cg, spec)


def _emit_rows(cg: BirCodeGen, spec: _Rows) -> None:
    """Whole rows in SBUF: max, exp, sum and normalise, a step at a time over a group of
    tiles (module docstring)."""
    dtype, length = spec.dtype, spec.length
    stride = copy_stride(length, dtype)
    # Per tile copy: the rows (LogSoftmax also the exponentials) and two columns.
    row_tiles = 2 if spec.log else 1
    copy_bytes = row_tiles * stride * dtype.itemsize + 2 * dtype.itemsize
    plan = plan_groups(cg, spec.rows, NUM_PARTITIONS, copy_bytes)
    copies = plan.copies
    data = cg.sb_tile("data", NUM_PARTITIONS, copies * stride, dtype)
    exps = cg.sb_tile("exp", NUM_PARTITIONS, copies * stride, dtype) if spec.log else data
    neg_max = cg.sb_tile("neg_max", NUM_PARTITIONS, copies, dtype)
    total = cg.sb_tile("sum", NUM_PARTITIONS, copies, dtype)
    fills = spec.nan_fill is not None
    finite = cg.sb_tile("finite", NUM_PARTITIONS, copies, Dtype.BOOL) if fills else None

    def steps(o: Tile, r: Tile, max_engine: Engine, last_engine: Engine) -> list:
        """Load, max, exp, sum, normalise and store one tile of rows."""
        tile = cg.ap(data, [(1, length)], r.slot * stride, partitions=r.size)
        exp = cg.ap(exps, [(1, length)], r.slot * stride, partitions=r.size)
        top = cg.ap(neg_max, [(1, 1)], r.slot, partitions=r.size)
        sigma = cg.ap(total, [(1, 1)], r.slot, partitions=r.size)
        x_view, y_view = (cg.dram_ap(*spec.view(loc, o, r)) for loc in (spec.x, spec.y))
        ops: dict[str, AccessPattern] = {}

        def load() -> None:
            ops["x"] = cg.read_operand(tile, x_view)

        def row_max() -> None:
            cg.tensor_reduce(top, ops["x"], AluOp.MAX, 1, True, max_engine)

        def exponentials() -> None:
            # Softmax computes in place in its result; LogSoftmax keeps x for the last step.
            ops["y"] = cg.write_operand(tile, y_view)
            ops["e"] = exp if spec.log else ops["y"]
            cg.activation(ops["e"], ops["x"], ActFunc.EXP, bias=top)

        def row_sum() -> None:
            cg.tensor_reduce(sigma, ops["e"], AluOp.ADD, axes=1)

        def normalise() -> None:
            if spec.log:  # x + (−max) − log Σ
                cg.activation(sigma, sigma, ActFunc.LOG)
                cg.tensor_scalar(
                    ops["y"], ops["x"], AluOp.ADD, top, AluOp.SUBTRACT, sigma, engine=last_engine
                )
            else:
                cg.tensor_scalar(ops["y"], ops["y"], AluOp.DIVIDE, sigma, engine=last_engine)
            if fills:
                ok = cg.ap(finite, [(1, 1)], r.slot, partitions=r.size)
                _fill_nan_rows(cg, ops["y"], sigma, ok, spec.nan_fill, length)

        def store() -> None:
            cg.store_result(y_view, tile, ops["y"])

        return [load, row_max, exponentials, row_sum, normalise, store]

    for o in tiles(cg, spec.loops, 1, "o"):
        for group in row_groups(cg, plan, "r"):
            engines = _engines(len(group), length, fills)
            emit_staged([steps(o, r, *pair) for r, pair in zip(group, engines, strict=True)])


def _fill_nan_rows(
    cg: BirCodeGen,
    rows: AccessPattern,
    sums: AccessPattern,
    ok: AccessPattern,
    fill: float,
    length: int,
) -> None:
    """In: a tile of normalised rows, their sums, a bool column. Out: `fill` over each row
    whose sum is NaN (then the whole row is NaN: module docstring)."""
    cg.tensor_tensor(ok, sums, sums, AluOp.IS_EQUAL)
    broadcast = AccessPattern(
        ok.loc, ((0, length),), ok.offset, ok.offset_terms, ok.partition_start, ok.num_partitions
    )
    cg.copy_predicated(rows, broadcast, fill, reverse=True)


def _engines(count: int, length: int, fills: bool = False) -> list[tuple[Engine, Engine]]:
    """(row max, last step) engines of each tile of a group: ScalarE has the exponentials and
    VectorE the sums (and the NaN rows' fills); each max goes to GpSimd or VectorE and each
    last step to ScalarE or VectorE, whichever `EngineLoad` finds first done with it."""
    load = EngineLoad()
    for _ in range(count):
        load.add(Engine.ACT, length)
        load.add(Engine.DVE, 2 * length if fills else length)
    return [
        (load.pick((Engine.POOL, Engine.DVE), length), load.pick((Engine.ACT, Engine.DVE), length))
        for _ in range(count)
    ]


def _emit_chunked(cg: BirCodeGen, spec: _Rows) -> None:
    """Rows longer than ROW_CHUNK: three passes over the chunks of one tile of rows."""
    dtype, length = spec.dtype, spec.length
    chunk = ROW_CHUNK
    chunks = -(-length // chunk)
    data = cg.sb_tile("data", NUM_PARTITIONS, chunk, dtype)
    partial = cg.sb_tile("partial", NUM_PARTITIONS, chunks, dtype)
    neg_max = cg.sb_tile("neg_max", NUM_PARTITIONS, 1, dtype)
    total = cg.sb_tile("sum", NUM_PARTITIONS, 1, dtype)
    # LogSoftmax keeps x for the last pass: the exponentials go to a tile of their own.
    exps = cg.sb_tile("exp", NUM_PARTITIONS, chunk, dtype) if spec.log else data

    for o in tiles(cg, spec.loops, 1, "o"):
        for r in tiles(cg, spec.rows, NUM_PARTITIONS, "r"):

            def chunk_aps(piece, loc, r=r, o=o):
                name, offset, pattern = spec.view(loc, o, r, piece.start, piece.size)
                return cg.dram_ap(name, offset, pattern), cg.ap(
                    data, [(1, piece.size)], partitions=r.size
                )

            def partial_ap(piece, r=r):
                return cg.ap(partial, [(1, 1)], tile_index(piece, chunk), partitions=r.size)

            def column(tile, r=r):
                return cg.ap(tile, partitions=r.size)

            # Pass 1: the row max, negated, becomes ScalarE's bias.
            for piece in tiles(cg, length, chunk, "l"):
                dram, sb = chunk_aps(piece, spec.x)
                cg.dma(sb, dram)
                cg.tensor_reduce(partial_ap(piece), sb, AluOp.MAX, axes=1)
            cg.tensor_reduce(
                column(neg_max), cg.ap(partial, partitions=r.size), AluOp.MAX, axes=1, negate=True
            )
            # Pass 2: Σ exp(x − max).
            for piece in tiles(cg, length, chunk, "l"):
                dram, sb = chunk_aps(piece, spec.x)
                cg.dma(sb, dram)
                ex = cg.ap(exps, [(1, piece.size)], partitions=r.size)
                cg.activation(ex, sb, ActFunc.EXP, bias=column(neg_max))
                cg.tensor_reduce(partial_ap(piece), ex, AluOp.ADD, axes=1)
            cg.tensor_reduce(column(total), cg.ap(partial, partitions=r.size), AluOp.ADD, axes=1)
            if spec.log:
                cg.activation(column(total), column(total), ActFunc.LOG)
            # Pass 3: normalise and store.
            for piece in tiles(cg, length, chunk, "l"):
                dram_in, sb = chunk_aps(piece, spec.x)
                cg.dma(sb, dram_in)
                if spec.log:  # x + (−max) − log Σ
                    cg.tensor_scalar(
                        sb, sb, AluOp.ADD, column(neg_max), AluOp.SUBTRACT, column(total)
                    )
                else:
                    cg.activation(sb, sb, ActFunc.EXP, bias=column(neg_max))
                    cg.tensor_scalar(sb, sb, AluOp.DIVIDE, column(total))
                dram_out, _ = chunk_aps(piece, spec.y)
                cg.dma(dram_out, sb)
