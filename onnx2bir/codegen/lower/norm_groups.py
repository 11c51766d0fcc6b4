"""Generic lowering of GroupNormalization and RMSNormalization.

- GroupNormalization: per image, the G groups on partitions and each group's C/G channels ×
  pixels on the free dim; the statistics are LayerNormalization's row normalisation
  (`row_norm.StagedRows`: −mean, centred squares, rsqrt on ScalarE, a group of images at a
  time). The per-channel scale and
  bias are loaded once as [G, C/G · pixels] tiles by a DMA that repeats each channel's value over
  its pixels (stride 0); opset 18's per-group scale and bias repeat over the whole group. A
  group longer than one row chunk is refused.
- RMSNormalization: rows (every position before `axis`) on partitions, the normalised elements
  on the free dim; the same staged steps without the centring: Σx² by ScalarE square and a
  VectorE reduce, rsqrt(Σ/D + ε) on ScalarE, then x · rstd (ScalarE) · scale (GpSimd, the
  scale broadcast to every partition by a stride-0 DMA).
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.norm import _dense_vector
from onnx2bir.codegen.row_groups import emit_skewed, row_groups
from onnx2bir.codegen.row_norm import ROW_CHUNK, StagedRows, pass_engine
from onnx2bir.codegen.tiling import Affine, Tile
from onnx2bir.graph import Node

FP32 = Dtype.FP32


def lower_group_norm(cg: BirCodeGen, node: Node) -> None:
    x, scale, bias = node.inputs[:3]
    shape = tuple(cg.graph.tensors[x].shape)
    groups = int(node.attrs["num_groups"])
    batch, channels, pixels = shape[0], shape[1], math.prod(shape[2:])
    if batch * channels * pixels == 0:
        return
    if groups > NUM_PARTITIONS or channels % groups:
        raise cg.fail(f"GroupNormalization: {groups} groups of {channels} channels")
    per_group = channels // groups
    length = per_group * pixels
    if length > ROW_CHUNK:
        raise cg.fail(f"GroupNormalization: a group of {length} elements (at most {ROW_CHUNK})")
    eps = float(node.attr("epsilon", 1e-5))
    vectors = []
    for tag, name in (("gamma", scale), ("beta", bias)):
        tile = cg.sb_tile(tag, groups, length, FP32)
        if tuple(cg.graph.tensors[name].shape) == (channels,):
            pattern = [(per_group, groups), (1, per_group), (0, pixels)]
        else:  # opset 18: one value per group
            pattern = [(1, groups), (0, length)]
        cg.dma(cg.ap(tile), cg.dram_ap(cg.dram(name).name, Affine(), pattern))
        vectors.append(cg.ap(tile))
    norm = StagedRows(cg, batch, 1, length, eps)
    x_loc, y_loc = cg.dram(x).name, cg.dram(node.outputs[0]).name

    def views(n: Tile):
        start = n.start * (channels * pixels)
        pattern = [(length, groups), (1, length)]
        return cg.dram_ap(x_loc, start, pattern), cg.dram_ap(y_loc, start, pattern), groups

    engine = pass_engine(length, tensor_tensor=True)

    def tile_steps(n: Tile) -> list:
        t = norm.tile(n, views)

        def affine() -> None:
            cg.tensor_tensor(t.y, t.y, vectors[0], AluOp.MULTIPLY, engine=engine)
            cg.tensor_tensor(t.y, t.y, vectors[1], AluOp.ADD, engine=engine)

        return [*norm.steps(t), affine, norm.store(t)]

    for group in row_groups(cg, norm.plan, "n"):
        emit_skewed([tile_steps(n) for n in group])


def lower_rms_norm(cg: BirCodeGen, node: Node) -> None:
    x, scale = node.inputs[:2]
    shape = tuple(cg.graph.tensors[x].shape)
    axis = int(node.attr("axis", -1)) % len(shape)
    rows, length = math.prod(shape[:axis]), math.prod(shape[axis:])
    if rows * length == 0:
        return
    if length > ROW_CHUNK:
        raise cg.fail(f"RMSNormalization over {length} elements (at most {ROW_CHUNK})")
    eps = float(node.attr("epsilon", 1e-5))
    p = NUM_PARTITIONS
    gamma = cg.sb_tile("gamma", p, length, FP32)
    scale_loc = _dense_vector(cg, scale, shape[axis:])
    cg.dma(cg.ap(gamma), cg.dram_ap(scale_loc, Affine(), [(0, p), (1, length)]))
    norm = StagedRows(cg, rows, p, length, eps, center=False)
    x_loc, y_loc = cg.dram(x).name, cg.dram(node.outputs[0]).name

    def views(r: Tile):
        window = [(length, r.size), (1, length)]
        start = r.start * length
        return cg.dram_ap(x_loc, start, window), cg.dram_ap(y_loc, start, window), r.size

    engine = pass_engine(length, tensor_tensor=True)

    def tile_steps(r: Tile) -> list:
        t = norm.tile(r, views)
        vector = cg.ap(gamma, partitions=r.size)

        def affine() -> None:
            cg.tensor_tensor(t.y, t.y, vector, AluOp.MULTIPLY, engine=engine)

        return [*norm.steps(t), affine, norm.store(t)]

    for group in row_groups(cg, norm.plan, "r"):
        emit_skewed([tile_steps(r) for r in group])
