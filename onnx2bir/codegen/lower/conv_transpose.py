"""Generic lowering of ConvTranspose (1-D and 2-D) through the generic Conv machinery.

A transposed convolution is the convolution of the stride-dilated input with the flipped
kernel, its in/out channel axes swapped (the backward-data form):

    y = conv(dilate_s(x) framed by d·(k − 1) − pad_begin, W'),  stride 1, dilation d,
    W'[g·Cog + co, ci, i, j] = W[g·Cig + ci, co, k_h − 1 − i, k_w − 1 − j]

Both operands are built by DMA in DRAM scratch buffers: the input is written every `stride`
elements into a zero-filled buffer tall and wide enough for a stride-1 "valid" conv to
produce the output (output_padding and the end pads only change that size; a pad larger
than d·(k − 1) crops input rows), and the kernel is copied through negative strides.
`lower_conv.emit_conv` then runs the shifted-window matmuls, bias included.
"""

from __future__ import annotations

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.conv import ConvInput, ConvWeights, emit_conv
from onnx2bir.codegen.lower.data import copy_strided
from onnx2bir.codegen.spatial import WindowGeometry, fill_dram
from onnx2bir.codegen.tiling import Affine
from onnx2bir.graph import Node


def _begin_pads(attrs: dict, in_sp, out_sp, kernel, strides, dilations, extra) -> list[int]:
    """Leading pads: explicit, or split from the total an output_shape / auto_pad implies."""
    rank = len(in_sp)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") or attrs.get("output_shape"):
        begins = []
        for i in range(rank):
            total = max(
                0,
                strides[i] * (in_sp[i] - 1)
                + extra[i]
                + (kernel[i] - 1) * dilations[i]
                + 1
                - out_sp[i],
            )
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
        return begins
    if auto_pad == "VALID":
        return [0] * rank
    return list((attrs.get("pads") or [0] * (2 * rank))[:rank])


def lower_conv_transpose(cg: BirCodeGen, node: Node) -> None:
    attrs = node.attrs
    x_name, w_name = node.inputs[:2]
    b_name = node.inputs[2] if len(node.inputs) > 2 else ""
    x_shape = tuple(cg.graph.tensors[x_name].shape)
    w_shape = tuple(cg.graph.tensors[w_name].shape)
    out_shape = tuple(cg.graph.tensors[node.outputs[0]].shape)
    rank = len(x_shape) - 2
    if rank not in (1, 2):
        raise cg.fail(f"{rank}-D ConvTranspose is not supported (1-D and 2-D are)")
    if cg.graph.tensors[x_name].dtype is not Dtype.FP32:
        raise cg.fail("the generic ConvTranspose computes in fp32")
    batch, c_in = x_shape[:2]
    groups = int(attrs.get("group", 1))
    c_in_group, c_out_group = c_in // groups, w_shape[1]
    c_out = c_out_group * groups
    kernel = list(w_shape[2:])
    strides = list(attrs.get("strides") or [1] * rank)
    dilations = list(attrs.get("dilations") or [1] * rank)
    extra = list(attrs.get("output_padding") or [0] * rank)
    in_sp, out_sp = list(x_shape[2:]), list(out_shape[2:])
    begins = _begin_pads(attrs, in_sp, out_sp, kernel, strides, dilations, extra)
    if rank == 1:
        for values, unit in (
            (in_sp, 1),
            (out_sp, 1),
            (kernel, 1),
            (strides, 1),
            (dilations, 1),
            (begins, 0),
        ):
            values.insert(0, unit)
    (in_h, in_w), (out_h, out_w), (k_h, k_w) = in_sp, out_sp, kernel
    reach = [(k - 1) * d for k, d in zip(kernel, dilations, strict=True)]
    height, width = out_h + reach[0], out_w + reach[1]
    frame = [r - b for r, b in zip(reach, begins, strict=True)]  # first input row, col

    # The stride-dilated, zero-framed input.
    planes = batch * c_in
    dilated = cg.dram_scratch("dilated", (planes, height, width), Dtype.FP32)
    fill_dram(cg, dilated.name, planes * height * width, Dtype.FP32, 0.0, height * width)
    firsts, counts = [], []
    for size, stride, top, extent in zip(
        (in_h, in_w), strides, frame, (height, width), strict=True
    ):
        first = max(0, -(top // stride))  # first input index landing inside the buffer
        last = min(size - 1, (extent - 1 - top) // stride)
        firsts.append(first)
        counts.append(max(0, last - first + 1))
    if counts[0] and counts[1]:
        copy_strided(
            cg,
            dilated.name,
            Affine((frame[0] + firsts[0] * strides[0]) * width + frame[1] + firsts[1] * strides[1]),
            cg.dram(x_name).name,
            Affine(firsts[0] * in_w + firsts[1]),
            (planes, counts[0], counts[1]),
            (height * width, strides[0] * width, strides[1]),
            (in_h * in_w, in_w, 1),
        )

    # The flipped kernel with in/out swapped, per group: [C_out, C_in/group, k_h, k_w].
    taps = k_h * k_w
    flipped = cg.dram_scratch("flipped", (c_out, c_in_group, k_h, k_w), Dtype.FP32)
    for group in range(groups):
        copy_strided(
            cg,
            flipped.name,
            Affine(group * c_out_group * c_in_group * taps),
            cg.dram(w_name).name,
            Affine(group * c_in_group * c_out_group * taps + taps - 1),
            (c_out_group, c_in_group, k_h, k_w),
            (c_in_group * taps, taps, k_w, 1),
            (taps, c_out_group * taps, -k_w, -1),
        )

    geo = WindowGeometry(
        height, width, out_h, out_w, k_h, k_w, 1, 1, dilations[0], dilations[1], 0, 0
    )
    emit_conv(
        cg,
        geo,
        ConvInput(dilated.name, batch, c_in, height, width),
        ConvWeights(
            flipped.name, c_out, c_in_group, groups, cg.dram(b_name).name if b_name else None
        ),
        cg.dram(node.outputs[0]).name,
    )
