"""Generic lowering of Resize (opset 11-19): nearest as strided DMA gathers, linear and cubic
as matmuls with constant interpolation matrices.

Per resized axis the source coordinate of output index x follows
`coordinate_transformation_mode` (half_pixel, half_pixel_symmetric, pytorch_half_pixel,
align_corners, asymmetric, tf_half_pixel_for_nn), evaluated in fp32 in onnxruntime's order of
operations, with the scale taken from `scales` or, given `sizes`, as out / in
(keep_aspect_ratio_policy applied).

- nearest: `nearest_mode` rounds each source coordinate to an index, so an axis is a list of
  source indices. The list is split into segments of the form `b + q·S + t·T` (q < Q, t < R:
  an integer upsample is one segment with T = 0, a downsample one with R = 1, a 3/2 upsample
  two), and every combination of one segment per axis is one DRAM→DRAM DMA whose access
  pattern walks it.
- linear / cubic (the last two axes; others must keep their size): the interpolation is
  separable, out = A · X · Bᵀ per plane, with A [out_h, in_h] and B [out_w, in_w] holding each
  output's tap weights (2 taps linear, 4 taps cubic with cubic_coeff_a and exclude_outside).
  On the PE array: `Y1ᵀ[w, oh] = Σ_h X[h, w] · Aᵀ[h, oh]` (the plane is the stationary operand
  as it sits in memory, so no transpose is needed), then `out[oh, ow] = Σ_w Y1ᵀ[w, oh] ·
  Bᵀ[w, ow]`, contraction dims tiled by 128 and accumulated in PSUM.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2bir.bir.enums import ActFunc, Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.data import copy_dram, copy_strided
from onnx2bir.codegen.tiling import Affine, contiguous_strides, tiles
from onnx2bir.graph import Node

F32 = np.float32


def source_coordinates(mode: str, out_len: int, in_len: int, scale: float) -> np.ndarray:
    """Source coordinate of each output index, in fp32 as onnxruntime computes it."""
    x = np.arange(out_len, dtype=F32)
    s = F32(scale)
    half = F32(0.5)
    if mode == "half_pixel":
        return (x + half) / s - half
    if mode == "half_pixel_symmetric":  # onnxruntime finishes this one in double
        adjustment = F32(out_len) / (s * F32(in_len))
        offset = F32(in_len) / F32(2) * (F32(1) - adjustment)
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(F32)
    if mode == "pytorch_half_pixel":
        return (x + half) / s - half if out_len > 1 else np.zeros(out_len, F32)
    if mode == "align_corners":
        if out_len == 1:
            return np.zeros(1, F32)
        return x * F32(in_len - 1) / F32(out_len - 1)
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / s
    raise ValueError(mode)


def nearest_indices(coords: np.ndarray, mode: str, in_len: int) -> np.ndarray:
    if mode == "round_prefer_floor":
        ties = coords == np.trunc(coords) + F32(0.5)
        rounded = np.where(
            ties, np.floor(coords), np.sign(coords) * np.floor(np.abs(coords) + F32(0.5))
        )
    elif mode == "round_prefer_ceil":
        rounded = np.sign(coords) * np.floor(np.abs(coords) + F32(0.5))
    elif mode == "floor":
        rounded = np.floor(coords)
    elif mode == "ceil":
        rounded = np.ceil(coords)
    else:
        raise ValueError(mode)
    return np.clip(rounded.astype(np.int64), 0, in_len - 1)


def linear_matrix(coords: np.ndarray, in_len: int) -> np.ndarray:
    """[out, in]: two taps per output, onnxruntime's clamp and weights."""
    coords = np.clip(coords, F32(0), F32(in_len - 1))
    low = np.minimum(coords.astype(np.int64), in_len - 1)
    high = np.minimum(low + 1, in_len - 1)
    w_low = np.abs(coords - low.astype(F32))  # weight of the high tap
    w_high = np.abs(coords - high.astype(F32))  # weight of the low tap
    same = low == high
    w_low[same] = w_high[same] = F32(0.5)
    matrix = np.zeros((len(coords), in_len), F32)
    rows = np.arange(len(coords))
    np.add.at(matrix, (rows, low), w_high)
    np.add.at(matrix, (rows, high), w_low)
    return matrix


def cubic_matrix(coords: np.ndarray, in_len: int, a: float, exclude_outside: bool) -> np.ndarray:
    """[out, in]: four taps per output (Keys cubic with parameter a), edges replicated or, with
    exclude_outside, dropped and the remaining weights renormalised."""
    a = F32(a)
    base = np.floor(coords)
    s = (coords - base).astype(F32)
    one, two = F32(1), F32(2)
    weights = np.stack(
        [
            ((a * (s + one) - F32(5) * a) * (s + one) + F32(8) * a) * (s + one) - F32(4) * a,
            ((a + two) * s - (a + F32(3))) * s * s + one,
            ((a + two) * (one - s) - (a + F32(3))) * (one - s) * (one - s) + one,
            ((a * (two - s) - F32(5) * a) * (two - s) + F32(8) * a) * (two - s) - F32(4) * a,
        ],
        -1,
    ).astype(F32)
    taps = base.astype(np.int64)[:, None] + np.arange(-1, 3)[None, :]
    if exclude_outside:
        inside = (taps >= 0) & (taps < in_len)
        weights = np.where(inside, weights, F32(0))
        weights = weights / weights.sum(-1, keepdims=True)
    matrix = np.zeros((len(coords), in_len), F32)
    rows = np.repeat(np.arange(len(coords)), 4)
    np.add.at(matrix, (rows, np.clip(taps, 0, in_len - 1).reshape(-1)), weights.reshape(-1))
    return matrix


MAX_PERIOD = 64


def segments(src: np.ndarray) -> list[tuple[int, int, int, int, int, int, int]]:
    """Split an axis' source indices into (out start, Q, out step, R, src start, S, T): the
    outputs start + q·step + t take src start + q·S + t·T, for q < Q and t < R.

    Greedy from the left: the stretch is the longest prefix periodic with some period P ≤
    MAX_PERIOD (src[i + P] = src[i] + S; an upsample by 3/2 has P = 3, S = 2), and each run of
    its P phases that step evenly is one segment of Q = ⌈(length − phase) / P⌉ outputs.
    """
    found = []
    position, total = 0, len(src)
    while position < total:
        rest = src[position:]
        best_length, best_period = 1, 1
        for period in range(1, min(MAX_PERIOD, len(rest) - 1) + 1):
            shift = rest[period] - rest[0]
            bad = np.nonzero(rest[period:] - rest[:-period] - shift)[0]
            length = period + (bad[0] if len(bad) else len(rest) - period)
            if length > best_length:
                best_length, best_period = length, period
        length, period = best_length, best_period
        shift = int(rest[period] - rest[0]) if period < len(rest) else 0
        phase = 0
        while phase < min(period, length):
            count = -(-(length - phase) // period)
            run = 1
            step = int(rest[phase + 1] - rest[phase]) if phase + 1 < min(period, length) else 0
            while (
                phase + run < min(period, length)
                and -(-(length - phase - run) // period) == count
                and rest[phase + run] - rest[phase + run - 1] == step
            ):
                run += 1
            found.append(
                (
                    position + phase,
                    count,
                    period,
                    run,
                    int(rest[phase]),
                    shift,
                    step if run > 1 else 0,
                )
            )
            phase += run
        position += length
    return found


def _scales(cg: BirCodeGen, node: Node, in_shape, out_shape) -> list[float]:
    """Per-axis scale for the coordinate transform."""
    rank = len(in_shape)
    attrs = node.attrs
    inputs = [*node.inputs, "", "", "", ""]
    scales_name = inputs[1] if cg.graph.opset < 11 else inputs[2]
    axes = [a % rank for a in attrs.get("axes", range(rank))]
    scales = [1.0] * rank
    if scales_name and math.prod(cg.graph.tensors[scales_name].shape) > 0:
        info = cg.graph.tensors[scales_name]
        if not info.is_const:
            raise cg.fail("Resize scales must be constants")
        for axis, value in zip(axes, info.const.reshape(-1), strict=True):
            scales[axis] = float(F32(value))
        return scales
    policy = attrs.get("keep_aspect_ratio_policy", "stretch")
    ratios = {a: float(F32(out_shape[a]) / F32(in_shape[a])) for a in axes}
    if policy != "stretch":
        sizes_info = cg.graph.tensors[inputs[3]]
        if not sizes_info.is_const:
            raise cg.fail(f"Resize sizes must be constants with keep_aspect_ratio_policy={policy}")
        sizes = [int(v) for v in sizes_info.const.reshape(-1)]
        requested = [float(F32(s) / F32(in_shape[a])) for a, s in zip(axes, sizes, strict=True)]
        common = min(requested) if policy == "not_larger" else max(requested)
        ratios = dict.fromkeys(axes, common)
    for axis in axes:
        scales[axis] = ratios[axis]
    return scales


def lower_resize(cg: BirCodeGen, node: Node) -> None:
    attrs = node.attrs
    x, out = node.inputs[0], node.outputs[0]
    in_shape = tuple(cg.graph.tensors[x].shape)
    out_shape = tuple(cg.graph.tensors[out].shape)
    if cg.graph.opset < 11:
        raise cg.fail("Resize before opset 11 is not supported")
    mode = attrs.get("mode", "nearest")
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    if transform == "tf_crop_and_resize":
        raise cg.fail("coordinate_transformation_mode tf_crop_and_resize is not supported")
    if math.prod(out_shape) == 0:
        return
    scales = _scales(cg, node, in_shape, out_shape)
    if in_shape == out_shape:  # onnxruntime copies the input then, whatever the scales
        copy_dram(cg, cg.dram(out).name, cg.dram(x).name, math.prod(out_shape))
        return
    coords = [
        None if s == 1.0 else source_coordinates(transform, o, i, s)
        for o, i, s in zip(out_shape, in_shape, scales, strict=True)
    ]
    if mode == "nearest":
        nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")
        indices = [
            np.arange(i) if c is None else nearest_indices(c, nearest_mode, i)
            for c, i in zip(coords, in_shape, strict=True)
        ]
        _resize_nearest(cg, x, out, in_shape, out_shape, indices)
        return
    if mode not in ("linear", "cubic"):
        raise cg.fail(f"Resize mode {mode!r} is not supported")
    if attrs.get("antialias", 0) and any(s < 1.0 for s in scales):
        raise cg.fail("antialiased downsampling is not supported")
    rank = len(in_shape)
    if any(c is not None for c in coords[: max(0, rank - 2)]):
        raise cg.fail(f"{mode} Resize of axes other than the last two is not supported")

    def matrix(axis: int) -> np.ndarray:
        if axis < 0 or coords[axis] is None:
            size = in_shape[axis] if axis >= 0 else 1
            return np.eye(size, dtype=F32)
        if mode == "linear":
            return linear_matrix(coords[axis], in_shape[axis])
        return cubic_matrix(
            coords[axis],
            in_shape[axis],
            float(attrs.get("cubic_coeff_a", -0.75)),
            bool(attrs.get("exclude_outside", 0)),
        )

    _resize_separable(cg, x, out, in_shape, out_shape, matrix(rank - 2), matrix(rank - 1))


def _resize_nearest(cg, x, out, in_shape, out_shape, indices) -> None:
    in_strides, out_strides = contiguous_strides(in_shape), contiguous_strides(out_shape)
    per_axis = []
    for axis, src in enumerate(indices):
        if len(src) == in_shape[axis] and np.array_equal(src, np.arange(in_shape[axis])):
            per_axis.append([(0, [(in_shape[axis], out_strides[axis], in_strides[axis])], 0)])
            continue
        options = []
        for start, count, out_step, run, src_start, shift, step in segments(src):
            dims = [
                (count, out_step * out_strides[axis], shift * in_strides[axis]),
                (run, out_strides[axis], step * in_strides[axis]),
            ]
            options.append((start * out_strides[axis], dims, src_start * in_strides[axis]))
        per_axis.append(options)
    dst, source = cg.dram(out).name, cg.dram(x).name

    def walk(axis: int, dst_off: int, src_off: int, dims: list) -> None:
        if axis == len(per_axis):
            shape = tuple(d[0] for d in dims)
            copy_strided(
                cg,
                dst,
                Affine(dst_off),
                source,
                Affine(src_off),
                shape,
                tuple(d[1] for d in dims),
                tuple(d[2] for d in dims),
            )
            return
        for out_start, axis_dims, src_start in per_axis[axis]:
            walk(axis + 1, dst_off + out_start, src_off + src_start, dims + axis_dims)

    walk(0, 0, 0, [])


def _resize_separable(cg, x, out, in_shape, out_shape, rows_matrix, cols_matrix) -> None:
    """out[p] = A · X[p] · Bᵀ for every plane p, on the PE array."""
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    in_h, in_w = (in_shape[-2] if len(in_shape) > 1 else 1), in_shape[-1]
    out_h, out_w = (out_shape[-2] if len(out_shape) > 1 else 1), out_shape[-1]
    planes = math.prod(in_shape[:-2])
    h_tiles = [(s, min(p, in_h - s)) for s in range(0, in_h, p)]
    w_tiles = [(s, min(p, in_w - s)) for s in range(0, in_w, p)]
    name = cg.origin.node

    def resident(tag: str, matrix: np.ndarray, row_tiles) -> tuple:
        """matrixᵀ [in, out] in SBUF, one column block per 128 input rows."""
        loc = cg.add_dram_const(f"{name}/{tag}", np.ascontiguousarray(matrix.T))
        tile = cg.sb_tile(tag, p, len(row_tiles) * matrix.shape[0], fp32)
        for index, (start, size) in enumerate(row_tiles):
            cg.dma(
                cg.ap(tile, [(1, matrix.shape[0])], index * matrix.shape[0], partitions=size),
                cg.dram_ap(
                    loc.name,
                    Affine(start * matrix.shape[0]),
                    [(matrix.shape[0], size), (1, matrix.shape[0])],
                ),
            )
        return tile

    a_t = resident("rows_weights", rows_matrix, h_tiles)
    b_t = resident("cols_weights", cols_matrix, w_tiles)
    plane_sb = cg.sb_tile("plane", p, len(h_tiles) * in_w, fp32)
    mid = cg.sb_tile("mid", p, len(w_tiles) * out_h, fp32)
    result = cg.sb_tile("result", p, MATMUL_MAX_MOVING_FREE, fp32)
    acc = cg.psum_tile("acc", p, MATMUL_MAX_MOVING_FREE)
    x_loc, y_loc = cg.dram(x).name, cg.dram(out).name
    chunks = MATMUL_MAX_MOVING_FREE
    for plane in tiles(cg, planes, 1, "plane"):
        for index, (start, size) in enumerate(h_tiles):
            cg.dma(
                cg.ap(plane_sb, [(1, in_w)], index * in_w, partitions=size),
                cg.dram_ap(
                    x_loc, plane.start * (in_h * in_w) + start * in_w, [(in_w, size), (1, in_w)]
                ),
            )
        # Y1ᵀ[w, oh] = Σ_h X[h, w] · Aᵀ[h, oh]
        for w_index, (w_start, w_size) in enumerate(w_tiles):
            for oh in range(0, out_h, chunks):
                oh_size = min(chunks, out_h - oh)
                psum = cg.ap(acc, [(1, oh_size)], partitions=w_size)
                for h_index, (_, h_size) in enumerate(h_tiles):
                    cg.matmul(
                        psum,
                        cg.ap(plane_sb, [(1, w_size)], h_index * in_w + w_start, partitions=h_size),
                        cg.ap(a_t, [(1, oh_size)], h_index * out_h + oh, partitions=h_size),
                        accumulate=h_index > 0,
                    )
                cg.activation(
                    cg.ap(mid, [(1, oh_size)], w_index * out_h + oh, partitions=w_size),
                    psum,
                    ActFunc.COPY,
                )
        # out[oh, ow] = Σ_w Y1ᵀ[w, oh] · Bᵀ[w, ow]
        for oh in range(0, out_h, p):
            oh_size = min(p, out_h - oh)
            for ow in range(0, out_w, chunks):
                ow_size = min(chunks, out_w - ow)
                psum = cg.ap(acc, [(1, ow_size)], partitions=oh_size)
                for w_index, (_, w_size) in enumerate(w_tiles):
                    cg.matmul(
                        psum,
                        cg.ap(mid, [(1, oh_size)], w_index * out_h + oh, partitions=w_size),
                        cg.ap(b_t, [(1, ow_size)], w_index * out_w + ow, partitions=w_size),
                        accumulate=w_index > 0,
                    )
                res = cg.ap(result, [(1, ow_size)], partitions=oh_size)
                cg.activation(res, psum, ActFunc.COPY)
                cg.dma(
                    cg.dram_ap(
                        y_loc,
                        plane.start * (out_h * out_w) + oh * out_w + ow,
                        [(out_w, oh_size), (1, ow_size)],
                    ),
                    res,
                )
