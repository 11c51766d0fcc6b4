"""Generic lowering of RotaryEmbedding (opset 23).

The input is read as [B, S, H, D] whatever its layout: a 4-D input is (B, H, S, D) and a 3-D
one (B, S, H·D) with the `num_heads` attribute, so only the DRAM strides of b, s and h differ.
Per batch, the positions s sit on partitions and a chunk of heads × D on the free dim; the
cos and sin rows of those positions ([S, R/2], R = rotary_embedding_dim) are loaded once per
tile and broadcast over the heads by a stride-0 access pattern. The rotated pair (x1, x2) is the
two halves of the first R elements of each head, or with `interleaved` its even and odd
elements; VectorE computes real = x1·cos − x2·sin and imag = x1·sin + x2·cos into two scratch
tiles and copies them back over x1 and x2, leaving elements R..D untouched, then one DMA writes
the tile out.

With `position_ids`, the cos and sin rows are first gathered from the caches ([max_pos, R/2])
by the engines' row gather (`lower_gather.gather_rows`) into DRAM scratch [B·S, R/2];
without, the caches are already [B, S, R/2].
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import ActFunc, AluOp
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.gather import gather_rows
from onnx2bir.codegen.tiling import tiles
from onnx2bir.graph import Node

ROW_ELEMENTS = 4096  # free elements of one x tile (a chunk of whole heads)


def lower_rotary_embedding(cg: BirCodeGen, node: Node) -> None:
    attrs = node.attrs
    inputs = list(node.inputs) + [""] * 4
    x, cos, sin, position_ids = inputs[:4]
    shape = tuple(cg.graph.tensors[x].shape)
    if len(shape) == 4:
        batch, heads, seq, head_size = shape
        b_stride, h_stride, s_stride = heads * seq * head_size, seq * head_size, head_size
    elif len(shape) == 3:
        heads = int(attrs.get("num_heads", 0))
        if heads <= 0 or shape[2] % heads:
            raise cg.fail(f"RotaryEmbedding on a 3-D input needs num_heads dividing {shape[2]}")
        batch, seq, head_size = shape[0], shape[1], shape[2] // heads
        b_stride, h_stride, s_stride = seq * shape[2], head_size, shape[2]
    else:
        raise cg.fail(f"RotaryEmbedding input of rank {len(shape)} (3 or 4)")
    rotary = int(attrs.get("rotary_embedding_dim", 0)) or head_size
    if rotary % 2 or rotary > head_size:
        raise cg.fail(f"RotaryEmbedding: rotary_embedding_dim {rotary} for heads of {head_size}")
    half = rotary // 2
    if batch * seq * heads * head_size == 0:
        return
    cache_shape = tuple(cg.graph.tensors[cos].shape)
    if cache_shape[-1] != half:
        raise cg.fail(f"RotaryEmbedding: cos_cache rows of {cache_shape[-1]}, expected {half}")
    if position_ids:
        cos_loc, sin_loc = gathered_tables(cg, cos, sin, position_ids, batch * seq)
    else:
        cos_loc, sin_loc = cg.dram(cos).name, cg.dram(sin).name
    layout = RotaryLayout(batch, seq, heads, head_size, b_stride, h_stride, s_stride)
    rotate(
        cg, layout, half, bool(attrs.get("interleaved", 0)), x, node.outputs[0],
        cos_loc, sin_loc, seq,
    )  # fmt: skip


def gathered_tables(
    cg: BirCodeGen, cos: str, sin: str, positions: str, picks: int
) -> tuple[str, str]:
    """DRAM scratch [picks, R/2] of the cos and sin cache rows ([max_pos, R/2]) named by the
    `picks` positions, gathered on the engines (`lower_gather.gather_rows`)."""
    max_pos, half = tuple(cg.graph.tensors[cos].shape)
    dtype = cg.graph.tensors[cos].dtype
    tables = []
    for tag, cache in (("cos", cos), ("sin", sin)):
        rows = cg.dram_scratch(f"{tag}_rows", (picks, half), dtype)
        gather_rows(cg, cache, 1, max_pos, half, positions, picks, [max_pos], 0, rows.name)
        tables.append(rows.name)
    return tables[0], tables[1]


@dataclass(frozen=True, slots=True)
class RotaryLayout:
    """An input read as [B, S, H, D]: its sizes and the DRAM strides (elements) of b, h, s."""

    batch: int
    seq: int
    heads: int
    head_size: int
    b_stride: int
    h_stride: int
    s_stride: int


def rotate(
    cg: BirCodeGen,
    layout: RotaryLayout,
    half: int,
    interleaved: bool,
    x: str,
    y: str,
    cos_loc: str,
    sin_loc: str,
    table_batch_rows: int,
) -> None:
    """y = x with the first 2·`half` elements of each head rotated by the cos and sin rows of
    its position; the rest of each head is copied. The tables are DRAM rows of `half`
    elements, the row of (b, s) at b·`table_batch_rows` + s (0: every batch shares the rows)."""
    batch, seq, heads, head_size = layout.batch, layout.seq, layout.heads, layout.head_size
    b_stride, h_stride, s_stride = layout.b_stride, layout.h_stride, layout.s_stride
    dtype = cg.graph.tensors[x].dtype
    # x1 and x2 inside one head: offset and stride of their `half` elements.
    (x1_off, x2_off), step = ((0, 1), 2) if interleaved else ((0, half), 1)
    chunk = max(1, min(heads, ROW_ELEMENTS // head_size))
    p = NUM_PARTITIONS
    data = cg.sb_tile("x", p, chunk * head_size, dtype)
    cos_sb, sin_sb = cg.sb_tile("cos", p, half, dtype), cg.sb_tile("sin", p, half, dtype)
    real, imag = (
        cg.sb_tile("real", p, chunk * half, dtype),
        cg.sb_tile("imag", p, chunk * half, dtype),
    )
    scratch = cg.sb_tile("product", p, chunk * half, dtype)
    x_loc, y_loc = cg.dram(x).name, cg.dram(y).name
    for b in tiles(cg, batch, 1, "b"):
        for s in tiles(cg, seq, p, "s"):
            rows = s.size
            row_start = b.start * (table_batch_rows * half) + s.start * half
            for table, tile in ((cos_loc, cos_sb), (sin_loc, sin_sb)):
                cg.dma(
                    cg.ap(tile, partitions=rows),
                    cg.dram_ap(table, row_start, [(half, rows), (1, half)]),
                )
            for h in tiles(cg, heads, chunk, "h"):
                offset = b.start * b_stride + s.start * s_stride + h.start * h_stride
                window = [(s_stride, rows), (h_stride, h.size), (1, head_size)]
                whole = cg.ap(data, [(head_size, h.size), (1, head_size)], partitions=rows)
                cg.dma(whole, cg.dram_ap(x_loc, offset, window))
                pair = [(head_size, h.size), (step, half)]
                x1 = cg.ap(data, pair, x1_off, partitions=rows)
                x2 = cg.ap(data, pair, x2_off, partitions=rows)
                flat = [(half, h.size), (1, half)]
                c = cg.ap(cos_sb, [(0, h.size), (1, half)], partitions=rows)
                sn = cg.ap(sin_sb, [(0, h.size), (1, half)], partitions=rows)
                re, im = cg.ap(real, flat, partitions=rows), cg.ap(imag, flat, partitions=rows)
                tmp = cg.ap(scratch, flat, partitions=rows)
                cg.tensor_tensor(re, x1, c, AluOp.MULTIPLY)
                cg.tensor_tensor(tmp, x2, sn, AluOp.MULTIPLY)
                cg.tensor_tensor(re, re, tmp, AluOp.SUBTRACT)
                cg.tensor_tensor(im, x1, sn, AluOp.MULTIPLY)
                cg.tensor_tensor(tmp, x2, c, AluOp.MULTIPLY)
                cg.tensor_tensor(im, im, tmp, AluOp.ADD)
                cg.activation(x1, re, ActFunc.COPY)
                cg.activation(x2, im, ActFunc.COPY)
                cg.dma(cg.dram_ap(y_loc, offset, window), whole)
