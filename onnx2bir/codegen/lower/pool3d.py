"""MaxPool and AveragePool over 3-D windows (N, C, D, H, W), as a depth pass then the 2-D pool.

Both pools are separable: a window's max (or sum) is the max (or sum) over its depth taps of the
2-D window results, and an average's divisor is the product of the per-axis tap counts. So the
depth pass reduces, for each output depth, the `kernel_d` (dilated) input depth slices of every
plane: planes on partitions, a band [kernel_d, H·W chunk] loaded by one strided DMA from the
depth-framed input (−inf for max, 0 for sums) and one `TensorReduce` over the taps, divided for
an average by that output depth's tap count (a per-partition scalar column loaded from a DRAM
constant). Its result, (N·C·out_d) planes of H×W in DRAM scratch, is exactly the input of the
2-D window pool (`lower_pool.window_pool`), whose output planes are the (N, C, out_d) ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import AluOp
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.pool import (
    POOL_BAND_BYTES,
    axis_counts,
    divisor_argument,
    divisor_map,
    window_pool,
)
from onnx2bir.codegen.spatial import WindowGeometry, fill_dram
from onnx2bir.codegen.tiling import Affine, tiles
from onnx2bir.graph import Node


@dataclass(frozen=True, slots=True)
class AxisWindow:
    """One spatial axis of a pooling window."""

    size: int
    out: int
    kernel: int
    stride: int
    dilation: int
    begin: int
    end: int

    def needed(self, out: int) -> int:
        return (out - 1) * self.stride + (self.kernel - 1) * self.dilation + 1


def axis_windows(cg: BirCodeGen, node: Node) -> list[AxisWindow]:
    """The three spatial axes of a 3-D MaxPool/AveragePool node (explicit pads or auto_pad)."""
    attrs = node.attrs
    in_sp = tuple(cg.graph.tensors[node.inputs[0]].shape)[2:]
    out_sp = tuple(cg.graph.tensors[node.outputs[0]].shape)[2:]
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides") or [1] * 3)
    dilations = list(attrs.get("dilations") or [1] * 3)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    axes = []
    for i in range(3):
        reach = (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = max(0, reach - in_sp[i])
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            end = total - begin
        elif auto_pad == "VALID":
            begin = end = 0
        else:
            pads = list(attrs.get("pads") or [0] * 6)
            begin, end = pads[i], pads[3 + i]
        axes.append(
            AxisWindow(in_sp[i], out_sp[i], kernel[i], strides[i], dilations[i], begin, end)
        )
    return axes


def lower_pool_3d(cg: BirCodeGen, node: Node) -> None:
    is_max = node.op_type == "MaxPool"
    op, fill = (AluOp.MAX, float("-inf")) if is_max else (AluOp.ADD, 0.0)
    include_pad = bool(node.attr("count_include_pad", 0))
    depth, rows, cols = axis_windows(cg, node)
    x_name = node.inputs[0]
    shape = tuple(cg.graph.tensors[x_name].shape)
    dtype = cg.graph.tensors[x_name].dtype
    planes = shape[0] * shape[1]
    if planes * depth.out * rows.out * cols.out == 0:
        return
    mid = cg.dram_scratch("depth_pooled", (planes * depth.out, rows.size, cols.size), dtype)
    depth_counts = None
    if not is_max:
        depth_counts = axis_counts(
            depth.out,
            depth.size,
            depth.stride,
            depth.dilation,
            depth.kernel,
            depth.begin,
            depth.end,
            include_pad,
        ).astype(np.float32)
    _depth_pass(cg, x_name, mid.name, planes, rows.size * cols.size, depth, op, fill, depth_counts)
    geo = WindowGeometry(
        rows.size,
        cols.size,
        rows.out,
        cols.out,
        rows.kernel,
        cols.kernel,
        rows.stride,
        cols.stride,
        rows.dilation,
        cols.dilation,
        rows.begin,
        cols.begin,
    )
    divisor = None
    if not is_max:
        divisor = divisor_argument(cg, divisor_map(geo, rows.end, cols.end, include_pad))
    out_name = node.outputs[0]
    window_pool(cg, mid.name, out_name, planes * depth.out, dtype, geo, op, fill, divisor)


def _depth_pass(
    cg: BirCodeGen,
    x_name: str,
    mid: str,
    planes: int,
    plane: int,
    depth: AxisWindow,
    op: AluOp,
    fill: float,
    counts: np.ndarray | None,
) -> None:
    """mid[plane, od] = op over the depth taps of output depth od (divided by its count)."""
    source = cg.dram(x_name)
    dtype = source.dtype
    framed = max(depth.begin + depth.size, depth.needed(depth.out))
    src = source.name
    if framed != depth.size or depth.begin:
        scratch = cg.dram_scratch("depth_padded", (planes, framed, plane), dtype)
        fill_dram(cg, scratch.name, planes * framed * plane, dtype, fill, framed * plane)
        cg.dma(
            cg.dram_ap(
                scratch.name,
                Affine(depth.begin * plane),
                [(framed * plane, planes), (1, depth.size * plane)],
            ),
            cg.dram_ap(src, Affine(), [(depth.size * plane, planes), (1, depth.size * plane)]),
        )
        src = scratch.name
    chunk = max(1, min(plane, POOL_BAND_BYTES // (depth.kernel * dtype.itemsize)))
    band = cg.sb_tile("depth_band", NUM_PARTITIONS, depth.kernel * chunk, dtype)
    out_sb = cg.sb_tile("depth_out", NUM_PARTITIONS, chunk, dtype)
    if counts is not None:
        if np.all(counts == counts[0]):
            divisor: float | str | None = float(counts[0])
        else:
            divisor = cg.add_dram_const(f"{cg.origin.node}/depth_divisors", counts).name
            column = cg.sb_tile("depth_divisor", NUM_PARTITIONS, 1, dtype)
    else:
        divisor = None
    for p in tiles(cg, planes, NUM_PARTITIONS, "p"):
        for od in tiles(cg, depth.out, 1, "od"):
            if isinstance(divisor, str):
                cg.dma(
                    cg.ap(column, partitions=p.size),
                    cg.dram_ap(divisor, od.start, [(0, p.size), (1, 1)]),
                )
            first = p.start * (framed * plane) + od.start * (depth.stride * plane)
            for piece in tiles(cg, plane, chunk, "hw"):
                cg.dma(
                    cg.ap(band, [(chunk, depth.kernel), (1, piece.size)], partitions=p.size),
                    cg.dram_ap(
                        src,
                        first + piece.start,
                        [
                            (framed * plane, p.size),
                            (depth.dilation * plane, depth.kernel),
                            (1, piece.size),
                        ],
                    ),
                )
                result = cg.ap(out_sb, [(1, piece.size)], partitions=p.size)
                taps = cg.ap(band, [(1, piece.size), (chunk, depth.kernel)], partitions=p.size)
                cg.tensor_reduce(result, taps, op, axes=1)
                if isinstance(divisor, float):
                    cg.tensor_scalar(result, result, AluOp.DIVIDE, divisor)
                elif isinstance(divisor, str):
                    cg.tensor_scalar(result, result, AluOp.DIVIDE, cg.ap(column, partitions=p.size))
                cg.dma(
                    cg.dram_ap(
                        mid,
                        p.start * (depth.out * plane) + od.start * plane + piece.start,
                        [(depth.out * plane, p.size), (1, piece.size)],
                    ),
                    result,
                )
