"""TransformConvOp (seed 000): choose a kernel for each 2-D convolution, or record why not.

Two ordered registries of `KernelInfo`: FUNCTIONAL_KERNEL_REGISTRY, always walked, and
EXPERIMENTAL_KERNEL_REGISTRY, walked only when `experimental_convolution_kernel_match` is on.
A walk is first-match-wins, so list order is selection priority. On a match the conv's tensors
are bridged to the kernel's layout (Transpose nodes, folded at once for constant weights,
inserted only when the bridge is not the identity or the entry sets `insert_transpose`), the
attributes are marshalled by the entry's builder, and the conv is replaced by a NativeKernel
node whose `func_name` is the kernel name; codegen finds the tracer by that name.

One deliberate difference from the reference: a predicate returns None to accept and a reason
string to refuse (the reference returns a bool), so the report can say, entry by entry, why a
conv fell back to the generic path. The walk itself is unchanged.

Where the seed marks something INFERRED, the choice made here is written next to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS, SBUF_BYTES_PER_PARTITION
from onnx2bir.graph import Graph, TensorInfo
from onnx2bir.options import CompileOptions
from onnx2bir.passes import PassResult, Statistic
from onnx2bir.patterns.conv_op import (
    CANONICAL_INPUT,
    CANONICAL_KERNEL,
    CANONICAL_RESULT,
    ConvOp,
    Perm,
    apply_perm_to_dims,
    conv_op_from_node,
    get_bridging_output_perm,
    get_bridging_perm,
    invert_perm,
    is_identity,
    layout_perm,
)

log = logging.getLogger("onnx2bir.TransformConvOp")

# SBUF bytes per partition a kernel may plan for: the compiler keeps ~16 KiB per partition
# for itself (trainium_facts.md §1, nki-library usable-SBUF figure).
SBUF_BUDGET = SBUF_BYTES_PER_PARTITION - 16 * 1024
# is_low_channel_conv_1: "low" means at least four filter taps fit beside the channels on the
# 128 partitions (INFERRED threshold; the K-replication kernels stack 4 taps when C_in <= 32).
LOW_CHANNEL_MAX = NUM_PARTITIONS // 4
# match_replication_conv: at least two taps stack on partitions (C_in <= 64, nki-library).
REPLICATION_CHANNEL_MAX = NUM_PARTITIONS // 2
EXPERIMENTAL_KERNEL_ALT_SHAPE = ("b01f", "01io", "b01f")  # NHWC / HWIO / NHWC

Reason = str | None


class ConvOpInvariantError(AssertionError):
    """A conv op whose shapes contradict each other (the seed's assertion messages)."""


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


def match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh(op: ConvOp, allow_stride: bool = True) -> Reason:  # noqa: N802 (seed's name)
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


def match_conv_depthwise_backward(op: ConvOp, kernel_io: bool) -> Reason:
    """Depthwise conv in backward (transposed) form: dilated input, unit rhs dilation.

    Registered twice (seed: "two shapes"). INFERRED binding: the row for an o-first kernel
    ("oi01") is conv2d_column_packing_1, the row for an i-first kernel ("io", as ONNX stores
    ConvTranspose weights) is conv2d_column_packing_io10; `kernel_io` says which.
    """
    io_first = op.kern_perm[0] != 0  # the canonical o axis is not stored first
    return _first(
        (op.batch_group_count == 1, f"batch_group_count {op.batch_group_count} != 1"),
        (not _unit(op.lhs_dilation) or op.rhs_reversal, "not a backward (transposed) conv"),
        (_unit(op.rhs_dilation), f"rhs_dilation {op.rhs_dilation}"),
        (
            op.feature_group_count == op.in_channels == op.out_channels,
            f"not depthwise (groups {op.feature_group_count}, C_in {op.in_channels}, "
            f"C_out {op.out_channels})",
        ),
        (io_first == kernel_io, f"kernel stored {'io' if io_first else 'oi'}-first"),
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
    """Stride-[3, 3] forward depthwise (the seed's one numeric constant)."""
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
    return c_in <= LOW_CHANNEL_MAX and op.taps > 1


def match_low_channel_conv(op: ConvOp) -> Reason:
    reason = _first(
        (op.feature_group_count == 1, f"feature_group_count {op.feature_group_count} != 1"),
        (op.batch_group_count == 1, f"batch_group_count {op.batch_group_count} != 1"),
        (_unit(op.lhs_dilation) and not op.rhs_reversal, "backward form"),
    )
    # The gate's assertions hold only for forward convs, so it runs after the form checks.
    if reason is None and not is_low_channel_conv_1(op):
        reason = f"C_in {op.in_channels} is not low (> {LOW_CHANNEL_MAX}) or a 1x1 kernel"
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


# --- attribute marshalling -----------------------------------------------------------------
def get_kernel_attr(op: ConvOp) -> dict:
    """The kernel's attributes, keys in the seed's insertion order (py:513).

    The seed's "tensor-shape key" is spelled here as three keys, input/kernel/result shape,
    in that order at that position.
    """
    return {
        "stride": list(op.stride),
        "padding": [list(pair) for pair in op.padding],
        "rhs_dilation": list(op.rhs_dilation),
        "lhs_dilation": list(op.lhs_dilation),
        "in_perm": list(op.in_perm),
        "kern_perm": list(op.kern_perm),
        "out_perm": list(op.out_perm),
        "input_shape": list(op.in_shape),
        "kernel_shape": list(op.kern_shape),
        "result_shape": list(op.res_shape),
        "batch_group_count": op.batch_group_count,
        "feature_group_count": op.feature_group_count,
        # Beyond the seed's key set: the transposed-conv kernels must know the kernel flip.
        "rhs_reversal": op.rhs_reversal,
    }


def get_kernel_attr_same_hl_pad(op: ConvOp) -> dict:
    """The sibling builder for kernels written for one pad per side (py:528).

    It rewrites only padding and stride: each spatial dim's (low, high) pair is kept as the
    kernel reads it, and `same_hl_pad` records whether low == high everywhere. The vector
    depthwise kernels use it; they pad by (low, high) explicitly either way.
    """
    attrs = get_kernel_attr(op)
    attrs["stride"] = [int(s) for s in op.stride]
    attrs["padding"] = [[int(low), int(high)] for low, high in op.padding]
    attrs["same_hl_pad"] = all(low == high for low, high in op.padding)
    return attrs


# --- registry --------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelInfo:
    """A registry row: `match` is (predicate, default kwargs), as in the seed."""

    name: str
    match: tuple[Callable[..., Reason], dict]
    in_layout: str  # the kernel's tensor layouts, as axis letters
    kern_layout: str
    out_layout: str
    get_kernel_attr: Callable[[ConvOp], dict] = get_kernel_attr
    insert_transpose: bool = False
    label: str = ""  # short name for reports

    def in_perm(self, op: ConvOp) -> Perm:
        return layout_perm(self.in_layout, CANONICAL_INPUT)

    def kern_perm(self, op: ConvOp) -> Perm:
        return layout_perm(self.kern_layout, CANONICAL_KERNEL)

    def out_perm(self, op: ConvOp) -> Perm:
        return layout_perm(self.out_layout, CANONICAL_RESULT)


REP_NHWC = "Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh"
COLUMN_PACKING = "conv2d_column_packing"
COLUMN_PACKING_1 = "conv2d_column_packing_1"
COLUMN_PACKING_IO10 = "conv2d_column_packing_io10"
CONV1D_DEPTHWISE = "Conv1d_depthwise_bf01_oi01_bf01"
CONV2D_DEPTHWISE = "conv2d_depthwise_f01b_o01i_bf01"
PBP_0F1B = "Conv2d_pbp_0f1b_0i1o_01fb_experimental_1"
PBP_FB01 = "Conv2d_pbp_fb01_io01_01bf_experimental_1"
KERNEL_NAMES = (
    REP_NHWC,
    COLUMN_PACKING,
    COLUMN_PACKING_1,
    COLUMN_PACKING_IO10,
    CONV1D_DEPTHWISE,
    CONV2D_DEPTHWISE,
    PBP_0F1B,
    PBP_FB01,
)

# Priority order. The unique-name rows sit where the seed puts them; the column-packing trio's
# slots are INFERRED (see match_conv_depthwise_backward and match_low_channel_conv). The
# seed's priorities 7-8 are not named; the low-channel gate takes 7.
FUNCTIONAL_KERNEL_REGISTRY: list[KernelInfo] = [
    # 1: dense conv through C_in x kH replication on the PE array.
    KernelInfo(
        REP_NHWC,
        (match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh, {"allow_stride": True}),
        "fb01",
        "io01",
        "01bf",
        label="rep_nhwc",
    ),
    # 2 and 4: transposed depthwise, two kernel shapes.
    KernelInfo(
        COLUMN_PACKING_1,
        (match_conv_depthwise_backward, {"kernel_io": False}),
        "bf01",
        "oi01",
        "bf01",
        label="column_packing_1",
    ),
    # 3: 1-D depthwise.
    KernelInfo(
        CONV1D_DEPTHWISE,
        (match_Conv1d_depthwise_bf01_oi01_bf01, {}),
        "bf01",
        "oi01",
        "bf01",
        get_kernel_attr_same_hl_pad,
        label="conv1d_depthwise",
    ),
    KernelInfo(
        COLUMN_PACKING_IO10,
        (match_conv_depthwise_backward, {"kernel_io": True}),
        "bf01",
        "io10",
        "bf01",
        label="column_packing_io10",
    ),
    # 5: direct 2-D depthwise on VectorE.
    KernelInfo(
        CONV2D_DEPTHWISE,
        (match_conv2d_depthwise_f01b_o01i_bf01, {}),
        "f01b",
        "o01i",
        "bf01",
        get_kernel_attr_same_hl_pad,
        label="conv2d_depthwise",
    ),
    # 6: stride-3 forward depthwise. Every conv it accepts is accepted by row 5 first, so in
    # this registry it is shadowed; kept for fidelity (the report's walk shows it).
    KernelInfo(
        CONV2D_DEPTHWISE,
        (match_conv_depthwise_forward, {}),
        "f01b",
        "o01i",
        "bf01",
        get_kernel_attr_same_hl_pad,
        label="depthwise_forward_s3",
    ),
    # 7: low-channel forward conv: filter taps stacked on partitions.
    KernelInfo(
        COLUMN_PACKING, (match_low_channel_conv, {}), "bf01", "oi01", "bf01", label="column_packing"
    ),
    # 9: K-replication, the general dense path (same kernel as row 1, partial replication).
    KernelInfo(REP_NHWC, (match_replication_conv, {}), "fb01", "io01", "01bf", label="replication"),
    # 10: the rep-NHWC kernel for an op already in the alternative layout.
    KernelInfo(
        REP_NHWC,
        (match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh2, {}),
        "fb01",
        "io01",
        "01bf",
        label="rep_nhwc_Pcinh2",
    ),
]

EXPERIMENTAL_KERNEL_REGISTRY: list[KernelInfo] = [
    KernelInfo(
        PBP_0F1B,
        (match_Conv2d_pbp_0f1b_0i1o_01fb_experimental_1, {}),
        "0f1b",
        "0i1o",
        "01fb",
        label="pbp_0f1b",
    ),
    KernelInfo(
        PBP_FB01,
        (match_Conv2d_pbp_fb01_io01_01bf_experimental_1, {}),
        "fb01",
        "io01",
        "01bf",
        label="pbp_fb01",
    ),
]


# --- the pass ----------------------------------------------------------------------------------
@dataclass
class Selection:
    """The outcome of one registry walk for one conv."""

    op: ConvOp
    kernel: KernelInfo | None = None
    refusals: list[tuple[str, str]] = field(default_factory=list)  # (entry label, reason)

    @property
    def fallback_reason(self) -> str | None:
        if self.kernel is not None:
            return None
        return "; ".join(f"{label}: {reason}" for label, reason in self.refusals)


def walk_registry(op: ConvOp, registry: list[KernelInfo], selection: Selection) -> bool:
    """match_and_replace_kernel's loop: the first entry whose predicate accepts wins."""
    for info in registry:
        predicate, defaults = info.match
        reason = predicate(op, **defaults)
        if reason is None:
            selection.kernel = info
            return True
        selection.refusals.append((info.label, reason))
    return False


def select_kernel(op: ConvOp, options: CompileOptions, is_pglt: bool = False) -> Selection:
    """transformConvTensorOp's decision, without touching the graph."""
    op.is_pglt = is_pglt
    selection = Selection(op)
    if walk_registry(op, FUNCTIONAL_KERNEL_REGISTRY, selection):
        return selection
    if not options.experimental_convolution_kernel_match:
        return selection
    if not walk_registry(op, EXPERIMENTAL_KERNEL_REGISTRY, selection):
        log.debug("DIDN'T MATCH KERNEL FOR: %s", op.describe())
    return selection


@dataclass(frozen=True)
class TransformConvOp:
    """Match certain convolutions and lower them to kernels (seed 000)."""

    name: str = "TransformConvOp"
    is_pglt: bool = False

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        total = matched = 0
        per_kernel = dict.fromkeys(KERNEL_NAMES, 0)
        findings = []
        for node in list(graph.topological_order()):
            if graph.node(node)["op_type"] not in ("Conv", "ConvTranspose"):
                continue
            op = conv_op_from_node(graph, node)
            if op.spatial_dims != 2:
                findings.append(
                    _finding(op, None, f"{op.spatial_dims}-D conv: only 2-D convs are matched")
                )
                continue
            total += 1
            selection = select_kernel(op, options, self.is_pglt)
            finding = _finding(op, selection, selection.fallback_reason)
            if selection.kernel is not None:
                matched += 1
                per_kernel[selection.kernel.name] += 1
                finding["kernel_attrs"] = lower_to_conv_kernel(graph, op, selection.kernel)
            findings.append(finding)
        percentage = 100.0 * matched / total if total else 0.0
        stats = [
            Statistic(
                self.name,
                "total_conv_ops",
                "Total number of convolution operations processed",
                total,
            ),
            Statistic(
                self.name,
                "matched_conv_ops",
                "Number of convolution operations matched to kernels",
                matched,
            ),
            Statistic(
                self.name,
                "conv_kernel_match_percentage",
                "Percentage of convolution operations matched to kernels",
                f"{percentage:.2f}",
            ),
        ] + [
            Statistic(
                self.name, f"kernel_{name}", f"Number of times kernel {name} is matched", count
            )
            for name, count in per_kernel.items()
        ]
        return PassResult(matched > 0, stats, findings)


def _finding(op: ConvOp, selection: Selection | None, reason: str | None) -> dict:
    """The report's entry for one conv, in the framework's layout (taken before any rewrite)."""
    kernel = selection.kernel if selection is not None else None
    return {
        "node": op.node,
        "op_type": op.op_type,
        "kernel": kernel.name if kernel else None,
        "registry_entry": kernel.label if kernel else None,
        "fallback_reason": reason,
        "walk": [
            {"entry": label, "refused": why}
            for label, why in (selection.refusals if selection else [])
        ],
        "input_shape": list(op.in_shape),
        "kernel_shape": list(op.kern_shape),
        "result_shape": list(op.res_shape),
        "stride": list(op.stride),
        "padding": [list(p) for p in op.padding],
        "rhs_dilation": list(op.rhs_dilation),
        "lhs_dilation": list(op.lhs_dilation),
        "feature_group_count": op.feature_group_count,
        "batch_group_count": op.batch_group_count,
        "dtype": str(op.dtype),
        "kernel_attrs": None,
    }


# --- the rewrite ------------------------------------------------------------------------------
def lower_to_conv_kernel(graph: Graph, op: ConvOp, info: KernelInfo) -> dict:
    """Bridge layouts, marshal attributes, replace the conv by a NativeKernel node."""
    target_in, target_kern, target_out = info.in_perm(op), info.kern_perm(op), info.out_perm(op)
    x, w = op.inputs[:2]
    bias = op.inputs[2] if len(op.inputs) > 2 else ""
    x_name, w_name = _unit_height_views(graph, op, x, w)
    # The transposes that turn framework tensors into the kernel's layouts. Perms map a layout
    # to canonical, so the transpose is the bridge between the two canonical→layout maps.
    in_bridge = get_bridging_perm(invert_perm(op.in_perm), invert_perm(target_in))
    kern_bridge = get_bridging_perm(invert_perm(op.kern_perm), invert_perm(target_kern))
    out_bridge = get_bridging_output_perm(target_out, op.out_perm)
    always = info.insert_transpose
    if always or not is_identity(in_bridge):
        x_name = _transpose(graph, op, x_name, in_bridge, "input")
    if always or not is_identity(kern_bridge):
        w_name = _transpose(graph, op, w_name, kern_bridge, "kernel")
    op.in_shape = apply_perm_to_dims(op.in_shape, in_bridge)
    op.kern_shape = apply_perm_to_dims(op.kern_shape, kern_bridge)
    op.res_shape = apply_perm_to_dims(op.res_shape, invert_perm(out_bridge))
    op.in_perm, op.kern_perm, op.out_perm = target_in, target_kern, target_out
    attrs = info.get_kernel_attr(op)
    result = op.output
    bridge_out = (
        always
        or not is_identity(out_bridge)
        or op.res_shape != tuple(graph.tensors[op.output].shape)
    )
    if bridge_out:
        result = f"{op.output}@{info.out_layout}"
        graph.tensors[result] = TensorInfo(result, op.res_shape, op.dtype)
    graph.remove_node(op.node)
    graph.add_node(
        op.node,
        "NativeKernel",
        [x_name, w_name, bias],
        [result],
        {"func_name": info.name, "attrs": json.dumps(attrs)},
        domain="onnx2bir",
    )
    if bridge_out:
        final_shape = tuple(graph.tensors[op.output].shape)
        perm_out = out_bridge if len(final_shape) == len(op.res_shape) else None
        _emit_output(graph, op, result, perm_out)
    return attrs


def _unit_height_views(graph: Graph, op: ConvOp, x: str, w: str) -> tuple[str, str]:
    """1-D convs: give x and w their unit height (a Reshape, folded for constant weights)."""
    if len(graph.tensors[x].shape) == len(op.in_shape):
        return x, w
    x4 = f"{x}@{op.node}.2d"
    graph.tensors[x4] = TensorInfo(x4, op.in_shape, graph.tensors[x].dtype)
    shape_name = f"{op.node}/unit_height_shape"
    graph.tensors[shape_name] = TensorInfo(
        shape_name, (4,), Dtype.INT64, np.array(op.in_shape, np.int64)
    )
    graph.add_node(f"{op.node}/unit_height", "Reshape", [x, shape_name], [x4])
    return x4, _const_or_reshape(graph, op, w, op.kern_shape)


def _const_or_reshape(graph: Graph, op: ConvOp, tensor: str, shape: tuple[int, ...]) -> str:
    info = graph.tensors[tensor]
    name = f"{tensor}@{op.node}.2d"
    if not info.is_const:
        raise ValueError(f"conv {op.node!r}: 1-D conv with a computed weight is not supported")
    graph.tensors[name] = TensorInfo(name, shape, info.dtype, info.const.reshape(shape))
    return name


def _transpose(graph: Graph, op: ConvOp, tensor: str, perm: Perm, role: str) -> str:
    """Transpose `tensor` by `perm`: folded now for a constant, else an inserted Transpose."""
    info = graph.tensors[tensor]
    name = f"{tensor}@{op.node}.{role}"
    shape = apply_perm_to_dims(tuple(info.shape), perm)
    if info.is_const:
        graph.tensors[name] = TensorInfo(
            name, shape, info.dtype, np.ascontiguousarray(info.const.transpose(perm))
        )
        return name
    graph.tensors[name] = TensorInfo(name, shape, info.dtype)
    graph.add_node(
        f"{op.node}/{role}_transpose", "Transpose", [tensor], [name], {"perm": list(perm)}
    )
    return name


def _emit_output(graph: Graph, op: ConvOp, result: str, perm: Perm | None) -> None:
    """Bring the kernel's result back to the framework layout (and rank) of the conv output."""
    final = graph.tensors[op.output]
    if perm is not None:
        graph.add_node(
            f"{op.node}/output_transpose", "Transpose", [result], [op.output], {"perm": list(perm)}
        )
        return
    # 1-D conv: the 4-D result loses its unit height after the layout bridge.
    staged = result
    if not is_identity(
        get_bridging_output_perm(op.out_perm, layout_perm(CANONICAL_RESULT, CANONICAL_RESULT))
    ):
        staged = f"{result}.nchw"
        nchw = apply_perm_to_dims(op.res_shape, op.out_perm)
        graph.tensors[staged] = TensorInfo(staged, nchw, op.dtype)
        graph.add_node(
            f"{op.node}/output_transpose",
            "Transpose",
            [result],
            [staged],
            {"perm": list(op.out_perm)},
        )
    shape_name = f"{op.node}/output_shape"
    graph.tensors[shape_name] = TensorInfo(
        shape_name, (len(final.shape),), Dtype.INT64, np.array(final.shape, np.int64)
    )
    graph.add_node(f"{op.node}/output_reshape", "Reshape", [staged, shape_name], [op.output])
