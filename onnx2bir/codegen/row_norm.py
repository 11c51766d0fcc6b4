"""Row statistics for the normalisations (Layer, Instance, Group, RMS): rows on partitions,
the normalised elements of a row on the free dim, y = (x − mean) · rstd with
rstd = 1 / sqrt(Σ (x − mean)² / D + ε), two passes over the row (the centred variance); RMS
normalisation does not centre: y = x · rsqrt(Σ x² / D + ε).

`StagedRows` keeps whole rows in SBUF (D ≤ ROW_CHUNK) for a group of row tiles at a time,
each tile's steps emitted by `row_groups.emit_skewed` (docs/row_loops.md), spread over the
engines:

0. x: its SBUF home, or a tile loaded by DMA;
1. the row sum, negated, times 1/D: −mean (GpSimd or VectorE: `pass_engine`);
2. (x − mean)², ScalarE's square with −mean as its per-partition bias;
3. Σ (x − mean)² (VectorE TensorReduce);
4. rstd = rsqrt(Σ / D + ε) (ScalarE, on a [P, 1] column; VectorE pow when ε < 2^-87 would let the
   argument leave rsqrt's range, `act_range.reciprocal_sqrt`);
5. y = (x + (−mean)) · rstd, one two-operand TensorScalar (ScalarE).

The caller then appends its affine step (GpSimd or VectorE: `pass_engine`) and the store. The
input is read straight from its SBUF home and y written straight into the output's when the
memory plan keeps them there (docs/memory_planner.md#direct-operands).

`ChunkedRows` handles longer rows one tile at a time, reading each chunk of ROW_CHUNK elements
once per pass.
"""

from __future__ import annotations

from collections.abc import Callable

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.act_range import reciprocal_sqrt
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.row_groups import EngineLoad, RowGroups, plan_groups
from onnx2bir.codegen.tiling import Affine, Tile, copy_stride, tile_index, tiles

ROW_CHUNK = 8192
# VectorE takes the sum of squares, ScalarE the squares and the scaling; the row sum and the
# callers' affine step go to GpSimd where it is not dearer than VectorE (`pass_engine`).
VARIANCE_ENGINE = Engine.DVE


def pass_engine(length: int, tensor_tensor: bool = False) -> Engine:
    """GpSimd or VectorE for a pass over rows of `length` elements: GpSimd when its cost is not
    above VectorE's. Its instructions cost 150 + N cycles at 1.4 GHz, VectorE's N at 1.12 GHz
    and 2N for a TensorTensor (docs/device_time.md#instruction-costs): GpSimd from about 600
    elements a partition for one input, from about 100 for a TensorTensor. Shorter rows stay
    on VectorE, where a lone tile's chain of steps is shorter."""
    gpsimd = EngineLoad.cost(Engine.POOL, length, tensor_tensor)
    return (
        Engine.POOL if gpsimd <= EngineLoad.cost(Engine.DVE, length, tensor_tensor) else Engine.DVE
    )


class RowTile:
    """One tile of rows of a group while its steps are emitted: its operands, `x` (the
    input's home or its loaded tile) once step 0 ran, `y` (the output's home or `y_tile`) once
    step 5 ran. A builder's state, filled in as the steps run."""

    __slots__ = ("x", "y", "x_view", "y_view", "y_tile", "square", "neg_mean", "rstd", "rows")

    def __init__(self, x_view, y_view, y_tile, square, neg_mean, rstd, rows: int) -> None:
        self.x: AccessPattern | None = None
        self.y: AccessPattern | None = None
        self.x_view, self.y_view, self.y_tile = x_view, y_view, y_tile
        self.square, self.neg_mean, self.rstd, self.rows = square, neg_mean, rstd, rows


# (x view, y view, rows) of one tile of a group: DRAM views of its input and output rows.
Views = Callable[[Tile], tuple[AccessPattern, AccessPattern, int]]
Step = Callable[[], None]


class StagedRows:
    """The per-copy buffers of a staged row normalisation over rows of `length` elements."""

    def __init__(
        self,
        cg: BirCodeGen,
        extent: int,
        size: int,
        length: int,
        eps: float,
        center: bool = True,
    ) -> None:
        """Buffers for `tiles(extent, size)` walked in groups (`row_groups(cg, self.plan)`),
        each tile `length` elements per partition; without `center`, step 1 is left out and
        the other steps use 0 for the mean (RMS normalisation)."""
        fp32 = Dtype.FP32
        self.cg, self.length, self.eps, self.center = cg, length, eps, center
        self.stride = copy_stride(length, fp32)
        copy_bytes = 2 * self.stride * fp32.itemsize + 2 * fp32.itemsize
        self.plan: RowGroups = plan_groups(cg, extent, size, copy_bytes)
        copies = self.plan.copies
        p = NUM_PARTITIONS
        self.data = cg.sb_tile("data", p, copies * self.stride, fp32)
        self.square = cg.sb_tile("square", p, copies * self.stride, fp32)
        self.neg_mean = cg.sb_tile("neg_mean", p, copies, fp32) if center else None
        self.rstd = cg.sb_tile("rstd", p, copies, fp32)

    def tile(self, tile: Tile, views: Views) -> RowTile:
        """The operands of one tile of a group (its copy of every buffer)."""
        cg, length = self.cg, self.length
        x_view, y_view, rows = views(tile)
        row = [(1, length)]
        return RowTile(
            x_view,
            y_view,
            # y_tile is the input's tile: when x was loaded into it, step 5 overwrites x in
            # place, elementwise, after its last other reader (step 2).
            cg.ap(self.data, row, tile.slot * self.stride, partitions=rows),
            cg.ap(self.square, row, tile.slot * self.stride, partitions=rows),
            cg.ap(self.neg_mean, [(1, 1)], tile.slot, partitions=rows) if self.center else None,
            cg.ap(self.rstd, [(1, 1)], tile.slot, partitions=rows),
            rows,
        )

    def steps(self, t: RowTile) -> list[Step]:
        """Steps 0 (load x, unless it is read from its home) to 5 of one tile."""
        cg, length = self.cg, self.length

        def load() -> None:
            t.x = cg.read_operand(t.y_tile, t.x_view)

        def mean() -> None:
            engine = pass_engine(length)
            cg.tensor_reduce(t.neg_mean, t.x, AluOp.ADD, 1, True, engine)
            cg.tensor_scalar(t.neg_mean, t.neg_mean, AluOp.MULTIPLY, 1.0 / length, engine=engine)

        def square() -> None:
            cg.activation(t.square, t.x, ActFunc.SQUARE, bias=t.neg_mean)  # no bias: RMS

        def variance() -> None:
            cg.tensor_reduce(t.rstd, t.square, AluOp.ADD, 1, engine=VARIANCE_ENGINE)

        def rstd() -> None:
            reciprocal_sqrt(cg, t.rstd, t.rstd, 1.0 / length, self.eps)

        def normalize() -> None:
            t.y = cg.write_operand(t.y_tile, t.y_view)
            if self.center:
                cg.tensor_scalar(
                    t.y, t.x, AluOp.ADD, t.neg_mean, AluOp.MULTIPLY, t.rstd, engine=Engine.ACT
                )
            else:
                cg.tensor_scalar(t.y, t.x, AluOp.MULTIPLY, t.rstd, engine=Engine.ACT)

        if not self.center:
            return [load, square, variance, rstd, normalize]
        return [load, mean, square, variance, rstd, normalize]

    def store(self, t: RowTile) -> Step:
        """The last step: copy out a result not written straight into the output's home."""
        return lambda: self.cg.store_result(t.y_view, t.y_tile, t.y)


class ChunkedRows:
    """Rows longer than ROW_CHUNK: one tile of rows at a time, each chunk read once per pass."""

    def __init__(self, cg: BirCodeGen, length: int, eps: float) -> None:
        p, fp32 = NUM_PARTITIONS, Dtype.FP32
        self.cg, self.length, self.eps = cg, length, eps
        self.chunk = min(length, ROW_CHUNK)
        self.chunks = -(-length // self.chunk)
        self.data = cg.sb_tile("data", p, self.chunk, fp32)
        self.square = cg.sb_tile("square", p, self.chunk, fp32)
        self.partial = cg.sb_tile("partial", p, self.chunks, fp32)
        self.neg_mean = cg.sb_tile("neg_mean", p, 1, fp32)
        self.rstd = cg.sb_tile("rstd", p, 1, fp32)

    def run(self, x: str, row_offset: Affine, rows: int, apply) -> None:
        """Normalise `rows` rows of x starting at `row_offset` (row stride = length); then
        `apply(centred tile, piece, rstd column)` for each chunk of the centred rows."""
        cg, length, chunk = self.cg, self.length, self.chunk

        def load(piece):
            tile = cg.ap(self.data, [(1, piece.size)], partitions=rows)
            cg.dma(tile, cg.dram_ap(x, row_offset + piece.start, [(length, rows), (1, piece.size)]))
            return tile

        def partial(piece):
            return cg.ap(self.partial, [(1, 1)], tile_index(piece, chunk), partitions=rows)

        neg_mean = cg.ap(self.neg_mean, partitions=rows)
        rstd = cg.ap(self.rstd, partitions=rows)
        partials = cg.ap(self.partial, partitions=rows)
        for piece in tiles(cg, length, chunk, "l"):
            cg.tensor_reduce(partial(piece), load(piece), AluOp.ADD, axes=1)
        cg.tensor_reduce(neg_mean, partials, AluOp.ADD, axes=1, negate=True)
        cg.tensor_scalar(neg_mean, neg_mean, AluOp.MULTIPLY, 1.0 / length)
        for piece in tiles(cg, length, chunk, "l"):
            tile = load(piece)
            cg.tensor_scalar(tile, tile, AluOp.ADD, neg_mean)
            square = cg.ap(self.square, [(1, piece.size)], partitions=rows)
            cg.activation(square, tile, ActFunc.SQUARE)
            cg.tensor_reduce(partial(piece), square, AluOp.ADD, axes=1)
        cg.tensor_reduce(rstd, partials, AluOp.ADD, axes=1)
        reciprocal_sqrt(cg, rstd, rstd, 1.0 / length, self.eps)
        for piece in tiles(cg, length, chunk, "l"):
            tile = load(piece)
            cg.tensor_scalar(tile, tile, AluOp.ADD, neg_mean)
            apply(tile, piece, rstd)
