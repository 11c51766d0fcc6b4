"""Generic lowering of pure data movement: DMA between DRAM tensors, no engine work.

A reshape of a contiguous tensor keeps every element where it is, so Reshape, Flatten,
Squeeze, Unsqueeze, Identity and inference-mode Dropout are one DRAM→DRAM copy. Concat
writes each input into its slice of the output with one strided DMA.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.opcodes import DMA_MAX_DIMS, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.matmul_tiles import BANK_FP32
from onnx2bir.codegen.tiling import (
    Affine,
    contiguous_strides,
    merge_broadcast_dims,
    rotating_nested_loops,
    tile_count,
    tiles,
)
from onnx2bir.graph import Node

# One DMA descriptor chain moves at most this many elements; bigger copies are split.
DMA_CHUNK = 1 << 20


def copy_dram(cg: BirCodeGen, dst: str, src: str, count: int) -> None:
    for start in range(0, count, DMA_CHUNK):
        size = min(DMA_CHUNK, count - start)
        cg.dma(
            cg.dram_ap(dst, Affine(start), [(1, size)]), cg.dram_ap(src, Affine(start), [(1, size)])
        )


def lower_copy(cg: BirCodeGen, node: Node) -> None:
    """Same elements, same order, new shape: a contiguous copy."""
    if node.op_type == "Dropout":
        if len(node.outputs) > 1 and node.outputs[1]:
            raise cg.fail("Dropout's mask output is not supported (inference only)")
        training = node.inputs[2] if len(node.inputs) > 2 else ""
        ratio = node.inputs[1] if len(node.inputs) > 1 else ""
        drops = (
            not ratio
            or not cg.graph.tensors[ratio].is_const
            or bool(cg.graph.tensors[ratio].const.reshape(-1)[0])
        )
        if training and drops:
            info = cg.graph.tensors[training]
            if not info.is_const or bool(info.const.reshape(-1)[0]):
                raise cg.fail("Dropout in training mode is not supported (inference only)")
    src, out = node.inputs[0], node.outputs[0]
    count = math.prod(cg.graph.tensors[out].shape)
    if count != math.prod(cg.graph.tensors[src].shape):
        raise cg.fail(
            f"{node['op_type']} from {list(cg.graph.tensors[src].shape)} to "
            f"{list(cg.graph.tensors[out].shape)} changes the number of elements"
        )
    copy_dram(cg, cg.dram(out).name, cg.dram(src).name, count)


def lower_concat(cg: BirCodeGen, node: Node) -> None:
    """Each input lands in its slice along `axis`: [outer, length·inner] runs of the output.

    A run of whole channel planes (axis 0 or 1 of a tensor of rank 3 or more: a batch or a
    channel concat) is walked a plane at a time, [planes, plane], the rows the memory planner
    keeps such tensors in (docs/memory_planner.md#layout), one DMA per image of a channel
    concat (up to `CONCAT_IMAGES` images; the planner maps one row-stepping dim of an access
    to partitions), so that inputs and output can stay on chip."""
    out = node.outputs[0]
    out_shape = cg.graph.tensors[out].shape
    axis = node.attrs["axis"] % len(out_shape)
    outer = math.prod(out_shape[:axis])
    inner = math.prod(out_shape[axis + 1 :])
    row = out_shape[axis] * inner
    plane = math.prod(out_shape[2:]) if len(out_shape) >= 3 and axis <= 1 else 0
    position = 0
    dst = cg.dram(out).name
    for tensor in node.inputs:
        if not tensor:
            continue
        length = cg.graph.tensors[tensor].shape[axis] * inner
        src = cg.dram(tensor).name
        if length and outer and plane and outer <= CONCAT_IMAGES:
            run = [(plane, length // plane), (1, plane)]
            for image in range(outer):
                cg.dma(
                    cg.dram_ap(dst, Affine(position + image * row), run),
                    cg.dram_ap(src, Affine(image * length), run),
                )
        elif length and outer:
            cg.dma(
                cg.dram_ap(dst, Affine(position), [(row, outer), (1, length)]),
                cg.dram_ap(src, Affine(), [(length, outer), (1, length)]),
            )
        position += length


def copy_strided(
    cg: BirCodeGen,
    dst: str,
    dst_offset: Affine,
    src: str,
    src_offset: Affine,
    shape: tuple[int, ...],
    dst_strides: tuple[int, ...],
    src_strides: tuple[int, ...],
    max_dims: int = DMA_MAX_DIMS,
) -> None:
    """DRAM→DRAM: dst[i] = src[i] for every index i of `shape`, each side through its strides.

    Dims both sides walk contiguously (or both broadcast) are merged; strides may be negative
    or 0. Leading dims beyond `max_dims` (at most what one DMA descriptor takes) become loops.
    """
    if math.prod(shape) == 0:
        return
    shape, (dst_strides, src_strides) = merge_broadcast_dims(
        tuple(shape), [tuple(dst_strides), tuple(src_strides)]
    )
    if not shape:
        shape, dst_strides, src_strides = (1,), (1,), (1,)

    def walk(depth: int, dst_off: Affine, src_off: Affine) -> None:
        if len(shape) - depth <= max_dims:
            cg.dma(
                cg.dram_ap(
                    dst, dst_off, list(zip(dst_strides[depth:], shape[depth:], strict=True))
                ),
                cg.dram_ap(
                    src, src_off, list(zip(src_strides[depth:], shape[depth:], strict=True))
                ),
            )
            return
        if shape[depth] <= UNROLL_TRIPS:
            # A few copies with constant offsets, which the memory planner can place on any
            # partition, rather than a loop whose offsets move across partitions.
            for i in range(shape[depth]):
                walk(depth + 1, dst_off + i * dst_strides[depth], src_off + i * src_strides[depth])
            return
        for index in tiles(cg, shape[depth], 1, "t"):
            walk(
                depth + 1,
                dst_off + index.start * dst_strides[depth],
                src_off + index.start * src_strides[depth],
            )

    walk(0, dst_offset, src_offset)


def lower_transpose(cg: BirCodeGen, node: Node) -> None:
    """Data movement shaped so that both sides can stay on chip (docs/memory_planner.md):

    - the last dim stays last: one strided DMA per [rows, last dim] block, the rows being the
      longest other dim of the output (the remaining dims loop), each block reading whole
      rows of the input and writing whole rows of the output; when the other dims merge
      into one (a head split [T, H, D] → [H, T, D] or merge), a single copy
      [rows, H, D] instead, which is one on-chip copy per 128 rows when both sides are in
      SBUF;
    - the input's last dim becomes the output's second last (fp32: the last two dims swap,
      or a [T, H, D] → [H, D, T] key transpose): per index of the other dims, each block of
      at most 128 x 128 of the matrix is read as rows, flipped on the PE array against the
      identity and written as rows;
    - otherwise: one strided DMA, the destination walked contiguously, the source through
      permuted strides (dims both sides walk contiguously merged, leading dims beyond what a
      DMA descriptor takes looping).
    """
    src, out = node.inputs[0], node.outputs[0]
    in_shape = tuple(cg.graph.tensors[src].shape)
    rank = len(in_shape)
    perm = list(node.attr("perm") or reversed(range(rank)))
    out_shape = tuple(in_shape[axis] for axis in perm)
    in_strides = contiguous_strides(in_shape)
    permuted = tuple(in_strides[a] for a in perm)
    if not math.prod(out_shape):
        return
    flips = rank >= 2 and perm[-2] == rank - 1 and perm[-1] != rank - 1
    if flips and cg.graph.tensors[src].dtype is Dtype.FP32:
        _transpose_on_pe(cg, src, out, in_shape, perm)
        return
    order, max_dims = list(range(rank)), DMA_MAX_DIMS
    out_strides = contiguous_strides(out_shape)
    if rank >= 3 and perm[-1] == rank - 1 and perm != list(range(rank)):
        # The longest other dim becomes the rows of each block; the rest loop, unless one
        # copy [rows, other dim, last dim] takes them all (a head split or merge: one copy per
        # 128 rows instead of one per head and 128 rows).
        rows = max(range(rank - 1), key=lambda d: (out_shape[d], d))
        if out_shape[rows] * out_shape[-1] >= ROW_BLOCK:
            order = [d for d in range(rank - 1) if d != rows] + [rows, rank - 1]
            max_dims = 2
            whole = [rows] + [d for d in range(rank - 1) if d != rows] + [rank - 1]
            merged, _ = merge_broadcast_dims(
                tuple(out_shape[d] for d in whole),
                [tuple(out_strides[d] for d in whole), tuple(permuted[d] for d in whole)],
            )
            if len(merged) <= HEAD_COPY_DIMS:
                order, max_dims = whole, HEAD_COPY_DIMS
    copy_strided(
        cg,
        cg.dram(out).name,
        Affine(),
        cg.dram(src).name,
        Affine(),
        tuple(out_shape[d] for d in order),
        tuple(out_strides[d] for d in order),
        tuple(permuted[d] for d in order),
        max_dims=max_dims,
    )


# Copies a PE transpose of one-block matrices rotates over (each a PSUM bank).
TRANSPOSE_COPIES = 4
# A channel concat's copies, one per image and input, are unrolled up to this batch (a batch
# of 8 images of 4 inputs: 32 copies), so that each copy walks one image's planes.
CONCAT_IMAGES = 16
UNROLL_TRIPS = 4  # copy_strided emits this many leading-dim copies one by one, not as a loop
ROW_BLOCK = 512  # elements per [rows, last dim] block worth a DMA of its own
HEAD_COPY_DIMS = 3  # a last-dim-keeping Transpose of at most this many dims is one copy


def _transpose_on_pe(
    cg: BirCodeGen, src: str, out: str, in_shape: tuple[int, ...], perm: list[int]
) -> None:
    """out[..., j, i] = src[.., i, .., j]: the input's last dim becomes the output's second
    last and input dim `perm[-1]` its last; per index of the other dims, a matrix [i, j] (rows
    strided in the input, a head's [T, D] block of [T, H · D]) flipped in 128 x 128 blocks
    on the PE array. Blocks are read from and written to SBUF homes in place."""
    rows, cols = in_shape[perm[-1]], in_shape[-1]
    in_strides = contiguous_strides(in_shape)
    out_shape = tuple(in_shape[axis] for axis in perm)
    out_strides = contiguous_strides(out_shape)
    row_stride = in_strides[perm[-1]]
    lead, (out_lead, in_lead) = merge_broadcast_dims(
        out_shape[:-2], [out_strides[:-2], tuple(in_strides[axis] for axis in perm[:-2])]
    )
    p = NUM_PARTITIONS
    # Copies of the PSUM and result tiles when there are several blocks: the PE flips the
    # next block while ScalarE or VectorE copies this one out and DMAs store the ones before
    # (a store waits ~1.3 us for the copy's semaphore, so several stores are in flight). They
    # rotate over a matrix's blocks (two copies), or, when a matrix is one block (ConvNeXt's
    # NCHW -> NHWC permutes: a [96, 56] matrix per row), over the matrices (up to
    # TRANSPOSE_COPIES).
    blocks = tile_count(rows, p) * tile_count(cols, p)
    across = blocks == 1 and math.prod(lead) > 1  # the copies rotate with the matrices' loop
    copies = min(TRANSPOSE_COPIES, math.prod(lead)) if across else (2 if blocks > 1 else 1)
    block = cg.sb_tile("block", p, copies * p, Dtype.FP32)
    flipped = cg.psum_tile("flipped", p, (copies - 1) * BANK_FP32 + p)
    result = cg.sb_tile("flipped", p, copies * p, Dtype.FP32)
    src_loc, out_loc = cg.dram(src).name, cg.dram(out).name
    matrices = rotating_nested_loops(cg, lead, [out_lead, in_lead], "b", copies if across else 1)
    for (out_base, in_base), matrix_slot in matrices:
        count = 0
        for r in tiles(cg, rows, p, "tr"):
            for c in tiles(cg, cols, p, "tc"):
                slot, count = (matrix_slot, count) if across else (count % copies, count + 1)
                loaded = cg.read_operand(
                    cg.ap(block, [(1, c.size)], slot * p, partitions=r.size),
                    cg.dram_ap(
                        src_loc,
                        in_base + r.start * row_stride + c.start,
                        [(row_stride, r.size), (1, c.size)],
                    ),
                )
                psum = cg.ap(flipped, [(1, r.size)], slot * BANK_FP32, partitions=c.size)
                cg.matmul(psum, loaded, cg.identity(r.size), accumulate=False)
                target = cg.dram_ap(
                    out_loc, out_base + c.start * rows + r.start, [(rows, c.size), (1, r.size)]
                )
                tile = cg.ap(result, [(1, r.size)], slot * p, partitions=c.size)
                stored = cg.write_operand(tile, target)
                cg.on_chip_copy(stored, psum)
                cg.store_result(target, tile, stored)
