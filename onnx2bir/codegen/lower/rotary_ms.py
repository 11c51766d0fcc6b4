"""Lowering of com.microsoft RotaryEmbedding (onnxruntime's contrib op,
docs/bir_codegen.md#vendor-ops).

Inputs (input, position_ids, cos_cache, sin_cache); output the shape of input. The input is
[B, S, hidden] (heads of `hidden / num_heads`) or [B, N, S, H]; the caches are [max_pos, R/2].
The head size is hidden / num_heads when `rotary_embedding_dim` is set (num_heads is then
required), else twice the cache row (and num_heads = hidden / head size); R defaults to the
head size. `position_ids` is [B, S], one position per token, or one element p0, the positions
then being p0 + s for every batch. `interleaved` rotates even and odd elements instead of the
two halves; elements R..H of each head are copied. `scale` only matters when onnxruntime
rebuilds caches that are too short, which it refuses on CPU, and `is_packed_batching` does not
change how a [B, S, ...] input is read: both are accepted and change nothing.

The cache rows of the positions are gathered on the engines into DRAM scratch: [B·S, R/2] for
[B, S] positions, [S, R/2] shared by the batches for p0 (its S positions p0 + s are made on
chip: an iota ramp plus p0), then the opset-23 lowering's `rotate` does the rotation, tile by
tile (`rotary.py`).
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import AluOp
from onnx2bir.bir.ir import Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.lower.rotary import RotaryLayout, gathered_tables, rotate
from onnx2bir.codegen.tiling import Affine
from onnx2bir.graph import Node

OP = "com.microsoft RotaryEmbedding"


def _layout(cg: BirCodeGen, shape: tuple[int, ...], attrs: dict, cache_row: int) -> RotaryLayout:
    num_heads = int(attrs.get("num_heads", 0))
    rotary = int(attrs.get("rotary_embedding_dim", 0))
    if len(shape) == 3:
        batch, seq, hidden = shape
    elif len(shape) == 4:
        batch, seq, hidden = shape[0], shape[2], shape[1] * shape[3]
    else:
        raise cg.fail(f"{OP}: input of rank {len(shape)} (3 or 4)")
    if rotary > 0:
        if num_heads <= 0 or hidden % num_heads:
            raise cg.fail(f"{OP}: rotary_embedding_dim needs num_heads dividing {hidden}")
        head_size = hidden // num_heads
    else:
        head_size = 2 * cache_row
        if head_size == 0 or hidden % head_size:
            raise cg.fail(f"{OP}: cache rows of {cache_row} do not split {hidden} into heads")
        num_heads = num_heads or hidden // head_size
        if num_heads * head_size != hidden:
            raise cg.fail(f"{OP}: {num_heads} heads of {head_size} for a hidden size {hidden}")
    if len(shape) == 4:
        if shape[1] != num_heads:
            raise cg.fail(f"{OP}: input [B, N, S, H] with N = {shape[1]}, num_heads {num_heads}")
        strides = (num_heads * seq * head_size, seq * head_size, head_size)
    else:
        strides = (seq * hidden, head_size, hidden)
    return RotaryLayout(batch, seq, num_heads, head_size, *strides)


def _offset_positions(cg: BirCodeGen, position_ids: str, seq: int) -> str:
    """DRAM scratch [S] (fp32) holding p0 + s for s < S, p0 the one element of position_ids."""
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    cols = -(-seq // p)
    rows = -(-seq // cols)
    ramp = cg.sb_tile("ramp", p, cols, fp32)
    start = cg.sb_tile("p0", p, 1, fp32)
    iota(cg, cg.ap(ramp, [(1, cols)], partitions=rows), 0, cols, [1])  # q·cols + c
    cg.dma(
        cg.ap(start, [(1, 1)], partitions=rows),
        cg.dram_ap(cg.dram(position_ids).name, Affine(), [(0, rows), (1, 1)]),
    )
    ramp_ap = cg.ap(ramp, [(1, cols)], partitions=rows)
    cg.tensor_tensor(ramp_ap, ramp_ap, cg.ap(start, [(0, cols)], partitions=rows), AluOp.ADD)
    positions = cg.dram_scratch("positions", (seq,), fp32)
    full = seq // cols  # rows holding `cols` positions; the last one may hold fewer
    if full:
        cg.dma(
            cg.dram_ap(positions.name, Affine(), [(cols, full), (1, cols)]),
            cg.ap(ramp, [(1, cols)], partitions=full),
        )
    if seq - full * cols:
        cg.dma(
            cg.dram_ap(positions.name, Affine(full * cols), [(1, 1), (1, seq - full * cols)]),
            cg.ap(ramp, [(1, seq - full * cols)], partitions=1, partition_start=full),
        )
    return positions.name


def lower_rotary_embedding_ms(cg: BirCodeGen, node: Node) -> None:
    attrs = node.attrs
    x, position_ids, cos, sin = (list(node.inputs) + [""] * 4)[:4]
    if not (x and position_ids and cos and sin):
        raise cg.fail(f"{OP} needs its four inputs (input, position_ids, cos_cache, sin_cache)")
    cache_shape = tuple(cg.graph.tensors[cos].shape)
    if len(cache_shape) != 2 or tuple(cg.graph.tensors[sin].shape) != cache_shape:
        raise cg.fail(f"{OP}: cos_cache and sin_cache must be the same [max_pos, R/2]")
    layout = _layout(cg, tuple(cg.graph.tensors[x].shape), attrs, cache_shape[1])
    rotary = int(attrs.get("rotary_embedding_dim", 0)) or layout.head_size
    if rotary % 2 or rotary > layout.head_size:
        raise cg.fail(f"{OP}: rotary_embedding_dim {rotary} for heads of {layout.head_size}")
    half = rotary // 2
    if cache_shape[1] != half:
        raise cg.fail(f"{OP}: cache rows of {cache_shape[1]}, expected R/2 = {half}")
    if layout.batch * layout.seq * layout.heads * layout.head_size == 0:
        return
    ids_shape = tuple(cg.graph.tensors[position_ids].shape)
    if math.prod(ids_shape) == 1 and len(ids_shape) <= 1:
        positions = _offset_positions(cg, position_ids, layout.seq)
        cos_loc, sin_loc = gathered_tables(cg, cos, sin, positions, layout.seq)
        table_batch_rows = 0  # every batch reads the same S rows
    elif ids_shape == (layout.batch, layout.seq):
        cos_loc, sin_loc = gathered_tables(cg, cos, sin, position_ids, layout.batch * layout.seq)
        table_batch_rows = layout.seq
    else:
        raise cg.fail(
            f"{OP}: position_ids of shape {list(ids_shape)}: one element or "
            f"[{layout.batch}, {layout.seq}]"
        )
    interleaved = bool(attrs.get("interleaved", 0))
    rotate(cg, layout, half, interleaved, x, node.outputs[0], cos_loc, sin_loc, table_batch_rows)
