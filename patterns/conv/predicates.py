"""The kernel predicates of TransformConvOp's registries
(docs/conv_selection.md#functional-registry): one `match_*` per row.

In: a `ConvOp` (the conv in canonical form, `patterns/conv/op.py`) and the registry row's
default kwargs. Out: None to accept, or the reason string to refuse. The reference returns a
bool; the reason lets the report say, entry by entry, why a conv fell back to the generic path.
`is_low_channel_conv_1` is the column-packing gate; it raises ConvOpInvariantError, with the
reference's assertion messages, for a conv whose shapes contradict each other.

Where a threshold is INFERRED (not read from the reference), the choice is written next to it.
"""

from __future__ import annotations

from onnx2bir.bir.opcodes import NUM_PARTITIONS, SBUF_BYTES_PER_PARTITION
from onnx2bir.patterns.conv.op import (
    CANONICAL_INPUT,
    CANONICAL_KERNEL,
    CANONICAL_RESULT,
    ConvOp,
    layout_bridge,
    layout_perm,
    moves_data,
)

# SBUF bytes per partition a kernel may plan for: the compiler keeps ~16 KiB per partition
# for itself (docs/neuroncore.md#memory, the NKI library's usable-SBUF figure).
SBUF_BUDGET = SBUF_BYTES_PER_PARTITION - 16 * 1024
# is_low_channel_conv_1: derived from the shapes, not a fixed C_in (docs/conv_low_channel.md).
# LOW_CHANNEL_MAX is the largest C_in that is low for some kernel: two taps must share the
# partitions.
LOW_CHANNEL_MAX = NUM_PARTITIONS // 2
# match_replication_conv: at least two taps stack on partitions (C_in <= 64, nki-library).
REPLICATION_CHANNEL_MAX = NUM_PARTITIONS // 2
EXPERIMENTAL_KERNEL_ALT_SHAPE = ("b01f", "01io", "b01f")  # NHWC / HWIO / NHWC

Reason = str | None


class ConvOpInvariantError(AssertionError):
    """A conv op whose shapes contradict each other (the reference's assertion messages)."""


# --- predicates ----------------------------------------------------------------------------
def _first(*checks: tuple[bool, str]) -> Reason:
    """The reason of the first failed check, or None when every check holds."""
    for ok, reason in checks:
        if not ok:
            return reason
    return None


def _unit(values: list[int]) -> bool:
    return all(v == 1 for v in values)


def _replicated_input_bytes(op: ConvOp) -> int:
    """Bytes per partition of one image's rows replicated per kernel row (the Pcinh tile)."""
    (out_h, _), (_, in_w) = op.out_spatial, op.in_spatial
    padded_w = in_w + sum(op.padding[1])
    return op.dtype.itemsize * out_h * padded_w


def match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh(op: ConvOp, allow_stride: bool = True) -> Reason:  # noqa: N802 (the reference's name)
    """Dense conv whose C_in x kH rows fit the partitions and whose replica fits SBUF."""
    c_in, kh = op.in_channels, op.kern_spatial[0]
    return _first(
        (not op.is_pglt, "partition-group-local tensor"),
        (op.feature_group_count == 1, f"feature_group_count {op.feature_group_count} != 1"),
        (op.batch_group_count == 1, f"batch_group_count {op.batch_group_count} != 1"),
        (_unit(op.lhs_dilation), f"lhs_dilation {op.lhs_dilation} (transposed conv)"),
        (not op.rhs_reversal, "reversed kernel"),
        (op.dtype.is_float, f"dtype {op.dtype}"),
        (allow_stride or _unit(op.stride), f"stride {op.stride} not allowed"),
        (c_in * kh <= NUM_PARTITIONS, f"C_in x kH = {c_in} x {kh} > {NUM_PARTITIONS} partitions"),
        (
            _replicated_input_bytes(op) <= SBUF_BUDGET,
            f"replicated input {_replicated_input_bytes(op)} B/partition > {SBUF_BUDGET} B",
        ),
    )


def match_conv_depthwise_backward(op: ConvOp, kernel_layout: str) -> Reason:
    """Depthwise conv in the backward (transposed) form: grouped on batch_group_count.

    Registered twice, one row per kernel layout (`kernel_layout`: "oi01" for
    conv2d_column_packing_1, "io10" for conv2d_column_packing_io10). The dispatcher bridges any
    layout, so the rows differ in what the bridge costs: a row accepts a kernel that reaches
    its layout without moving data (the transpose only relabels unit axes). An ONNX depthwise
    ConvTranspose weight [C, 1, kH, kW] (io01) reaches oi01 by swapping C with the unit axis,
    so the first row takes it; a weight whose spatial axes arrive swapped (io10, e.g. read
    through a Transpose of a computed weight) would move every tap to reach oi01 and takes the
    second row. docs/conv_backward.md derives the binding.
    """
    bridge = layout_bridge(op.kern_perm, layout_perm(kernel_layout, CANONICAL_KERNEL))
    groups = op.batch_group_count
    return _first(
        (op.rhs_reversal, "not a backward (transposed) conv"),
        (op.feature_group_count == 1, f"feature_group_count {op.feature_group_count} != 1"),
        (
            groups == op.in_channels == op.out_channels,
            f"not depthwise (batch_group_count {groups}, C_in {op.in_channels}, "
            f"C_out {op.out_channels})",
        ),
        (
            not moves_data(op.kern_shape, bridge),
            f"kernel {list(op.kern_shape)} reaches {kernel_layout} only by moving data "
            f"(transpose {list(bridge)})",
        ),
    )


def match_Conv1d_depthwise_bf01_oi01_bf01(op: ConvOp) -> Reason:  # noqa: N802
    """1-D depthwise: unit height everywhere, one channel per group, forward form."""
    (in_h, _), (k_h, _), (out_h, _) = op.in_spatial, op.kern_spatial, op.out_spatial
    return _first(
        (in_h == 1 and k_h == 1 and out_h == 1, "not 1-D (height is not 1)"),
        (
            op.feature_group_count == op.in_channels == op.out_channels,
            f"not depthwise (groups {op.feature_group_count}, C_in {op.in_channels})",
        ),
        (op.batch_group_count == 1, f"batch_group_count {op.batch_group_count} != 1"),
        (not op.rhs_reversal and _unit(op.lhs_dilation), "backward form"),
        (op.padding[0] == (0, 0) and op.stride[0] == 1, "padding or stride on the unit axis"),
    )


def match_conv2d_depthwise_f01b_o01i_bf01(op: ConvOp) -> Reason:
    """Direct depthwise on VectorE: one channel per group, forward form."""
    return _first(
        (_unit(op.lhs_dilation), f"lhs_dilation {op.lhs_dilation}"),
        (op.batch_group_count == 1, f"batch_group_count {op.batch_group_count} != 1"),
        (
            op.feature_group_count == op.in_channels,
            f"feature_group_count {op.feature_group_count} != C_in {op.in_channels}",
        ),
        (
            op.in_shape[op.in_perm[1]] == op.kern_shape[op.kern_perm[0]],
            f"C_in {op.in_channels} != kernel O {op.kern_shape[op.kern_perm[0]]}",
        ),
        (not op.rhs_reversal, "reversed kernel"),
    )


def match_conv_depthwise_forward(op: ConvOp) -> Reason:
    """Stride-[3, 3] forward depthwise (the reference's one numeric constant)."""
    return _first(
        (_unit(op.lhs_dilation), f"lhs_dilation {op.lhs_dilation}"),
        (
            op.feature_group_count == op.in_channels == op.out_channels,
            f"not depthwise (groups {op.feature_group_count}, C_in {op.in_channels})",
        ),
        (_unit(op.rhs_dilation), f"rhs_dilation {op.rhs_dilation}"),
        (op.stride == [3, 3], f"stride {op.stride} != [3, 3]"),
    )


def is_low_channel_conv_1(op: ConvOp) -> bool:
    """The column-packing gate: the structural equalities hold and C_in is low."""
    c_in, c_out = op.in_channels, op.out_channels
    if op.res_shape[op.out_perm[0]] != op.in_shape[op.in_perm[0]]:
        raise ConvOpInvariantError("Convolution output batch must match input batch")
    kernel_in = op.kern_shape[op.kern_perm[1]] * op.feature_group_count
    if c_in != kernel_in:
        raise ConvOpInvariantError("Convolution input channels must match kernel input channels")
    if c_out != op.kern_shape[op.kern_perm[0]]:
        raise ConvOpInvariantError("Convolution output channels must match kernel output channels")
    return is_low_channel(c_in, op.taps)


def taps_per_matmul(c_in: int) -> int:
    """How many filter taps of C_in channels stack on the PE array's partitions."""
    return NUM_PARTITIONS // c_in if 0 < c_in <= NUM_PARTITIONS else 0


def is_low_channel(c_in: int, taps: int) -> bool:
    """C_in is low for a kernel of `taps` taps when stacking taps on the partitions at least
    halves the matmuls: 2 · ⌈taps / ⌊128 / C_in⌋⌉ ≤ taps (docs/conv_low_channel.md)."""
    fit = taps_per_matmul(c_in)
    if fit == 0 or taps < 2:
        return False
    return 2 * -(-taps // fit) <= taps


def match_low_channel_conv(op: ConvOp) -> Reason:
    reason = _first(
        (op.feature_group_count == 1, f"feature_group_count {op.feature_group_count} != 1"),
        (op.batch_group_count == 1, f"batch_group_count {op.batch_group_count} != 1"),
        (_unit(op.lhs_dilation) and not op.rhs_reversal, "backward form"),
    )
    # The gate's assertions hold only for forward convs, so it runs after the form checks.
    if reason is None and not is_low_channel_conv_1(op):
        fit = taps_per_matmul(op.in_channels)
        if op.taps < 2:
            reason = "a 1x1 kernel: no taps to stack"
        elif fit == 0:
            reason = (
                f"C_in {op.in_channels} is not low: one tap fills > {NUM_PARTITIONS} partitions"
            )
        else:
            packed = -(-op.taps // fit)
            reason = (
                f"C_in {op.in_channels} is not low: {fit} of {op.taps} taps per matmul gives "
                f"{packed} matmuls, not at most half of {op.taps}"
            )
    return reason


def match_replication_conv(op: ConvOp) -> Reason:
    """K-replication: a dense forward conv with C_in small enough to stack two taps."""
    return _first(
        (op.feature_group_count == 1, f"feature_group_count {op.feature_group_count} != 1"),
        (op.batch_group_count == 1, f"batch_group_count {op.batch_group_count} != 1"),
        (_unit(op.lhs_dilation) and not op.rhs_reversal, "backward form"),
        (
            op.in_channels <= REPLICATION_CHANNEL_MAX,
            f"C_in {op.in_channels} > {REPLICATION_CHANNEL_MAX}, no two taps stack",
        ),
        (op.kern_spatial[0] > 1, "kernel height 1: nothing to replicate"),
    )


def match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh2(op: ConvOp) -> Reason:  # noqa: N802
    """Pure layout predicate: the op is already in the alternative (NHWC) layout."""
    in_layout, kern_layout, out_layout = EXPERIMENTAL_KERNEL_ALT_SHAPE
    return _first(
        (tuple(op.in_perm) == layout_perm(in_layout, CANONICAL_INPUT), "input is not NHWC"),
        (tuple(op.kern_perm) == layout_perm(kern_layout, CANONICAL_KERNEL), "kernel is not HWIO"),
        (tuple(op.out_perm) == layout_perm(out_layout, CANONICAL_RESULT), "result is not NHWC"),
        (op.in_shape[op.in_perm[1]] <= NUM_PARTITIONS, "C_in > 128"),
    )


def match_Conv2d_pbp_0f1b_0i1o_01fb_experimental_1(op: ConvOp) -> Reason:  # noqa: N802
    """Disabled in this build: a single `return False` with no attribute reads."""
    return "experimental pbp kernel: matcher disabled"


def match_Conv2d_pbp_fb01_io01_01bf_experimental_1(op: ConvOp) -> Reason:  # noqa: N802
    """Disabled in this build: a single `return False` with no attribute reads."""
    return "experimental pbp kernel: matcher disabled"
