"""Generic lowering of layout ops as DRAM→DRAM DMAs: Cast, Split, Slice, Expand, Tile, Pad.

No engine computes here: each op is a few strided DMAs (`copy_strided`), whose access
patterns carry the whole op.

- Cast / CastLike: a contiguous copy between locations of different dtypes; the DMA converts
  (integers to integers directly, everything else through fp32; fp32 → int truncates toward
  zero, nonzero → true).
- Split: output i is the slice [offset_i, offset_i + size_i) of the split axis.
- Slice: per axis a start and a signed step, so the source pattern has stride step·stride
  (negative for a reversed axis).
- Expand: the input walked with stride 0 along the broadcast dims.
- Tile: each output dim d becomes (repeat, size) with source strides (0, stride_d).
- Pad: the output is filled with the pad value (constant mode) and the input copied into its
  interior; edge/reflect/wrap modes then fill the borders axis by axis from the output itself,
  one DMA per border: reflect reads the interior mirrored (a negative-stride destination),
  edge reads the border row with stride 0, wrap reads the opposite end of the interior.
"""

from __future__ import annotations

import math

from onnx2bir.bir.dtypes import SATURATING
from onnx2bir.bir.enums import AluOp, Dtype, Engine
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.elementwise_walk import emit_elementwise, like, scratch_tile
from onnx2bir.codegen.lower.data import copy_dram, copy_strided
from onnx2bir.codegen.spatial import fill_dram
from onnx2bir.codegen.tiling import Affine, broadcast_strides, contiguous_strides
from onnx2bir.graph import Node


def const_ints(cg: BirCodeGen, node: Node, index: int, what: str) -> list[int] | None:
    """The int values of optional input `index`, None when absent; runtime values fail."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    info = cg.graph.tensors[node.inputs[index]]
    if not info.is_const:
        raise cg.fail(f"the {what} must be a constant (input {index} is computed at run time)")
    return [int(v) for v in info.const.reshape(-1)]


def lower_cast(cg: BirCodeGen, node: Node) -> None:
    """Cast (and CastLike) as one converting DMA (`bir/dtypes.py store_as`). A float8 target
    with `saturate=0` (overflow to NaN or inf) is refused: the device's conversion saturates."""
    src, out = node.inputs[0], node.outputs[0]
    target = cg.graph.tensors[out].dtype
    if target in SATURATING and not int(node.attr("saturate", 1)):
        raise cg.fail(
            f"Cast to {target} with saturate=0: the device's float8 conversion saturates "
            f"at ±{SATURATING[target]:g}"
        )
    if target in (Dtype.INT4, Dtype.UINT4) and cg.graph.tensors[src].dtype.is_float:
        _float_to_4bit(cg, node)
        return
    count = math.prod(cg.graph.tensors[out].shape)
    copy_dram(cg, cg.dram(out).name, cg.dram(src).name, count)


def _float_to_4bit(cg: BirCodeGen, node: Node) -> None:
    """A float cast to int4/uint4 as onnxruntime computes it: rounded half away from zero,
    then wrapped to 4 bits (ONNX leaves an out-of-range value undefined; docs/dtypes.md).
    Per tile: h = (x >= 0) - 0.5, t = x + h in fp32; t stored to int32 truncates toward zero
    (the rounding); int32 to the 4-bit output's byte wraps, and so does its store to 4 bits."""
    half_t, whole_t = scratch_tile(cg, "half"), scratch_tile(cg, "whole", Dtype.INT32)

    def compute(cg: BirCodeGen, dst, srcs) -> None:
        half, whole = like(dst, half_t), like(dst, whole_t)
        cg.tensor_scalar(half, srcs[0], AluOp.IS_GE, 0.0, AluOp.SUBTRACT, 0.5)
        cg.tensor_tensor(half, srcs[0], half, AluOp.ADD)
        cg.tensor_copy(whole, half)
        cg.tensor_copy(dst, whole, Engine.POOL)

    emit_elementwise(cg, {**node, "inputs": [node.inputs[0]]}, compute)


def split_sizes(cg: BirCodeGen, node: Node, length: int) -> list[int]:
    """Sizes along the split axis: `split` input (opset ≥ 13) or attribute, `num_outputs`
    (opset 18: ceil(length / n) each, the last smaller), or equal parts."""
    count = len(node.outputs)
    sizes = const_ints(cg, node, 1, "split sizes")
    if sizes is None:
        sizes = node.attr("split")
    if sizes is None:
        parts = int(node.attr("num_outputs", count))
        step = -(-length // parts)
        sizes = [min(step, length - i * step) for i in range(parts)]
    return list(sizes)


def lower_split(cg: BirCodeGen, node: Node) -> None:
    x = node.inputs[0]
    shape = tuple(cg.graph.tensors[x].shape)
    axis = int(node.attr("axis", 0)) % len(shape)
    sizes = split_sizes(cg, node, shape[axis])
    if sum(sizes) != shape[axis] or len(sizes) != len(node.outputs):
        raise cg.fail(f"split sizes {sizes} do not cover axis {axis} of {list(shape)}")
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])
    src = cg.dram(x).name
    position = 0
    for out, size in zip(node.outputs, sizes, strict=True):
        if out:
            copy_strided(
                cg,
                cg.dram(out).name,
                Affine(),
                src,
                Affine(position * inner),
                (outer, size * inner),
                (size * inner, 1),
                (shape[axis] * inner, 1),
            )
        position += size


def slice_params(
    cg: BirCodeGen, node: Node, shape: tuple[int, ...]
) -> tuple[list[int], list[int], list[int]]:
    """(start, step, count) per axis, as numpy slicing clamps them."""
    rank = len(shape)
    if cg.graph.opset < 10:
        attrs = node.attrs
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes, steps = list(attrs.get("axes", range(len(starts)))), [1] * len(starts)
    else:
        starts = const_ints(cg, node, 1, "slice starts")
        ends = const_ints(cg, node, 2, "slice ends")
        axes = const_ints(cg, node, 3, "slice axes") or list(range(len(starts)))
        steps = const_ints(cg, node, 4, "slice steps") or [1] * len(starts)
    first, step, count = [0] * rank, [1] * rank, list(shape)
    for start, end, axis, stride in zip(starts, ends, axes, steps, strict=True):
        axis %= rank
        # Python's slice clamps exactly as ONNX specifies (INT_MAX ends, negative steps).
        indices = range(*slice(start, end, stride).indices(shape[axis]))
        first[axis], step[axis], count[axis] = indices.start, stride, len(indices)
    return first, step, count


def lower_slice(cg: BirCodeGen, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x].shape)
    first, step, count = slice_params(cg, node, shape)
    strides = contiguous_strides(shape)
    offset = sum(f * s for f, s in zip(first, strides, strict=True))
    copy_strided(
        cg,
        cg.dram(out).name,
        Affine(),
        cg.dram(x).name,
        Affine(offset),
        tuple(count),
        contiguous_strides(tuple(count)),
        tuple(s * t for s, t in zip(strides, step, strict=True)),
    )


def lower_expand(cg: BirCodeGen, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    out_shape = tuple(cg.graph.tensors[out].shape)
    copy_strided(
        cg,
        cg.dram(out).name,
        Affine(),
        cg.dram(x).name,
        Affine(),
        out_shape,
        contiguous_strides(out_shape),
        broadcast_strides(tuple(cg.graph.tensors[x].shape), out_shape),
    )


def lower_tile(cg: BirCodeGen, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    in_shape = tuple(cg.graph.tensors[x].shape)
    repeats = const_ints(cg, node, 1, "repeats")
    out_strides = contiguous_strides(tuple(cg.graph.tensors[out].shape))
    in_strides = contiguous_strides(in_shape)
    shape, dst, src = [], [], []
    for size, repeat, out_stride, in_stride in zip(
        in_shape, repeats, out_strides, in_strides, strict=True
    ):
        shape += [repeat, size]
        dst += [size * out_stride, out_stride]
        src += [0, in_stride]
    copy_strided(
        cg,
        cg.dram(out).name,
        Affine(),
        cg.dram(x).name,
        Affine(),
        tuple(shape),
        tuple(dst),
        tuple(src),
    )


def pad_amounts(cg: BirCodeGen, node: Node, rank: int) -> list[tuple[int, int]]:
    """(begin, end) per axis from the `pads` attribute (opset < 11) or input, with `axes`."""
    if cg.graph.opset < 11:
        flat = list(node.attrs["pads"])
        axes = list(range(rank))
    else:
        flat = const_ints(cg, node, 1, "pads")
        axes = const_ints(cg, node, 3, "pad axes") or list(range(rank))
    pads = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        pads[axis % rank] = (flat[i], flat[i + len(axes)])
    return pads


def lower_pad(cg: BirCodeGen, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    in_shape = tuple(cg.graph.tensors[x].shape)
    out_shape = tuple(cg.graph.tensors[out].shape)
    rank = len(in_shape)
    mode = node.attr("mode", "constant")
    pads = pad_amounts(cg, node, rank)
    dst, src = cg.dram(out).name, cg.dram(x).name
    if math.prod(out_shape) == 0:
        return
    out_strides, in_strides = contiguous_strides(out_shape), contiguous_strides(in_shape)
    if mode == "constant":
        value: float | object = float(node.attr("value", 0.0))
        if cg.graph.opset >= 11 and len(node.inputs) > 2 and node.inputs[2]:
            info = cg.graph.tensors[node.inputs[2]]
            if info.is_const:
                value = info.const.reshape(-1)[0].item()
            else:
                value = cg.dram_ap(cg.dram(node.inputs[2]).name, Affine(), [(1, 1)])
        if any(begin > 0 or end > 0 for begin, end in pads):
            fill_dram(cg, dst, math.prod(out_shape), cg.dram(out).dtype, value)
    elif mode not in ("edge", "reflect", "wrap"):
        raise cg.fail(f"Pad mode {mode!r} is not supported")
    elif any(begin < 0 or end < 0 for begin, end in pads):
        raise cg.fail(f"negative pads {pads} are supported in constant mode only")
    # The interior: negative pads crop the input.
    crop = [max(0, -begin) for begin, _ in pads]
    inner = [size - max(0, -b) - max(0, -e) for size, (b, e) in zip(in_shape, pads, strict=True)]
    copy_strided(
        cg,
        dst,
        Affine(sum(max(0, b) * s for (b, _), s in zip(pads, out_strides, strict=True))),
        src,
        Affine(sum(c * s for c, s in zip(crop, in_strides, strict=True))),
        tuple(inner),
        out_strides,
        in_strides,
    )
    if mode == "constant":
        return
    # Borders, axis by axis: dims before `axis` are already padded, dims after it not yet.
    for axis, (begin, end) in enumerate(pads):
        size = in_shape[axis]
        if (
            mode == "reflect"
            and max(begin, end) > size - 1
            or mode == "wrap"
            and max(begin, end) > size
        ):
            raise cg.fail(f"{mode} padding of {begin, end} on an axis of {size} is not supported")
        extent = [out_shape[d] if d < axis else in_shape[d] for d in range(rank)]
        base = sum(pads[d][0] * out_strides[d] for d in range(axis + 1, rank))
        stride = out_strides[axis]
        # (destination first index, destination step, source first index, source step, count)
        borders = []
        if begin:
            source = {"edge": (begin, 0), "reflect": (begin + begin, -1), "wrap": (size, 1)}[mode]
            borders.append((0, 1, *source, begin))
        if end:
            last = begin + size - 1
            source = {"edge": (last, 0), "reflect": (last - 1, -1), "wrap": (begin, 1)}[mode]
            borders.append((last + 1, 1, *source, end))
        for dst_first, dst_step, src_first, src_step, count in borders:
            shape = tuple(count if d == axis else extent[d] for d in range(rank))
            dst_strides = tuple(dst_step * s if d == axis else s for d, s in enumerate(out_strides))
            src_strides = tuple(src_step * s if d == axis else s for d, s in enumerate(out_strides))
            copy_strided(
                cg,
                dst,
                Affine(base + dst_first * stride),
                dst,
                Affine(base + src_first * stride),
                shape,
                dst_strides,
                src_strides,
            )
