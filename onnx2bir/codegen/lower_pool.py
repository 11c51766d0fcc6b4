"""Generic lowering of MaxPool and GlobalAveragePool on VectorE.

Planes (N·C) sit on partitions. MaxPool reads a band of the (-inf framed) input and reduces
it through a 4-D access pattern — output rows, output cols, window rows, window cols — with
one `TensorReduce(max)` over the last two dims per tile, as the NKI pooling kernels do.
GlobalAveragePool sums each plane along the free dim (in chunks when the plane is larger than
a tile, then sums the partial sums) and scales by 1 / (H·W) on ScalarE.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import ActFunc, AluOp
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower_conv import tile_index
from onnx2bir.codegen.registry import lowering
from onnx2bir.codegen.spatial import padded_input, window_geometry
from onnx2bir.codegen.tiling import tiles

POOL_OUT_TILE = 1024
REDUCE_CHUNK = 8192


@lowering("MaxPool")
def lower_maxpool(cg: BirCodeGen, node: dict) -> None:
    attrs = node["attrs"]
    if len(node["outputs"]) > 1 and node["outputs"][1]:
        raise cg.fail("MaxPool's Indices output is not supported")
    if attrs.get("storage_order", 0):
        raise cg.fail("MaxPool storage_order=1 is not supported")
    x_name, out_name = node["inputs"][0], node["outputs"][0]
    x_shape = tuple(cg.graph.tensors[x_name].shape)
    geo = window_geometry(cg, node, tuple(attrs["kernel_shape"]))
    planes = x_shape[0] * x_shape[1]
    dtype = cg.graph.tensors[x_name].dtype
    src, height, width = padded_input(cg, x_name, planes, geo, float("-inf"))
    plane = height * width
    cols = min(geo.out_w, POOL_OUT_TILE)
    rows = max(1, min(geo.out_h, POOL_OUT_TILE // cols))
    band = cg.sb_tile("band", NUM_PARTITIONS, geo.rows_needed(rows) * geo.cols_needed(cols),
                      dtype)
    out_sb = cg.sb_tile("out", NUM_PARTITIONS, rows * cols, dtype)
    y_loc = cg.dram(out_name).name
    out_plane = geo.out_h * geo.out_w
    for p in tiles(cg, planes, NUM_PARTITIONS, "p"):
        for row in tiles(cg, geo.out_h, rows, "oh"):
            for col in tiles(cg, geo.out_w, cols, "ow"):
                band_rows, band_cols = geo.rows_needed(row.size), geo.cols_needed(col.size)
                cg.dma(cg.ap(band, [(1, band_rows * band_cols)], partitions=p.size),
                       cg.dram_ap(src, p.start * plane + row.start * (geo.stride_h * width)
                                  + col.start * geo.stride_w,
                                  [(plane, p.size), (width, band_rows), (1, band_cols)]))
                windows = cg.ap(band, [(geo.stride_h * band_cols, row.size),
                                       (geo.stride_w, col.size),
                                       (geo.dilation_h * band_cols, geo.kernel_h),
                                       (geo.dilation_w, geo.kernel_w)], partitions=p.size)
                result = cg.ap(out_sb, [(1, row.size * col.size)], partitions=p.size)
                cg.tensor_reduce(result, windows, AluOp.MAX, axes=2)
                cg.dma(cg.dram_ap(y_loc, p.start * out_plane + row.start * geo.out_w
                                  + col.start, [(out_plane, p.size), (geo.out_w, row.size),
                                                (1, col.size)]),
                       result)


@lowering("GlobalAveragePool")
def lower_global_average_pool(cg: BirCodeGen, node: dict) -> None:
    x_name, out_name = node["inputs"][0], node["outputs"][0]
    x_shape = tuple(cg.graph.tensors[x_name].shape)
    planes, size = x_shape[0] * x_shape[1], math.prod(x_shape[2:])
    dtype = cg.graph.tensors[x_name].dtype
    x_loc, y_loc = cg.dram(x_name).name, cg.dram(out_name).name
    chunk = min(size, REDUCE_CHUNK)
    chunks = -(-size // chunk)
    data = cg.sb_tile("data", NUM_PARTITIONS, chunk, dtype)
    partial = cg.sb_tile("partial", NUM_PARTITIONS, chunks, dtype)
    total = cg.sb_tile("sum", NUM_PARTITIONS, 1, dtype)
    for p in tiles(cg, planes, NUM_PARTITIONS, "p"):
        for piece in tiles(cg, size, chunk, "hw"):
            cg.dma(cg.ap(data, [(1, piece.size)], partitions=p.size),
                   cg.dram_ap(x_loc, p.start * size + piece.start,
                              [(size, p.size), (1, piece.size)]))
            cg.tensor_reduce(cg.ap(partial, [(1, 1)], tile_index(piece, chunk),
                                   partitions=p.size),
                             cg.ap(data, [(1, piece.size)], partitions=p.size), AluOp.ADD, 1)
        cg.tensor_reduce(cg.ap(total, partitions=p.size),
                         cg.ap(partial, partitions=p.size), AluOp.ADD, 1)
        cg.activation(cg.ap(total, partitions=p.size), cg.ap(total, partitions=p.size),
                      ActFunc.COPY, scale=1.0 / size)
        cg.dma(cg.dram_ap(y_loc, p.start, [(1, p.size), (1, 1)]),
               cg.ap(total, partitions=p.size))
