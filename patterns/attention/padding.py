"""Causal and key-padding masks (docs/attention.md#padding-split): a score mask that combines the
causal triangle with a padding mask read from a graph input, split into the kernel's causal
step and a small padding step.

In: the graph, the mask of an `add` score step (or the condition of a `masked_fill` Where, with
its fill and the branch it fills) and the block's seq_q, seq_k. Out: `padding_split` — a
`PaddingSplit` (the padding terms, the fill, whether the rest is the causal triangle or masks
nothing) or None and the reason the mask is not such a combination. `build_padding` and
`split_steps` are the rewrite the raise applies.

Pattern. What decoder exports write for `attention_mask` (transformers 5, both torch exporters):
the mask `Where(keep, 0, fill)` added to the scores, `keep = And(causal, padding)` with the
padding `GatherND(Cast(attention_mask → bool))` or `Gather(Flatten(...))` of shape
[B, 1, 1, Sk]; also `Where(masked, fill, 0)`, a masked-fill Where on the scores, a sum
`Add(causal mask, padding bias)`, and the conditions written with Or/Not (De Morgan). The
condition is flattened into terms: the And of keep conditions, the Or of masked conditions,
through Not, Expand, Identity and bool-to-bool Casts.

Check. Each term is either read structurally (`causal.Reader`: constants, index arithmetic,
triangles) or is a padding term: a tensor whose query dim is 1, which numpy broadcasting makes
the same for every query, so it depends on the batch and the key only, whatever computes it.
At least one term is padding; the other terms together must be exactly the causal triangle
(`causal.value_problem`) or keep every key (a decode step's single query, an encoder's
padding-only mask); the fill is ≤ −1e4. For the sum, the padding bias must be provably ≤ 0
(`_bounds`: a Where of constants, a Cast of a bool times a constant, ...), so that a key the
triangle masks stays masked; a bias read as a raw number from an input is refused.

Rewrite. The step becomes the padding step on the [B, 1, 1, Sk] operand — an add of
`Where(padding, 0, fill)` for the select form (the model's own arithmetic at every key the
triangle keeps), a masked fill for the masked-fill form, an add of the bias for the sum — then,
unless the rest keeps every key, the kernel's causal step. The S × S mask is never computed.

Exactness. Every score the triangle keeps gets what the model gives it; every score it masks
contributes 0 to the softmax, as in the model, in every query row that keeps at least one key.
A row that keeps no key (the padding masks all of a query's causal prefix: a left-padded
sequence's pad positions) is where they differ: the model spreads such a row uniformly over
all Sk keys (a fill of finfo.min absorbs the score), the kernel over the keys up to the row
(the keys past it are −inf) — both garbage that a decoder's user discards, and never produced
by `validate`'s random masks, whose first key is always kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph, TensorInfo
from onnx2bir.patterns.attention.causal import (
    MASKED,
    Const,
    NotStructural,
    Reader,
    Value,
    at,
    causal_problem,
    combine,
    value_problem,
)
from onnx2bir.patterns.queries import scalar_const

_SAME_VALUE = ("Expand", "Identity")  # ops a mask or condition passes through unchanged
_SAME_BOUNDS = (
    "Expand",
    "Identity",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Flatten",
    "Transpose",
    "Slice",
    "Gather",
    "GatherND",
    "GatherElements",
)


@dataclass(frozen=True)
class Term:
    """One operand of the mask's condition: the key is kept where it holds (`keep`), or masked
    where it holds (not `keep`)."""

    tensor: str
    keep: bool = True


@dataclass(frozen=True)
class PaddingSplit:
    """A mask read as causal (or nothing) plus key padding.

    form: "select" (an add of Where(keep, 0, fill)), "masked_fill" (Where on the scores) or
    "sum" (an add of causal mask + padding bias; `padding` holds the bias). `shape` is the
    padding operand's, its query dim 1; `dtype` the mask's (for the select form's bias)."""

    form: str
    fill: float
    padding: tuple[Term, ...]
    causal: bool
    shape: tuple[int, ...]
    dtype: Dtype


# --- the pattern and its check ------------------------------------------------------------------
def padding_split(
    graph: Graph,
    tensor: str,
    seq_q: int,
    seq_k: int,
    fill: float | None = None,
    fill_on_true: bool = True,
) -> tuple[PaddingSplit | None, str | None]:
    """The split of an `add` step's mask (fill None) or a `masked_fill` step's condition, or
    None and the reason its check failed (None too when the mask is not of the pattern's
    form: a graph input, an op other than Where or Add, no key-padding term)."""
    if fill is None:
        return _split_added(graph, tensor, seq_q, seq_k)
    if not fill <= MASKED:
        return None, f"fills {fill:g}, not a masking value (≤ {MASKED:g})"
    terms = flatten(graph, tensor, keep=not fill_on_true)
    return _split_terms(graph, terms, seq_q, seq_k, "masked_fill", fill, Dtype.BOOL)


def _split_added(
    graph: Graph, mask: str, seq_q: int, seq_k: int
) -> tuple[PaddingSplit | None, str | None]:
    source = _through(graph, mask, _SAME_VALUE)
    node = graph.producer(source)
    if node is None:
        return None, None  # a graph input: no combination to split
    data = graph.node(node)
    op = data["op_type"]
    if op == "Add":
        return _split_sum(graph, node, seq_q, seq_k)
    if op != "Where":
        return None, None  # not the pattern
    cond, x, y = data["inputs"]
    a, b = scalar_const(graph, x), scalar_const(graph, y)
    if a == 0.0 and b is not None and b <= MASKED:
        keep, fill = True, b
    elif b == 0.0 and a is not None and a <= MASKED:
        keep, fill = False, a
    else:
        return None, None  # not a select between 0 and a masking value
    terms = flatten(graph, cond, keep)
    return _split_terms(graph, terms, seq_q, seq_k, "select", fill, graph.tensors[mask].dtype)


def flatten(graph: Graph, tensor: str, keep: bool) -> list[Term]:
    """The terms of a condition: through And (of keep conditions), Or (of masked conditions),
    Not, and the ops that pass a value through."""
    data = _producer(graph, tensor)
    op = data["op_type"] if data else None
    if op in _SAME_VALUE or (op == "Cast" and _is_bool(graph, data["inputs"][0])):
        return flatten(graph, data["inputs"][0], keep)
    if op == "Not":
        return flatten(graph, data["inputs"][0], not keep)
    if (op == "And" and keep) or (op == "Or" and not keep):
        return [t for name in data["inputs"] for t in flatten(graph, name, keep)]
    return [Term(tensor, keep)]


def _split_terms(
    graph: Graph,
    terms: list[Term],
    seq_q: int,
    seq_k: int,
    form: str,
    fill: float,
    dtype: Dtype,
) -> tuple[PaddingSplit | None, str | None]:
    reader = Reader(graph)
    padding, kept = [], []
    for term in terms:
        shape = tuple(graph.tensors[term.tensor].shape)
        try:
            value = reader.value(term.tensor)
        except NotStructural as exc:
            if not query_free(shape, seq_k):
                return None, (
                    f"term {term.tensor!r} {list(shape)} depends on the query and is not read "
                    f"structurally ({exc})"
                )
            padding.append(term)
            continue
        kept.append(value if term.keep else combine(np.logical_not, [value], np.dtype(bool)))
    if not padding:
        return None, None  # read whole: causal_problem has said why it is not the triangle
    keep = combine(_all, kept, np.dtype(bool)) if kept else Const(np.True_)
    causal = not keeps_every_key(keep, seq_q, seq_k)
    if causal:
        why = value_problem(keep, seq_q, seq_k, fill, fill_on_true=False)
        if why:
            return None, f"the terms besides the padding are not the causal triangle: {why}"
    shape = np.broadcast_shapes(*(tuple(graph.tensors[t.tensor].shape) for t in padding))
    return PaddingSplit(form, fill, tuple(padding), causal, tuple(shape), dtype), None


def _split_sum(
    graph: Graph, node: str, seq_q: int, seq_k: int
) -> tuple[PaddingSplit | None, str | None]:
    """Add(causal mask, padding bias) in either order."""
    inputs = graph.node(node)["inputs"]
    reasons = []
    for causal, bias in (inputs, inputs[::-1]):
        why = causal_problem(graph, causal, seq_q, seq_k)
        shape = tuple(graph.tensors[bias].shape)
        bounds = _bounds(graph, bias)
        if why:
            reasons.append(f"{causal!r} is not the causal triangle ({why})")
        elif not query_free(shape, seq_k):
            reasons.append(f"{bias!r} {list(shape)} depends on the query")
        elif bounds is None or not bounds[1] <= 0:
            reasons.append(
                f"the padding bias {bias!r} is not bounded above by 0 "
                f"({'unbounded' if bounds is None else f'up to {bounds[1]:g}'}): a key the "
                "triangle masks could be unmasked"
            )
        else:
            dtype = graph.tensors[bias].dtype
            return PaddingSplit("sum", 0.0, (Term(bias),), True, shape, dtype), None
    return None, f"Add {node!r}: " + "; ".join(reasons)


def query_free(shape: tuple[int, ...], seq_k: int) -> bool:
    """Whether a tensor of `shape`, broadcast to the scores, is the same for every query: its
    query dim is 1 (or absent), its key dim 1 or seq_k."""
    rows = shape[-2] if len(shape) >= 2 else 1
    cols = shape[-1] if shape else 1
    return rows == 1 and cols in (1, seq_k)


def keeps_every_key(keep: Value, seq_q: int, seq_k: int) -> bool:
    """Whether a keep condition (Const or Steps of key − query) holds at every score."""
    lowest, highest = -(seq_q - 1), seq_k - 1
    points = {lowest, highest, *getattr(keep, "breaks", ())}
    return all(bool(at(keep, d)) for d in points if lowest <= d <= highest)


def _bounds(graph: Graph, tensor: str, depth: int = 0) -> tuple[float, float] | None:
    """An interval holding every value of `tensor`, or None when none is known."""
    info = graph.tensors.get(tensor)
    if info is None or depth > 24:
        return None
    if info.dtype is Dtype.BOOL:
        return 0.0, 1.0
    if info.is_const:
        value = np.asarray(info.const, dtype=np.float64)
        return (float(value.min()), float(value.max())) if value.size else None
    data = _producer(graph, tensor)
    if data is None:
        return None
    op, inputs = data["op_type"], data["inputs"]
    if op in _SAME_BOUNDS or op in ("Cast", "CastLike"):
        return _bounds(graph, inputs[0], depth + 1)
    if op == "Where":
        x, y = _bounds(graph, inputs[1], depth + 1), _bounds(graph, inputs[2], depth + 1)
        return None if x is None or y is None else (min(x[0], y[0]), max(x[1], y[1]))
    if op == "Neg":
        x = _bounds(graph, inputs[0], depth + 1)
        return None if x is None else (-x[1], -x[0])
    if op in ("Add", "Sub", "Mul"):
        x, y = _bounds(graph, inputs[0], depth + 1), _bounds(graph, inputs[1], depth + 1)
        if x is None or y is None:
            return None
        if op == "Sub":
            y = (-y[1], -y[0])
        if op == "Mul":
            ends = [p * q for p in x for q in y if not (p == 0 and math.isinf(q))]
            ends += [0.0 for p in x for q in y if p == 0 or q == 0]
        else:
            ends = [x[0] + y[0], x[1] + y[1]]
        if any(math.isnan(e) for e in ends):
            return None
        return min(ends), max(ends)
    return None


# --- the rewrite --------------------------------------------------------------------------------
def build_padding(graph: Graph, split: PaddingSplit, name: str) -> str:
    """The padding step's operand, added to the graph once (blocks that share the mask share
    it): the bias Where(padding, 0, fill) (select), the keep condition (masked_fill), or the
    model's own padding bias (sum)."""
    if split.form == "sum":
        return split.padding[0].tensor
    keep = f"{name}/padding_keep"
    if split.form == "masked_fill":
        return _keep_condition(graph, split, keep)
    bias = f"{name}/padding_bias"
    if graph.producer(bias) is None:
        condition = _keep_condition(graph, split, keep)
        zero, fill = f"{bias}/zero", f"{bias}/fill"
        for const, value in ((zero, 0.0), (fill, split.fill)):
            array = np.asarray(value, dtype=split.dtype.numpy)
            graph.tensors[const] = TensorInfo(const, (), split.dtype, array)
        graph.tensors[bias] = TensorInfo(bias, split.shape, split.dtype)
        graph.add_node(f"{bias}/where", "Where", [condition, zero, fill], [bias])
    return bias


def _keep_condition(graph: Graph, split: PaddingSplit, name: str) -> str:
    """The And of the padding terms as keep conditions (a masked one through Not); the terms
    of a condition are bool."""
    if len(split.padding) == 1 and split.padding[0].keep:
        return split.padding[0].tensor
    if graph.producer(name) is not None:
        return name
    parts = []
    for index, term in enumerate(split.padding):
        part = term.tensor
        if not term.keep:
            part = _bool_node(graph, f"{name}/not{index}", "Not", [part])
        parts.append(part)
    current = parts[0]
    for index, part in enumerate(parts[1:], 1):
        current = _bool_node(graph, f"{name}/and{index}", "And", [current, part])
    return _bool_node(graph, f"{name}/identity", "Identity", [current], into=name)


def _bool_node(graph: Graph, node: str, op: str, inputs: list[str], into: str | None = None) -> str:
    """One bool op whose output broadcasts its inputs."""
    out = into or f"{node}/out"
    shape = np.broadcast_shapes(*(tuple(graph.tensors[t].shape) for t in inputs))
    graph.tensors[out] = TensorInfo(out, tuple(shape), Dtype.BOOL)
    graph.add_node(node, op, inputs, [out])
    return out


def split_steps(split: PaddingSplit, step: dict, operand: int) -> list[dict]:
    """The score steps that replace `step`: the padding step reading extra input `operand`,
    then the kernel's causal step when the rest of the mask is the triangle."""
    if split.form == "masked_fill":
        padding = {
            "op": "masked_fill",
            "input": operand,
            "value": split.fill,
            "fill_on_true": False,
        }
    else:
        padding = {"op": "add", "input": operand}
    return [padding, {"op": "causal"}] if split.causal else [padding]


def describe_split(split: PaddingSplit) -> str:
    """The report's variant note."""
    what = "causal triangle and key padding" if split.causal else "key padding only"
    return f"{what} mask split: the padding read as {list(split.shape)} ({split.form})"


# --- small queries ------------------------------------------------------------------------------
def _all(*values) -> bool:
    return all(bool(v) for v in values)


def _producer(graph: Graph, tensor: str) -> dict | None:
    node = graph.producer(tensor)
    return None if node is None else graph.node(node)


def _through(graph: Graph, tensor: str, ops: tuple[str, ...]) -> str:
    data = _producer(graph, tensor)
    while data is not None and data["op_type"] in ops:
        tensor = data["inputs"][0]
        data = _producer(graph, tensor)
    return tensor


def _is_bool(graph: Graph, tensor: str) -> bool:
    return graph.tensors[tensor].dtype is Dtype.BOOL
