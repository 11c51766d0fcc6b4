"""Generic lowering of 3-D Conv: the depth taps folded into channels, then the 2-D conv.

For x [N, C, D, H, W] and w [C_out, C/g, KD, KH, KW]:
1. x is written into a zero-framed DRAM scratch xp [N, C, Dp, Hp, Wp] (the pads; Dp, Hp, Wp
   just as many rows as the windows read);
2. a strided DMA gathers x2 [N·OD, C·KD, Hp, Wp] with x2[n·OD + od, c·KD + kd] =
   xp[n, c, od·sd + kd·dd]: each output depth slice sees its KD input slices as channels;
3. w is already [C_out, (C/g)·KD, KH, KW] in memory (C/g and KD are adjacent), and a group's
   channels stay contiguous in x2, so the 2-D conv (`emit_conv`: shifted-window matmuls
   accumulating in PSUM, bias on the eviction) computes y2 [N·OD, C_out, OH, OW];
4. a last strided copy permutes y2 into y [N, C_out, OD, OH, OW].
The gather costs KD/sd times the input in DRAM; the arithmetic is the conv's own.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.conv import ConvInput, ConvWeights, emit_conv, fused_activation
from onnx2bir.codegen.lower.data import copy_strided
from onnx2bir.codegen.spatial import WindowGeometry, fill_dram
from onnx2bir.codegen.tiling import Affine, contiguous_strides
from onnx2bir.graph import Node


def _begins(node: Node, in_sp, out_sp, kernel, strides, dilations) -> list[int]:
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins = []
        for i in range(3):
            total = max(
                0, (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i]
            )
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        return begins
    if auto_pad == "VALID":
        return [0, 0, 0]
    return list((node.attr("pads") or [0] * 6)[:3])


def lower_conv3d(cg: BirCodeGen, node: Node) -> None:
    x_name, w_name = node.inputs[:2]
    b_name = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    x_shape = tuple(cg.graph.tensors[x_name].shape)
    w_shape = tuple(cg.graph.tensors[w_name].shape)
    y_shape = tuple(cg.graph.tensors[out].shape)
    if cg.graph.tensors[x_name].dtype is not Dtype.FP32:
        raise cg.fail(
            f"the generic conv computes in fp32; input is {cg.graph.tensors[x_name].dtype}"
        )
    n, c = x_shape[:2]
    c_out, c_group = w_shape[:2]
    kernel = w_shape[2:]
    in_sp, out_sp = x_shape[2:], y_shape[2:]
    strides = list(node.attr("strides") or [1, 1, 1])
    dilations = list(node.attr("dilations") or [1, 1, 1])
    begins = _begins(node, in_sp, out_sp, kernel, strides, dilations)
    if math.prod(y_shape) == 0:
        return
    # 1. the zero-framed input, as many rows as the windows read
    needed = [
        (o - 1) * s + (k - 1) * d + 1
        for o, s, k, d in zip(out_sp, strides, kernel, dilations, strict=True)
    ]
    dp, hp, wp = needed
    padded_shape = (n, c, dp, hp, wp)
    xp = cg.dram_scratch("padded", padded_shape, Dtype.FP32)
    valid = [
        max(0, min(size, extent - begin))
        for size, extent, begin in zip(in_sp, needed, begins, strict=True)
    ]
    if any(begins) or list(valid) != list(in_sp) or needed != list(in_sp):
        fill_dram(cg, xp.name, math.prod(padded_shape), Dtype.FP32, 0.0)
    pstrides = contiguous_strides(padded_shape)
    copy_strided(
        cg,
        xp.name,
        Affine(begins[0] * pstrides[2] + begins[1] * pstrides[3] + begins[2]),
        cg.dram(x_name).name,
        Affine(),
        (n, c, *valid),
        pstrides,
        contiguous_strides(x_shape),
    )
    # 2. depth taps as channels
    od, oh, ow = out_sp
    kd = kernel[0]
    gathered = (n, od, c, kd, hp, wp)
    x2 = cg.dram_scratch("depth_taps", gathered, Dtype.FP32)
    copy_strided(
        cg,
        x2.name,
        Affine(),
        xp.name,
        Affine(),
        gathered,
        contiguous_strides(gathered),
        (pstrides[0], strides[0] * pstrides[2], pstrides[1], dilations[0] * pstrides[2], wp, 1),
    )
    # 3. the 2-D conv over every (n, od)
    geo = WindowGeometry(
        hp,
        wp,
        oh,
        ow,
        kernel[1],
        kernel[2],
        strides[1],
        strides[2],
        dilations[1],
        dilations[2],
        0,
        0,
    )
    y2 = cg.dram_scratch("slices", (n * od, c_out, oh, ow), Dtype.FP32)
    weights = ConvWeights(
        cg.dram(w_name).name,
        c_out,
        c_group * kd,
        int(node.attr("group", 1)),
        cg.dram(b_name).name if b_name else None,
        fused_activation(node),
    )
    emit_conv(cg, geo, ConvInput(x2.name, n * od, c * kd, hp, wp), weights, y2.name)
    # 4. [N, OD, C_out, P] -> [N, C_out, OD, P]
    plane = oh * ow
    copy_strided(
        cg,
        cg.dram(out).name,
        Affine(),
        y2.name,
        Affine(),
        (n, c_out, od, plane),
        contiguous_strides((n, c_out, od, plane)),
        (od * c_out * plane, plane, c_out * plane, 1),
    )
