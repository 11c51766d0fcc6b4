"""Generic lowering of DepthToSpace and SpaceToDepth: pure data movement, one DMA per plane.

DepthToSpace with block b turns x[N, C, H, W] into y[N, C/b², H·b, W·b]:
    DCR: y[n, c, h·b + i, w·b + j] = x[n, (i·b + j)·C/b² + c, h, w]
    CRD: y[n, c, h·b + i, w·b + j] = x[n, c·b² + i·b + j, h, w]
SpaceToDepth is the inverse of the same mode (DCR by default):
    DCR: y[n, (i·b + j)·C + c, h, w] = x[n, c, h·b + i, w·b + j]
    CRD: y[n, c·b² + i·b + j, h, w] = x[n, c, h·b + i, w·b + j]
For every (n, c, i, j), in BIR loops, one DRAM→DRAM DMA moves an [H, W] plane between the
contiguous side and the side strided by b along both spatial dims.
"""

from __future__ import annotations

from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.tiling import tiles
from onnx2bir.graph import Node


def lower_depth_space(cg: BirCodeGen, node: Node) -> None:
    op_type = node.op_type
    x, out = node.inputs[0], node.outputs[0]
    b = int(node.attrs["blocksize"])
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise cg.fail(f"{op_type} mode {mode!r} is not DCR or CRD")
    x_shape = tuple(cg.graph.tensors[x].shape)
    if len(x_shape) != 4:
        raise cg.fail(f"{op_type} of a rank-{len(x_shape)} tensor (rank 4 expected)")
    # (n, c_small, h, w): the block-spread tensor's channels and the compact side's plane.
    if op_type == "DepthToSpace":
        n_size, channels, height, width = x_shape
        small = channels // (b * b)
    else:
        n_size, small, big_h, big_w = x_shape
        channels, height, width = small * b * b, big_h // b, big_w // b
    plane = height * width
    spread_plane = plane * b * b
    x_loc, y_loc = cg.dram(x).name, cg.dram(out).name
    for n in tiles(cg, n_size, 1, "n"):
        for c in tiles(cg, small, 1, "c"):
            for i in tiles(cg, b, 1, "i"):
                for j in tiles(cg, b, 1, "j"):
                    if mode == "DCR":
                        channel = i.start * (b * small) + j.start * small + c.start
                    else:
                        channel = c.start * (b * b) + i.start * b + j.start
                    compact = n.start * (channels * plane) + channel * plane
                    spread = (
                        n.start * (small * spread_plane)
                        + c.start * spread_plane
                        + i.start * (width * b)
                        + j.start
                    )
                    compact_ap = cg.dram_ap(
                        x_loc if op_type == "DepthToSpace" else y_loc,
                        compact,
                        [(width, height), (1, width)],
                    )
                    spread_ap = cg.dram_ap(
                        y_loc if op_type == "DepthToSpace" else x_loc,
                        spread,
                        [(b * width * b, height), (b, width)],
                    )
                    if op_type == "DepthToSpace":
                        cg.dma(spread_ap, compact_ap)
                    else:
                        cg.dma(compact_ap, spread_ap)
