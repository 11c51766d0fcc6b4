"""TransformConvOp: choose a kernel for each 2-D convolution, or record why not
(docs/conv_selection.md).

Two ordered registries of `KernelInfo`: FUNCTIONAL_KERNEL_REGISTRY, always walked, and
EXPERIMENTAL_KERNEL_REGISTRY, walked only when `experimental_convolution_kernel_match` is on.
A walk is first-match-wins, so list order is selection priority. On a match the conv's tensors
are bridged to the kernel's layout (Transpose nodes, folded at once for constant weights,
inserted only when the bridge is not the identity or the entry sets `insert_transpose`), the
attributes are marshalled by the entry's builder, and the conv is replaced by a NativeKernel
node whose `func_name` is the kernel name; codegen finds the tracer by that name.

One deliberate difference from the reference: a predicate returns None to accept and a reason
string to refuse (the reference returns a bool), so the report can say, entry by entry, why a
conv fell back to the generic path. The walk itself is unchanged. The predicates live in
`conv_predicates` and the graph rewrite in `conv_rewrite` (both re-exported here); this module
holds the attribute builders, the registries, the walk and the pass.

Where something is INFERRED (not read from the reference), the choice is written next to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from onnx2bir.graph import Graph
from onnx2bir.kernels.conv import PBP_0F1B, PBP_FB01
from onnx2bir.kernels.conv.column_packing import (
    COLUMN_PACKING,
    COLUMN_PACKING_1,
    COLUMN_PACKING_IO10,
    conv2d_column_packing,
    conv2d_column_packing_1,
    conv2d_column_packing_io10,
)
from onnx2bir.kernels.conv.depthwise import (
    CONV1D_DEPTHWISE,
    CONV2D_DEPTHWISE,
    trace_conv1d_depthwise,
    trace_conv2d_depthwise,
)
from onnx2bir.kernels.conv.rep_nhwc import REP_NHWC, trace_rep_nhwc
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.op import (
    CANONICAL_INPUT,
    CANONICAL_KERNEL,
    CANONICAL_RESULT,
    ConvOp,
    Perm,
    conv_op_from_node,
    layout_perm,
)
from onnx2bir.patterns.conv.predicates import (
    EXPERIMENTAL_KERNEL_ALT_SHAPE as EXPERIMENTAL_KERNEL_ALT_SHAPE,
)
from onnx2bir.patterns.conv.predicates import LOW_CHANNEL_MAX as LOW_CHANNEL_MAX
from onnx2bir.patterns.conv.predicates import REPLICATION_CHANNEL_MAX as REPLICATION_CHANNEL_MAX
from onnx2bir.patterns.conv.predicates import SBUF_BUDGET as SBUF_BUDGET
from onnx2bir.patterns.conv.predicates import ConvOpInvariantError as ConvOpInvariantError
from onnx2bir.patterns.conv.predicates import (
    Reason,
    match_Conv1d_depthwise_bf01_oi01_bf01,
    match_conv2d_depthwise_f01b_o01i_bf01,
    match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh,
    match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh2,
    match_Conv2d_pbp_0f1b_0i1o_01fb_experimental_1,
    match_Conv2d_pbp_fb01_io01_01bf_experimental_1,
    match_conv_depthwise_backward,
    match_conv_depthwise_forward,
    match_low_channel_conv,
    match_replication_conv,
)
from onnx2bir.patterns.conv.predicates import is_low_channel_conv_1 as is_low_channel_conv_1
from onnx2bir.patterns.conv.rewrite import lower_to_conv_kernel
from onnx2bir.patterns.passes import PassResult, Statistic

log = logging.getLogger("onnx2bir.TransformConvOp")


# --- attribute marshalling -----------------------------------------------------------------
def get_kernel_attr(op: ConvOp) -> dict:
    """The kernel's attributes, keys in the reference's insertion order
    (docs/conv_selection.md#attributes).

    The reference's "tensor-shape key" is spelled here as three keys, input/kernel/result shape,
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
        # Beyond the reference's key set: the transposed-conv kernels must know the kernel flip.
        "rhs_reversal": op.rhs_reversal,
    }


def get_kernel_attr_same_hl_pad(op: ConvOp) -> dict:
    """The sibling builder for kernels written for one pad per side
    (docs/conv_selection.md#attributes).

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
    """A registry row: `match` is (predicate, default kwargs), as in the reference."""

    name: str
    match: tuple[Callable[..., Reason], dict]
    in_layout: str  # the kernel's tensor layouts, as axis letters
    kern_layout: str
    out_layout: str
    get_kernel_attr: Callable[[ConvOp], dict] = get_kernel_attr
    insert_transpose: bool = False
    label: str = ""  # short name for reports
    trace: Callable | None = None  # the kernel's tracer (none for a disabled experimental row)

    def in_perm(self, op: ConvOp) -> Perm:
        return layout_perm(self.in_layout, CANONICAL_INPUT)

    def kern_perm(self, op: ConvOp) -> Perm:
        return layout_perm(self.kern_layout, CANONICAL_KERNEL)

    def out_perm(self, op: ConvOp) -> Perm:
        return layout_perm(self.out_layout, CANONICAL_RESULT)


# Priority order. The unique-name rows sit where the reference puts them; the column-packing trio's
# slots are INFERRED (see match_conv_depthwise_backward and match_low_channel_conv). The
# reference's priorities 7-8 are not named; the low-channel gate takes 7.
FUNCTIONAL_KERNEL_REGISTRY: list[KernelInfo] = [
    # 1: dense conv through C_in x kH replication on the PE array.
    KernelInfo(
        REP_NHWC,
        (match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh, {"allow_stride": True}),
        "fb01",
        "io01",
        "01bf",
        label="rep_nhwc",
        trace=trace_rep_nhwc,
    ),
    # 2 and 4: transposed depthwise, one row per kernel layout; a row takes the kernels that
    # reach its layout without moving data (docs/conv_backward.md).
    KernelInfo(
        COLUMN_PACKING_1,
        (match_conv_depthwise_backward, {"kernel_layout": "oi01"}),
        "bf01",
        "oi01",
        "bf01",
        label="column_packing_1",
        trace=conv2d_column_packing_1,
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
        trace=trace_conv1d_depthwise,
    ),
    KernelInfo(
        COLUMN_PACKING_IO10,
        (match_conv_depthwise_backward, {"kernel_layout": "io10"}),
        "bf01",
        "io10",
        "bf01",
        label="column_packing_io10",
        trace=conv2d_column_packing_io10,
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
        trace=trace_conv2d_depthwise,
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
        trace=trace_conv2d_depthwise,
    ),
    # 7: low-channel forward conv: filter taps stacked on partitions.
    KernelInfo(
        COLUMN_PACKING,
        (match_low_channel_conv, {}),
        "bf01",
        "oi01",
        "bf01",
        label="column_packing",
        trace=conv2d_column_packing,
    ),
    # 9: K-replication, the general dense path (same kernel as row 1, partial replication).
    KernelInfo(
        REP_NHWC,
        (match_replication_conv, {}),
        "fb01",
        "io01",
        "01bf",
        label="replication",
        trace=trace_rep_nhwc,
    ),
    # 10: the rep-NHWC kernel for an op already in the alternative layout.
    KernelInfo(
        REP_NHWC,
        (match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh2, {}),
        "fb01",
        "io01",
        "01bf",
        label="rep_nhwc_Pcinh2",
        trace=trace_rep_nhwc,
    ),
]

KERNEL_NAMES = tuple(dict.fromkeys(info.name for info in FUNCTIONAL_KERNEL_REGISTRY)) + (
    PBP_0F1B,
    PBP_FB01,
)

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
    """Match certain convolutions and lower them to kernels (docs/conv_selection.md)."""

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
            one_d = len(graph.tensors[op.inputs[0]].shape) == 3
            if one_d and not op.weight_is_const:
                # The kernels see a 1-D conv through a unit-height view of a constant weight.
                findings.append(
                    _finding(
                        op,
                        None,
                        "1-D conv with a computed weight: no unit-height view for the kernels",
                    )
                )
                continue
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
        "in_perm": list(op.in_perm),
        "kern_perm": list(op.kern_perm),
        "out_perm": list(op.out_perm),
        "feature_group_count": op.feature_group_count,
        "batch_group_count": op.batch_group_count,
        "dtype": str(op.dtype),
        "kernel_attrs": None,
    }
