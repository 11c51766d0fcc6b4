"""Generic lowering of the normalisations: BatchNormalization (inference), LayerNormalization,
InstanceNormalization and LRN.

- BatchNormalization: channels on partitions. Per channel tile the per-channel constants fold
  into one scale and shift on [C, 1] columns — s = scale · rsqrt(var + ε) (ScalarE rsqrt with
  ε as its bias), t = B − mean · s (VectorE) — and each data tile [C, batch × pixels] is one
  TensorScalar `x · s + t` with the columns as per-partition operands.
- LayerNormalization / InstanceNormalization: rows on partitions (LN: every position before
  `axis`; IN: the channels of one image), the normalised elements on the free dim, the
  statistics and `(x − mean) · rstd` from `codegen/row_norm.py` (a group of row tiles at a
  time, the steps spread over GpSimd, ScalarE and VectorE, docs/row_loops.md). Then the affine
  step (GpSimd where it is not dearer than VectorE): LN multiplies by the scale and adds the
  bias, vectors along the free dim made once for every partition: loaded onto one partition
  and copied down the others on the PE array into PSUM, which VectorE then reads (for fp32
  constants without negative zeros, as `elementwise_walk._row_on_pe` does for a bias row),
  else broadcast by a stride-0 DMA that moves the vector once per partition; IN's are
  per-channel columns. Rows longer than ROW_CHUNK are read in chunks, once per
  pass, one tile at a time.
- LRN: the window sum across channels is a matmul with a band matrix (ones where
  |c' − c| is inside the window, built with Iota and two comparisons):
  `psum[c, px] = Σ_c' band[c', c] · x[c', px]²`. ScalarE reads PSUM to compute
  ln(bias + α/size · Σ) and exp(−β · that), VectorE multiplies by x.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.act_range import reciprocal_sqrt
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.elementwise_walk import PE_BROADCAST_ELEMENTS, copy_row_down, pe_copyable
from onnx2bir.codegen.lower.data import copy_strided
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.row_groups import emit_skewed, row_groups
from onnx2bir.codegen.row_norm import ROW_CHUNK, ChunkedRows, StagedRows, pass_engine
from onnx2bir.codegen.tiling import Affine, Tile, broadcast_strides, contiguous_strides, tiles
from onnx2bir.graph import Node

FREE_TILE = 4096


def lower_batch_norm(cg: BirCodeGen, node: Node) -> None:
    if node.attr("training_mode", 0) or any(node.outputs[1:]):
        raise cg.fail("BatchNormalization in training mode is not supported (inference only)")
    x, scale, bias, mean, var = node.inputs[:5]
    shape = tuple(cg.graph.tensors[x].shape)
    batch, channels = shape[0], shape[1] if len(shape) > 1 else 1
    pixels = math.prod(shape[2:])
    eps = float(node.attr("epsilon", 1e-5))
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    cols = {
        name: cg.sb_tile(tag, p, 1, fp32)
        for tag, name in (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))
    }
    shift = cg.sb_tile("shift", p, 1, fp32)
    width = min(pixels, FREE_TILE)
    images = max(1, min(batch, FREE_TILE // width)) if width == pixels else 1
    data = cg.sb_tile("data", p, images * width, fp32)
    x_loc, y_loc = cg.dram(x).name, cg.dram(node.outputs[0]).name
    for c in tiles(cg, channels, p, "c"):
        col = {name: cg.ap(tile, partitions=c.size) for name, tile in cols.items()}
        for name in col:
            cg.dma(col[name], cg.dram_ap(cg.dram(name).name, c.start, [(1, c.size), (1, 1)]))
        factor, offset = col[var], cg.ap(shift, partitions=c.size)
        reciprocal_sqrt(cg, factor, col[var], 1.0, eps)
        cg.tensor_tensor(factor, factor, col[scale], AluOp.MULTIPLY)
        cg.tensor_tensor(offset, col[mean], factor, AluOp.MULTIPLY)
        cg.tensor_tensor(offset, col[bias], offset, AluOp.SUBTRACT)
        for n in tiles(cg, batch, images, "n"):
            for s in tiles(cg, pixels, width, "s"):
                start = n.start * (channels * pixels) + c.start * pixels + s.start
                pattern = [(pixels, c.size), (channels * pixels, n.size), (1, s.size)]
                tile = cg.ap(data, [(1, n.size * s.size)], partitions=c.size)
                cg.dma(tile, cg.dram_ap(x_loc, start, pattern))
                cg.tensor_scalar(tile, tile, AluOp.MULTIPLY, factor, AluOp.ADD, offset)
                cg.dma(cg.dram_ap(y_loc, start, pattern), tile)


def _dense_vector(cg: BirCodeGen, name: str, shape: tuple[int, ...]) -> str:
    """A DRAM location holding `name` broadcast to `shape`, contiguous (a copy if needed)."""
    own = tuple(cg.graph.tensors[name].shape)
    loc = cg.dram(name).name
    if tuple((1,) * (len(shape) - len(own)) + own) == shape:
        return loc
    dense = cg.dram_scratch(f"{name}.dense", shape, cg.dram(name).dtype)
    copy_strided(
        cg,
        dense.name,
        Affine(),
        loc,
        Affine(),
        shape,
        contiguous_strides(shape),
        broadcast_strides(own, shape),
    )
    return dense.name


def lower_layer_norm(cg: BirCodeGen, node: Node) -> None:
    x, scale = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    shape = tuple(cg.graph.tensors[x].shape)
    axis = int(node.attr("axis", -1)) % len(shape)
    rows, length = math.prod(shape[:axis]), math.prod(shape[axis:])
    if rows * length == 0:
        return
    eps = float(node.attr("epsilon", 1e-5))
    outputs = [node.output(i) for i in range(3)]
    vectors = {
        tag: _dense_vector(cg, name, shape[axis:])
        for tag, name in (("scale", scale), ("bias", bias))
        if name
    }
    if length > ROW_CHUNK:
        _layer_norm_chunked(cg, x, rows, length, eps, vectors, outputs)
        return
    # The same scale and bias rows serve every row tile: made once, on every partition.
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    on_pe = _vectors_on_pe(cg, [name for name in (scale, bias) if name], length)
    rows_of = {}
    ones = None
    for tag, loc in vectors.items():
        if on_pe:
            if ones is None:
                ones = cg.sb_tile("ones", 1, p, fp32)
                cg.memset(cg.ap(ones), 1.0)
            rows_of[tag] = _vector_down_partitions(cg, tag, loc, length, ones)
            continue
        tile = cg.sb_tile(tag, p, length, fp32)
        cg.dma(cg.ap(tile, [(1, length)]), cg.dram_ap(loc, Affine(), [(0, p), (1, length)]))
        rows_of[tag] = tile
    norm = StagedRows(cg, rows, p, length, eps)
    stat = cg.sb_tile("stat", p, norm.plan.copies, fp32) if outputs[1] else None
    x_loc, y_loc = cg.dram(x).name, cg.dram(outputs[0]).name

    def views(r: Tile):
        pattern = [(length, r.size), (1, length)]
        start = r.start * length
        return cg.dram_ap(x_loc, start, pattern), cg.dram_ap(y_loc, start, pattern), r.size

    out_mean, out_rstd = (cg.dram(name).name if name else "" for name in outputs[1:3])
    # GpSimd cannot read PSUM: vectors made on the PE array are applied by VectorE.
    engine = Engine.DVE if on_pe else pass_engine(length, tensor_tensor=True)

    def tile_steps(r: Tile) -> list:
        t = norm.tile(r, views)
        steps = norm.steps(t)
        for tag, op in (("scale", AluOp.MULTIPLY), ("bias", AluOp.ADD)):
            if tag in rows_of:
                vector = cg.ap(rows_of[tag], [(1, length)], partitions=t.rows)
                steps.append(
                    lambda v=vector, op=op: cg.tensor_tensor(t.y, t.y, v, op, engine=engine)
                )
        steps.append(norm.store(t))
        column = [(1, r.size), (1, 1)]
        if stat is not None:
            mean = cg.ap(stat, [(1, 1)], r.slot, partitions=r.size)

            def store_mean() -> None:
                cg.tensor_scalar(mean, t.neg_mean, AluOp.MULTIPLY, -1.0)
                cg.dma(cg.dram_ap(out_mean, r.start, column), mean)

            steps.append(store_mean)
        if out_rstd:
            steps.append(lambda: cg.dma(cg.dram_ap(out_rstd, r.start, column), t.rstd))
        return steps

    for group in row_groups(cg, norm.plan, "r"):
        emit_skewed([tile_steps(r) for r in group])


def _vectors_on_pe(cg: BirCodeGen, names: list[str], length: int) -> bool:
    """Whether LN's scale and bias rows are made on the PE array (`_vector_down_partitions`):
    rows of 128 elements or more (`PE_BROADCAST_ELEMENTS` on the partitions, as for a bias
    row; a shorter row's broadcast DMA is small), `pe_copyable` constants and PSUM banks for
    both."""
    if NUM_PARTITIONS * length < PE_BROADCAST_ELEMENTS:
        return False
    if not all(pe_copyable(cg.graph.tensors[name]) for name in names):
        return False
    banks = -(-length // MATMUL_MAX_MOVING_FREE)
    return bool(names) and len(names) * banks <= cg.psum_free_banks()


def _vector_down_partitions(cg: BirCodeGen, tag: str, loc: str, length: int, ones):
    """The vector at `loc` on every partition, in PSUM: loaded once onto one partition (one
    small DMA, not one copy per partition), then copied down the others on the PE array
    (`elementwise_walk.copy_row_down`)."""
    fp32 = Dtype.FP32
    row = cg.sb_tile(f"{tag}_row", 1, length, fp32)
    cg.dma(cg.ap(row, [(1, length)], partitions=1), cg.dram_ap(loc, Affine(), [(1, length)]))
    psum = cg.psum_tile(tag, NUM_PARTITIONS, length)
    copy_row_down(cg, psum, ones, row, NUM_PARTITIONS, length)
    return psum


def _layer_norm_chunked(
    cg: BirCodeGen, x: str, rows: int, length: int, eps: float, vectors: dict, outputs: list
) -> None:
    """Rows longer than ROW_CHUNK: one tile of rows at a time, chunk by chunk."""
    norm = ChunkedRows(cg, length, eps)
    tiles_of = {
        tag: (loc, cg.sb_tile(tag, NUM_PARTITIONS, norm.chunk, Dtype.FP32))
        for tag, loc in vectors.items()
    }

    def load_vector(tag: str, piece, partitions: int):
        loc, tile = tiles_of[tag]
        ap = cg.ap(tile, [(1, piece.size)], partitions=partitions)
        cg.dma(ap, cg.dram_ap(loc, piece.start, [(0, partitions), (1, piece.size)]))
        return ap

    y_loc = cg.dram(outputs[0]).name
    stat = cg.sb_tile("stat", NUM_PARTITIONS, 1, Dtype.FP32)
    for r in tiles(cg, rows, NUM_PARTITIONS, "r"):

        def apply(tile, piece, rstd, r=r):
            cg.tensor_scalar(tile, tile, AluOp.MULTIPLY, rstd)
            for tag, op in (("scale", AluOp.MULTIPLY), ("bias", AluOp.ADD)):
                if tag in tiles_of:
                    cg.tensor_tensor(tile, tile, load_vector(tag, piece, r.size), op)
            cg.dma(
                cg.dram_ap(
                    y_loc, r.start * length + piece.start, [(length, r.size), (1, piece.size)]
                ),
                tile,
            )

        norm.run(cg.dram(x).name, r.start * length, r.size, apply)
        if outputs[1]:
            mean = cg.ap(stat, partitions=r.size)
            cg.tensor_scalar(mean, cg.ap(norm.neg_mean, partitions=r.size), AluOp.MULTIPLY, -1.0)
            cg.dma(cg.dram_ap(cg.dram(outputs[1]).name, r.start, [(1, r.size), (1, 1)]), mean)
        if outputs[2]:
            cg.dma(
                cg.dram_ap(cg.dram(outputs[2]).name, r.start, [(1, r.size), (1, 1)]),
                cg.ap(norm.rstd, partitions=r.size),
            )


def lower_instance_norm(cg: BirCodeGen, node: Node) -> None:
    x, scale, bias = node.inputs[:3]
    shape = tuple(cg.graph.tensors[x].shape)
    batch, channels, pixels = shape[0], shape[1], math.prod(shape[2:])
    if batch * channels * pixels == 0:
        return
    eps = float(node.attr("epsilon", 1e-5))
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    gamma, beta = (cg.sb_tile(tag, p, 1, fp32) for tag in ("scale", "bias"))
    x_loc, y_loc = cg.dram(x).name, cg.dram(node.outputs[0]).name
    if pixels > ROW_CHUNK:
        _instance_norm_chunked(cg, node, (batch, channels, pixels), eps, gamma, beta)
        return
    # Rows: the channels of one image; the images of a channel tile are the tiles of a group.
    norm = StagedRows(cg, batch, 1, pixels, eps)
    engine = pass_engine(pixels)
    for c in tiles(cg, channels, p, "c"):
        g, b = cg.ap(gamma, partitions=c.size), cg.ap(beta, partitions=c.size)
        for column, name in ((g, scale), (b, bias)):
            cg.dma(column, cg.dram_ap(cg.dram(name).name, c.start, [(1, c.size), (1, 1)]))

        def views(n: Tile, c=c):
            start = (n.start * channels + c.start) * pixels
            pattern = [(pixels, c.size), (1, pixels)]
            return cg.dram_ap(x_loc, start, pattern), cg.dram_ap(y_loc, start, pattern), c.size

        def tile_steps(n: Tile, views=views, g=g, b=b) -> list:
            t = norm.tile(n, views)

            def affine() -> None:
                cg.tensor_scalar(t.y, t.y, AluOp.MULTIPLY, g, AluOp.ADD, b, engine=engine)

            return [*norm.steps(t), affine, norm.store(t)]

        for group in row_groups(cg, norm.plan, "n"):
            emit_skewed([tile_steps(n) for n in group])


def _instance_norm_chunked(
    cg: BirCodeGen, node: Node, dims: tuple[int, int, int], eps: float, gamma, beta
) -> None:
    """Planes longer than ROW_CHUNK: one channel tile of one image at a time."""
    x, scale, bias = node.inputs[:3]
    batch, channels, pixels = dims
    norm = ChunkedRows(cg, pixels, eps)
    factor = cg.sb_tile("factor", NUM_PARTITIONS, 1, Dtype.FP32)
    y_loc = cg.dram(node.outputs[0]).name
    for c in tiles(cg, channels, NUM_PARTITIONS, "c"):
        columns = [cg.ap(tile, partitions=c.size) for tile in (gamma, beta, factor)]
        for column, name in ((columns[0], scale), (columns[1], bias)):
            cg.dma(column, cg.dram_ap(cg.dram(name).name, c.start, [(1, c.size), (1, 1)]))
        for n in tiles(cg, batch, 1, "n"):
            first_row = n.start * channels + c.start

            def apply(tile, piece, rstd, c=c, columns=columns, first_row=first_row):
                g, b, f = columns
                cg.tensor_tensor(f, g, rstd, AluOp.MULTIPLY)
                cg.tensor_scalar(tile, tile, AluOp.MULTIPLY, f, AluOp.ADD, b)
                cg.dma(
                    cg.dram_ap(
                        y_loc, first_row * pixels + piece.start, [(pixels, c.size), (1, piece.size)]
                    ),
                    tile,
                )

            norm.run(cg.dram(x).name, first_row * pixels, c.size, apply)


def lower_lrn(cg: BirCodeGen, node: Node) -> None:
    attrs = node.attrs
    size = int(attrs["size"])
    alpha, beta = float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75))
    bias = float(attrs.get("bias", 1.0))
    x = node.inputs[0]
    shape = tuple(cg.graph.tensors[x].shape)
    batch, channels, pixels = shape[0], shape[1], math.prod(shape[2:])
    before, after = (size - 1) // 2, -(-(size - 1) // 2)
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    c_tiles = [(start, min(p, channels - start)) for start in range(0, channels, p)]
    # Band blocks band[c', c] = 1 where −before ≤ c' − c ≤ after, for each (K, M) tile pair.
    pairs = [
        (k, m)
        for m in range(len(c_tiles))
        for k in range(len(c_tiles))
        if c_tiles[k][0] <= c_tiles[m][0] + c_tiles[m][1] - 1 + after
        and c_tiles[k][0] + c_tiles[k][1] - 1 >= c_tiles[m][0] - before
    ]
    band = cg.sb_tile("band", p, len(pairs) * p, fp32)
    scratch = cg.sb_tile("band_scratch", p, p, fp32)
    blocks = {}
    for index, (k, m) in enumerate(pairs):
        (k0, k_size), (m0, m_size) = c_tiles[k], c_tiles[m]
        block = cg.ap(band, [(1, m_size)], index * p, partitions=k_size)
        lower = cg.ap(scratch, [(1, m_size)], partitions=k_size)
        iota(cg, block, k0 - m0, 1, [-1])  # c' − c
        cg.tensor_scalar(lower, block, AluOp.IS_GE, float(-before))
        cg.tensor_scalar(block, block, AluOp.IS_LE, float(after))
        cg.tensor_tensor(block, block, lower, AluOp.MULTIPLY)
        blocks.setdefault(m, []).append((k, block))
    cols = min(pixels, MATMUL_MAX_MOVING_FREE)
    data = cg.sb_tile("data", p, len(c_tiles) * cols, fp32)
    squares = cg.sb_tile("squares", p, len(c_tiles) * cols, fp32)
    factor = cg.sb_tile("factor", p, cols, fp32)
    acc = cg.psum_tile("acc", p, MATMUL_MAX_MOVING_FREE)
    x_loc, y_loc = cg.dram(x).name, cg.dram(node.outputs[0]).name
    for n in tiles(cg, batch, 1, "n"):
        for s in tiles(cg, pixels, cols, "s"):

            def tile_of(loc, index, s=s):
                return cg.ap(loc, [(1, s.size)], index * cols, partitions=c_tiles[index][1])

            def dram_of(loc, index, n=n, s=s):
                start = n.start * (channels * pixels) + c_tiles[index][0] * pixels + s.start
                return cg.dram_ap(loc, start, [(pixels, c_tiles[index][1]), (1, s.size)])

            for index in range(len(c_tiles)):
                cg.dma(tile_of(data, index), dram_of(x_loc, index))
                cg.activation(tile_of(squares, index), tile_of(data, index), ActFunc.SQUARE)
            for m, (_, m_size) in enumerate(c_tiles):
                psum = cg.ap(acc, [(1, s.size)], partitions=m_size)
                for number, (k, block) in enumerate(blocks[m]):
                    cg.matmul(psum, block, tile_of(squares, k), accumulate=number > 0)
                out = cg.ap(factor, [(1, s.size)], partitions=m_size)
                cg.activation(out, psum, ActFunc.LOG, scale=alpha / size, bias_value=bias)
                cg.activation(out, out, ActFunc.EXP, scale=-beta)
                cg.tensor_tensor(out, tile_of(data, m), out, AluOp.MULTIPLY)
                cg.dma(dram_of(y_loc, m), out)
