"""Conv canonicalization and the permutation algebra (docs/conv_selection.md#canonical-form).

In: an ONNX Conv or ConvTranspose node of the Graph. Out: a `ConvOp` carrying exactly the
attributes the kernel predicates read: the layout permutations, group counts, stride,
lhs/rhs dilation, low/high padding per spatial dim, rhs_reversal, the three shapes, the
number of spatial dims and the dtype.

Permutations follow the reference's convention: `apply_perm(tensor, in_perm)` is the canonical
input, whose axes are (b, f, 0, 1); the canonical kernel is (o, i, 0, 1) and the canonical
result (b, f, 0, 1). So `in_shape[in_perm[1]]` is the input channel count, `kern_shape[
kern_perm[0]]` the output channel count, `res_shape[out_perm[0]]` the batch. A layout is
written as its axis letters ("fb01" = channels, batch, rows, cols) and `layout_perm` turns it
into the perm that maps it to canonical.

1-D convolutions reach the selector as 2-D convs with a unit first spatial dim: the input
[N, C, L] becomes [N, C, 1, L], the kernel [O, I, K] becomes [O, I, 1, K]. This keeps one
geometry for every kernel and is what the 1-D depthwise entry expects ("effective spatial
extent 1 on one axis"); `spatial_dims` is therefore 2 for 1-D and 2-D convs, and 3 for 3-D
convs, which the selector leaves alone.

ConvTranspose is canonicalized in the reference's backward form (docs/conv_backward.md): the
kernel is reversed spatially (`rhs_reversal`), the stride is 1, each side is padded by
`dilation·(k − 1) − pad` (plus `output_padding` on the high side), and the LHS/RHS dilation
roles are swapped: the ConvTranspose stride, which dilates the input, is carried as
`rhs_dilation`, the ConvTranspose dilation, which spaces the kernel taps, as `lhs_dilation`,
and the groups as `batch_group_count` (`feature_group_count` is 1). `rhs_reversal` marks the
backward form; `conv_geometry` decodes the roles back for the kernels. ONNX stores ConvTranspose
weights as [C_in, C_out/group, kH, kW], i.e. layout "io01".

A weight computed at run time by a Transpose node is read through the transpose: the node's
input becomes the conv's kernel operand and the transpose's perm is composed into `kern_perm`
(as the reference's conv canonicalization folds transposes into the dimension numbers). A
constant weight's Transpose was folded at import, so this concerns computed weights only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph
from onnx2bir.kernels.conv.common import ConvGeometry, conv_geometry

Perm = tuple[int, ...]
CANONICAL_INPUT = "bf01"
CANONICAL_KERNEL = "oi01"
CANONICAL_RESULT = "bf01"


# --- permutation algebra ------------------------------------------------------------------
def apply_perm_to_dims(dims: tuple, perm: Perm) -> tuple:
    """The shape (or any per-axis tuple) after transposing by `perm`: result[j] = dims[perm[j]]."""
    return tuple(dims[axis] for axis in perm)


def invert_perm(perm: Perm) -> Perm:
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)


def compose_perm(first: Perm, second: Perm) -> Perm:
    """r with apply(T, r) == apply(apply(T, first), second)."""
    return tuple(first[axis] for axis in second)


def get_bridging_perm(current: Perm, target: Perm) -> Perm:
    """r with apply(apply(T, current), r) == apply(T, target)."""
    return compose_perm(invert_perm(current), target)


def get_bridging_output_perm(kernel_out_perm: Perm, framework_out_perm: Perm) -> Perm:
    """The transpose from the kernel's result layout to the framework's.

    Both perms map their layout to the canonical result, so the framework tensor is
    apply(kernel_result, compose(kernel_out_perm, invert(framework_out_perm))).
    """
    return compose_perm(kernel_out_perm, invert_perm(framework_out_perm))


def layout_perm(layout: str, canonical: str) -> Perm:
    """The perm mapping a tensor stored in `layout` to `canonical` (both as axis letters)."""
    return tuple(layout.index(letter) for letter in canonical)


def is_identity(perm: Perm) -> bool:
    return all(axis == position for position, axis in enumerate(perm))


def layout_bridge(current: Perm, target: Perm) -> Perm:
    """The transpose taking a tensor stored with perm `current` to one stored with `target`
    (both map their layout to canonical)."""
    return get_bridging_perm(invert_perm(current), invert_perm(target))


def moves_data(shape: tuple[int, ...], perm: Perm) -> bool:
    """Whether transposing a tensor of `shape` by `perm` moves bytes: it does not when the
    axes longer than 1 keep their order (only unit axes move: a relabeling of the same bytes)."""
    kept = [axis for axis in perm if shape[axis] != 1]
    return kept != sorted(kept)


# --- the conv op ----------------------------------------------------------------------------
@dataclass
class ConvOp:
    node: str
    op_type: str
    in_perm: Perm
    kern_perm: Perm
    out_perm: Perm
    feature_group_count: int
    batch_group_count: int
    stride: list[int]
    lhs_dilation: list[int]
    rhs_dilation: list[int]
    padding: list[tuple[int, int]]
    rhs_reversal: bool
    in_shape: tuple[int, ...]
    kern_shape: tuple[int, ...]
    res_shape: tuple[int, ...]
    spatial_dims: int
    dtype: Dtype
    inputs: list[str] = field(default_factory=list)  # x, w, optional bias
    output: str = ""
    is_pglt: bool = False  # set by the dispatcher from the pass (docs/conv_selection.md#pglt)
    weight_is_const: bool = True

    # Canonical sizes, read through the perms as the predicates do.
    @property
    def batch(self) -> int:
        return self.in_shape[self.in_perm[0]]

    @property
    def in_channels(self) -> int:
        return self.in_shape[self.in_perm[1]]

    @property
    def out_channels(self) -> int:
        return self.res_shape[self.out_perm[1]]

    @property
    def in_spatial(self) -> tuple[int, ...]:
        return apply_perm_to_dims(self.in_shape, self.in_perm)[2:]

    @property
    def kern_spatial(self) -> tuple[int, ...]:
        return apply_perm_to_dims(self.kern_shape, self.kern_perm)[2:]

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return apply_perm_to_dims(self.res_shape, self.out_perm)[2:]

    @property
    def geometry(self) -> ConvGeometry:
        return conv_geometry(
            self.lhs_dilation,
            self.rhs_dilation,
            self.feature_group_count,
            self.batch_group_count,
            self.rhs_reversal,
        )

    @property
    def taps(self) -> int:
        count = 1
        for size in self.kern_spatial:
            count *= size
        return count

    def describe(self) -> str:
        return (
            f"{self.op_type} {self.node!r} in {list(self.in_shape)} kern "
            f"{list(self.kern_shape)} out {list(self.res_shape)} groups "
            f"{self.geometry.groups} stride {self.stride}"
        )


def _unit_height(values: list[int] | tuple[int, ...], unit: int) -> list[int]:
    return [unit, *values]


def conv_op_from_node(graph: Graph, name: str) -> ConvOp:
    """Canonicalize a Conv or ConvTranspose node (1-D convs gain a unit height)."""
    data = graph.node(name)
    attrs = data["attrs"]
    x, w = data["inputs"][:2]
    in_shape = tuple(graph.tensors[x].shape)
    kern_shape = tuple(graph.tensors[w].shape)
    res_shape = tuple(graph.tensors[data["outputs"][0]].shape)
    rank = len(in_shape) - 2
    kernel = list(kern_shape[2:])
    strides = list(attrs.get("strides") or [1] * rank)
    dilations = list(attrs.get("dilations") or [1] * rank)
    pads = _explicit_pads(
        attrs, list(in_shape[2:]), list(res_shape[2:]), kernel, strides, dilations, data["op_type"]
    )
    if rank == 1:
        in_shape = (*in_shape[:2], 1, in_shape[2])
        kern_shape = (*kern_shape[:2], 1, kern_shape[2])
        res_shape = (*res_shape[:2], 1, res_shape[2])
        kernel, strides, dilations = (
            [1, *kernel],
            _unit_height(strides, 1),
            _unit_height(dilations, 1),
        )
        pads = [(0, 0), *pads]
    spatial_dims = 2 if rank in (1, 2) else rank
    group = int(attrs.get("group", 1))
    identity = tuple(range(len(in_shape)))
    common = dict(
        node=name,
        op_type=data["op_type"],
        in_perm=identity,
        out_perm=identity,
        feature_group_count=group,
        batch_group_count=1,
        in_shape=in_shape,
        kern_shape=kern_shape,
        res_shape=res_shape,
        spatial_dims=spatial_dims,
        dtype=graph.tensors[x].dtype,
        inputs=[t for t in data["inputs"] if t],
        output=data["outputs"][0],
        weight_is_const=graph.tensors[w].is_const,
    )
    if data["op_type"] == "Conv":
        return _read_weight_through_transpose(
            graph,
            ConvOp(
                kern_perm=identity,
                stride=strides,
                lhs_dilation=[1] * len(strides),
                rhs_dilation=dilations,
                padding=pads,
                rhs_reversal=False,
                **common,
            ),
        )
    # ConvTranspose, backward form: dilate the input by the stride, pad by d(k-1) - p.
    output_padding = list(attrs.get("output_padding") or [0] * rank)
    if rank == 1:
        output_padding = [0, *output_padding]
    backward_pads = [
        (d * (k - 1) - low, d * (k - 1) - high + extra)
        for (low, high), k, d, extra in zip(pads, kernel, dilations, output_padding, strict=True)
    ]
    kern_perm = (1, 0, *range(2, len(kern_shape)))  # weights are stored io01
    common.update(feature_group_count=1, batch_group_count=group)
    return _read_weight_through_transpose(
        graph,
        ConvOp(
            kern_perm=kern_perm,
            stride=[1] * len(strides),
            lhs_dilation=dilations,  # backward form: roles swapped (module docstring)
            rhs_dilation=strides,
            padding=backward_pads,
            rhs_reversal=True,
            **common,
        ),
    )


def _read_weight_through_transpose(graph: Graph, op: ConvOp) -> ConvOp:
    """A computed 4-D weight produced by a Transpose: read the transpose's input instead."""
    if op.weight_is_const or len(graph.tensors[op.inputs[1]].shape) != 4:
        return op
    producer = graph.producer(op.inputs[1])
    if producer is None or graph.node(producer)["op_type"] != "Transpose":
        return op
    data = graph.node(producer)
    source = data["inputs"][0]
    perm = tuple(data["attrs"].get("perm") or reversed(range(4)))
    op.kern_perm = compose_perm(perm, op.kern_perm)
    op.kern_shape = tuple(graph.tensors[source].shape)
    op.inputs[1] = source
    return op


def _explicit_pads(attrs, in_sp, out_sp, kernel, strides, dilations, op_type):
    rank = len(in_sp)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for i in range(rank):
            if op_type == "Conv":
                total = max(
                    0, (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i]
                )
            else:
                total = max(
                    0, (in_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - out_sp[i]
                )
            low = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads.append((low, total - low))
        return pads
    if auto_pad == "VALID":
        return [(0, 0)] * rank
    flat = list(attrs.get("pads") or [0] * (2 * rank))
    return [(flat[i], flat[i + rank]) for i in range(rank)]
