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
padding-only mask); the fill is ≤ −1e4. With the triangle, the model's answer on a query row
that keeps no key must be one the raise reproduces (Exactness, below): a select fill that is
−inf or absorbs the score (`absorbs`), a masked fill, and no other step but a scale around the
mask (`rows_problem`, checked once the block's steps are read). The sum is recognised (the
causal mask, a padding bias provably ≤ 0 by `_bounds`) and refused: its rows that keep no key
are not a uniform average (below).

Rewrite. The step becomes the padding step on the [B, 1, 1, Sk] operand — an add of
`Where(padding, 0, fill)` for the select form (the model's own arithmetic at every key the
triangle keeps), a masked fill for the masked-fill form — then, unless the rest keeps every
key, the kernel's causal step. The S × S mask is never computed. With the causal step and a
finite fill, the kernel's output is followed by the fix-up `Where(no key, mean of V, O)`
(`no_key_rows`, `uniform_average`, applied by the raise).

Exactness. Every score the triangle keeps gets what the model gives it; every score it masks
contributes 0 to the softmax, as in the model, in every query row that keeps at least one key.
A row that keeps no key — the padding masks all of a query's causal prefix: a left-padded
sequence's pad positions, an all-zero mask — gets, in the model:
- with a fill that absorbs the score (finfo.min of the mask's dtype; `absorbs`: half an ulp of
  the fill, in fp32 and in the mask's dtype, is at least 2^20, so s + fill == fill for every
  score |s| < 2^20 — the assumption, far above any attention logit), every score equal to the
  fill, masked by the padding or by the triangle alike: the softmax is uniform over all Sk keys
  and the row is the mean of V. The same for a masked fill, where every score is the fill. The
  kernel, whose causal step makes the keys past the row −inf (and skips their tiles), would
  average over the keys up to the row only; the fix-up replaces exactly those rows — a row
  keeps no key when the count of kept padding keys up to key q + (Sk − Sq), a CumSum of the
  keep condition over the keys, is 0 (and when q + (Sk − Sq) < 0) — by the mean of V as the
  model rounds it under the cast policy: V in the storage dtype, summed in fp32, times the
  storage dtype's 1/Sk (the probability the cast matmul reads), in the output's dtype (rounded
  to the storage dtype too with `all-to-…`). Rows that keep a key are the kernel's, untouched.
  The condition is built once beside the mask and shared by the layers that read it.
- with a fill of −inf, every score −inf in the model and in the kernel alike: NaN (0 with the
  NaN guard). No fix-up.
- with a select fill that does not absorb the score (−1e4, −1e9 in fp32, finfo(fp16).min),
  the softmax of the scores shifted by the fill over all keys: refused, the mask is read whole
  (the kernel adds the model's mask to every score, no tile skipped: the model's arithmetic).
- with the sum, min + min = −inf at the padded keys the triangle masks and the bias's value
  elsewhere: refused, read whole, as the non-absorbing fill.
Without the triangle (a decode step, an encoder) the padding step is the model's arithmetic at
every key, so those rows match with no fix-up: an all-masked row is uniform in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
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

ABSORBED_SCORE = 2.0**20  # a fill absorbs the scores below this magnitude (`absorbs`)
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

    form: "select" (an add of Where(keep, 0, fill)) or "masked_fill" (Where on the scores; a
    sum of a causal mask and a padding bias is refused, `_split_sum`). `shape` is the padding
    operand's, its query dim 1; `dtype` the mask's (for the select form's bias)."""

    form: str
    fill: float
    padding: tuple[Term, ...]
    causal: bool
    shape: tuple[int, ...]
    dtype: Dtype

    @property
    def uniform_rows(self) -> bool:
        """Whether the raise follows the kernel by the fix-up: the model spreads a row that
        keeps no key over all Sk keys (a finite fill: absorbing, or a masked fill), the kernel's
        causal step would not."""
        return self.causal and math.isfinite(self.fill) and self.form != "sum"


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
        if form == "select" and math.isfinite(fill) and not absorbs(fill, dtype):
            return None, (
                f"fills {fill:g}, which does not absorb the score (half an ulp < "
                f"{ABSORBED_SCORE:g}): a row the padding masks entirely is the softmax of its "
                "scores over all keys in the model, which the causal step would not give"
            )
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
            return None, (
                f"Add {node!r} of the causal mask and the padding bias {bias!r}: a row the "
                "padding masks entirely gets min + min = −inf at the keys both mask and the "
                "bias elsewhere, not a uniform average the raise could give"
            )
    return None, f"Add {node!r}: " + "; ".join(reasons)


def absorbs(fill: float, dtype: Dtype) -> bool:
    """Whether s + fill == fill for every score |s| < ABSORBED_SCORE, in fp32 (the kernel's
    scores) and in `dtype` (the model's mask): half an ulp of the fill is that large."""
    if not math.isfinite(fill) or fill == 0:
        return False
    exponent = math.frexp(abs(fill))[1] - 1  # |fill| in [2^e, 2^(e+1))
    bits = [23] + ([ml_dtypes.finfo(dtype.numpy).nmant] if dtype.is_float else [])
    return all(2.0 ** (exponent - m - 1) >= ABSORBED_SCORE for m in bits)


def rows_problem(split: PaddingSplit, steps: list[dict], index: int) -> str | None:
    """Why the fix-up would not give the model's rows that keep no key in a block whose score
    steps are `steps`, the split one at `index`; None when it does (or none is needed). Those
    rows are uniform only if nothing after the mask makes the scores differ again (a scale
    keeps them equal) and, for the select form, nothing before it masks (the fill absorbs a
    finite score, not an earlier −inf); a masked fill overwrites whatever came before."""
    if not split.uniform_rows:
        return None
    before = steps[:index] if split.form == "select" else []
    for step in [*before, *steps[index + 1 :]]:
        if step["op"] not in ("scale", "divide"):
            where = "before" if step in before else "after"
            return (
                f"a {step['op']} step {where} the mask: a row the padding masks entirely would "
                "not be the uniform average the model gives it"
            )
    return None


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
    it): the bias Where(padding, 0, fill) (select) or the keep condition (masked_fill)."""
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


def no_key_rows(graph: Graph, split: PaddingSplit, name: str, seq_q: int, seq_k: int) -> str:
    """[..., Sq, 1] bool, true at the query rows that keep no key
    (docs/attention.md#padding-split): row q keeps the keys j ≤ q + (Sk − Sq) the padding
    keeps, so it keeps none when CumSum over the keys of Cast(keep) is 0 at key q + (Sk − Sq),
    or that key is before the first. Added once beside the mask (blocks that share the mask
    share it); the count is fp32, exact up to 2^24 keys, and compared with 0.5."""
    out = f"{name}/padding_no_key"
    if graph.producer(out) is not None:
        return out
    keep = _keep_condition(graph, split, f"{name}/padding_keep")
    shape, lead = tuple(split.shape), tuple(split.shape[:-2])
    last = np.arange(seq_q) + (seq_k - seq_q)  # the last key row q sees
    count = _node(graph, f"{out}/count", "Cast", [keep], shape, Dtype.FP32, {"to": 1})
    if shape[-1] != 1:  # one key column: the keep is the same for every key, no count
        axis = _const(graph, f"{out}/axis", np.asarray(-1, np.int64))
        count = _node(graph, f"{out}/cumsum", "CumSum", [count, axis], shape, Dtype.FP32)
        index = _const(graph, f"{out}/index", np.clip(last, 0, seq_k - 1).astype(np.int64))
        row = (*lead, 1, seq_q)
        count = _node(
            graph, f"{out}/gather", "Gather", [count, index], row, Dtype.FP32, {"axis": -1}
        )
        view = _const(graph, f"{out}/shape", np.asarray((*lead, seq_q, 1), np.int64))
        count = _node(graph, f"{out}/rows", "Reshape", [count, view], (*lead, seq_q, 1), Dtype.FP32)
    half = _const(graph, f"{out}/half", np.asarray(0.5, np.float32))
    rows = tuple(graph.tensors[count].shape)
    into = out if (last >= 0).all() else None
    none = _node(graph, f"{out}/less", "Less", [count, half], rows, Dtype.BOOL, into=into)
    if into is None:  # rows before the first key keep none whatever the padding
        early = _const(graph, f"{out}/early", (last < 0).reshape(seq_q, 1))
        shape = np.broadcast_shapes(rows, (seq_q, 1))
        _node(graph, f"{out}/or", "Or", [none, early], shape, Dtype.BOOL, into=out)
    return out


def uniform_average(
    graph: Graph, v: str, seq_k: int, storage: Dtype, dtype: Dtype, round_storage: bool, name: str
) -> str:
    """The mean of V over the keys, [..., 1, Dv] in `dtype`, as the model computes a uniform row
    under the cast policy: V read in the storage dtype (`v` is), summed in fp32, times 1/Sk in
    the storage dtype (the probability the cast PV matmul reads); rounded to the storage dtype
    when the policy casts everything."""
    shape = tuple(graph.tensors[v].shape)
    mean = (*shape[:-2], 1, shape[-1])
    wide = _node(graph, f"{name}/v_fp32", "Cast", [v], shape, Dtype.FP32, {"to": 1})
    axes = _const(graph, f"{name}/axes", np.asarray([-2], np.int64))
    total = _node(
        graph, f"{name}/sum", "ReduceSum", [wide, axes], mean, Dtype.FP32, {"keepdims": 1}
    )
    weight = np.asarray(1.0 / seq_k, np.float32).astype(storage.numpy).astype(np.float32)
    scale = _const(graph, f"{name}/weight", weight)
    out = _node(graph, f"{name}/mean", "Mul", [total, scale], mean, Dtype.FP32)
    for target in ([storage] if round_storage else []) + [dtype]:
        if graph.tensors[out].dtype is not target:
            to = _onnx_type(target)
            out = _node(graph, f"{name}/mean_{target}", "Cast", [out], mean, target, {"to": to})
    return out


def _const(graph: Graph, name: str, value: np.ndarray) -> str:
    value = np.asarray(value)
    graph.tensors[name] = TensorInfo(name, value.shape, Dtype.from_numpy(value.dtype), value)
    return name


def _node(
    graph: Graph,
    node: str,
    op: str,
    inputs: list[str],
    shape: tuple[int, ...],
    dtype: Dtype,
    attrs: dict | None = None,
    into: str | None = None,
) -> str:
    out = into or f"{node}/out"
    graph.tensors[out] = TensorInfo(out, tuple(shape), dtype)
    graph.add_node(node, op, inputs, [out], attrs)
    return out


def _onnx_type(dtype: Dtype) -> int:
    import onnx

    return onnx.helper.np_dtype_to_tensor_dtype(dtype.numpy)


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
