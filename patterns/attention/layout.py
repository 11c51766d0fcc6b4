"""The attention kernel's batch layout and the packaging that puts a block's operands in it
(docs/attention_kernel.md#packaging).

In: a matched `AttentionBlock` — its operands q, kᵀ, v and extra inputs, and the batch shapes
its scores are viewed in (`spaces`: the QK matmul's, then one per Reshape step that views the
scores with other leading dims, as BLOOM and Swin exports do). Out: `plan_layout`, the kernel's
batch dims and, per operand, the tensor the kernel reads, the shape it reads it in and whether
its last two dims are swapped on the way; or the reason the block cannot be laid out.

The batch index is one linear index that every space cuts into dims differently: [B·nW, H]
and [B, nW, H] are two views of it. The kernel's layout is their common refinement — every cut
any of them makes (`refine`) — so each operand, broadcast over the dims of its own space, is
a Reshape away from the kernel's: a full dim becomes the refined dims it covers, a broadcast
dim becomes ones. Views that do not nest ([2, 3] against [3, 2]) have no refinement; such a
block is listed with that reason.

Grouped-query K and V (Llama's repeat_kv: `Unsqueeze → Expand → Reshape`, then the Kᵀ
Transpose) are views too: the Expand's output [B, Hkv, G] is a space, the un-expanded
[B, Hkv, 1] source is broadcast in it, so the kernel reads K and V once per group with a zero
stride over the G query heads that share them (`grouped_source`), never materialised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx2bir.graph import Graph
from onnx2bir.patterns.queries import producer_op


def swaps_last_two(perm: list[int] | tuple[int, ...], rank: int) -> bool:
    return list(perm) == [*range(rank - 2), rank - 1, rank - 2]


def refine(spaces: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The coarsest batch dims that every space's dims are groups of, or None when the spaces
    cut the batch index in ways that do not nest. All spaces hold the same number of
    elements."""
    cuts = set()
    for space in spaces:
        product = 1
        for size in space:
            if size != 1:
                product *= size
                cuts.add(product)
    dims, previous = [], 1
    for cut in sorted(cuts):
        if cut % previous:
            return None
        dims.append(cut // previous)
        previous = cut
    return tuple(dims)


def map_to(refined: tuple[int, ...], space: tuple[int, ...], batch: tuple[int, ...]):
    """An operand's batch dims `batch` (broadcast over `space`, right-aligned) in the refined
    layout: each full dim of the space becomes the refined dims it covers, each broadcast dim
    ones."""
    padded = (1,) * (len(space) - len(batch)) + tuple(batch)
    out, at = [], 0
    for size, own in zip(space, padded, strict=True):
        if size == 1:
            continue
        group = []
        product = 1
        while product < size:
            product *= refined[at]
            group.append(refined[at])
            at += 1
        out.extend(group if own == size else [1] * len(group))
    return tuple(out)


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Leading unit dims dropped: right-aligned broadcasting does not see them."""
    at = 0
    while at < len(shape) and shape[at] == 1:
        at += 1
    return tuple(shape[at:])


@dataclass(frozen=True)
class Operand:
    """One tensor the kernel reads: its source, the space its batch dims broadcast over, and
    whether the packaging swaps its last two dims (a Kᵀ taken from an un-expanded K)."""

    role: str  # q | kt | v | extra<i>
    source: str
    space: tuple[int, ...]
    swap: bool = False


@dataclass(frozen=True)
class Layout:
    """The kernel's batch dims and, per operand, (operand, the shape its source is reshaped to;
    the kernel reads it with the last two dims swapped when `operand.swap`)."""

    batch: tuple[int, ...]
    operands: tuple[tuple[Operand, tuple[int, ...]], ...]
    output_shape: tuple[int, ...]  # the kernel's output
    grouped: tuple[str, ...] = ()  # roles read once per query-head group (GQA)


def grouped_source(graph: Graph, tensor: str, transposed: bool) -> Operand | None:
    """K or V as repeated for grouped-query attention: `tensor` (kᵀ when `transposed`, else v)
    made by [Transpose(last two) →] Reshape → Expand of a tensor with unit dims the Expand
    fills. Returns the un-expanded source in the Expand's space, or None for any other form."""
    swap = False
    current = tensor
    found = producer_op(graph, current)
    if transposed and found and found[1]["op_type"] == "Transpose":
        rank = len(graph.tensors[current].shape)
        if not swaps_last_two(found[1]["attrs"].get("perm", []), rank):
            return None
        swap, current = True, found[1]["inputs"][0]
        found = producer_op(graph, current)
    if not found or found[1]["op_type"] != "Reshape":
        return None
    viewed = found[1]["inputs"][0]
    found = producer_op(graph, viewed)
    if not found or found[1]["op_type"] != "Expand":
        return None
    source = found[1]["inputs"][0]
    out_shape = tuple(graph.tensors[viewed].shape)
    src_shape = tuple(graph.tensors[source].shape)
    current_shape = tuple(graph.tensors[current].shape)
    if len(src_shape) != len(out_shape) or len(out_shape) < 3:
        return None
    if out_shape[-2:] != current_shape[-2:] or src_shape[-2:] != out_shape[-2:]:
        return None  # the repeat must be over batch dims only
    if math.prod(out_shape[:-2]) != math.prod(current_shape[:-2]):
        return None
    if not any(s == 1 and o > 1 for s, o in zip(src_shape[:-2], out_shape[:-2], strict=True)):
        return None  # nothing repeated
    role = "kt" if transposed else "v"
    return Operand(role, source, out_shape[:-2], swap=swap)


def plan_layout(graph: Graph, block) -> tuple[Layout | None, str | None]:
    """The kernel's layout for `block`, or None and the reason."""
    shape = {t: tuple(graph.tensors[t].shape) for t in (block.q, block.kt, block.v, block.output)}
    spaces = [tuple(s) for s in block.spaces]
    first, final = spaces[0], spaces[-1]
    out_batch = shape[block.output][:-2]
    if _strip(out_batch) != _strip(final) and len(out_batch) >= len(final):
        return None, (
            f"v {list(shape[block.v])} broadcasts the probabilities {list(final)} over a batch dim"
        )
    operands = [Operand("q", block.q, first)]
    k = grouped_source(graph, block.kt, transposed=True)
    operands.append(k or Operand("kt", block.kt, first, swap=False))
    v = grouped_source(graph, block.v, transposed=False)
    operands.append(v or Operand("v", block.v, final))
    for index, (extra, space) in enumerate(zip(block.extras, block.extra_spaces, strict=True)):
        operands.append(Operand(f"extra{index}", extra, spaces[space]))
    grouped = tuple(o.role for o in (k, v) if o is not None)
    if len(set(spaces)) == 1 and not grouped:
        # Nothing is viewed: the kernel reads every operand as the block did.
        return Layout(
            out_batch,
            tuple((o, tuple(graph.tensors[o.source].shape)) for o in operands),
            shape[block.output],
        ), None
    all_spaces = [*spaces] + [o.space for o in operands if o.role in grouped]
    batch = refine(all_spaces)
    if batch is None:
        views = " and ".join(str(list(s)) for s in dict.fromkeys(all_spaces))
        return None, f"the scores' batch views {views} do not nest"
    laid = []
    for operand in operands:
        own = tuple(graph.tensors[operand.source].shape)
        mapped = map_to(batch, operand.space, own[:-2])
        laid.append((operand, own if _strip(own[:-2]) == _strip(mapped) else (*mapped, *own[-2:])))
    out = shape[block.output]
    output = out if _strip(out[:-2]) == batch else (*batch, *out[-2:])
    return Layout(batch, tuple(laid), output, grouped), None
