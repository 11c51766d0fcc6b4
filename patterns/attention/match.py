"""The attention pattern table and its check (docs/attention.md#attention-raise): find matmul →
softmax → matmul blocks and read what each one computes.

In: a Graph. Out: `find_blocks` — per Softmax, the `AttentionBlock` it anchors (q, kᵀ, v and
the output; the score steps and post steps in the JSON form the raised CustomCall carries, and
the extra inputs they read; sequence lengths, head dim, dtype; variant notes for the report),
or the first reason the match is not an attention block. The gates and the raise are in
`attention`.

Pattern. Anchored on Softmax: `QK = MatMul(q, kᵀ)`, then up to four score steps, each a Mul or
Div by a scalar (the scale), an Add of any tensor (mask, position bias, computed at run time or
not), a Where with a scalar fill (masked_fill), a Cast, or a Reshape that views the scores with
other batch dims (keeping each row of keys whole), then Softmax, an optional tail (one Cast or
two, Dropout/Identity, the NaN guard `Where(IsNaN(P), 0, P)`, or a Reshape view), then
`MatMul(P, v)`. The variants are concrete graphs
matched by subgraph monomorphism, longest first (most specific first); they are written as
the ops they match (`_attention`, with `patterns/builder.py`), one variant per
choice. Q/K/V paths — where a scale may also sit (on Q, or √scale on both Q and Kᵀ), how
Kᵀ and the heads are formed, packed QKV, grouped-query K/V — are classified for the report
but stay in the graph: the kernel takes q, kᵀ and v as the QK and PV matmuls did, reshaped
only into the batch layout the views and grouped-query repeats define
(`patterns/attention/layout.py`), so no reshape is absorbed on a guess about its target.

A match counts only if it is valid by the matcher's rules (`patterns/matcher.py`: anchored,
self-contained, acyclic after fusing, non-overlapping — the first block in topological order
wins a contested node).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph
from onnx2bir.patterns.attention.causal import causal_problem, looks_causal
from onnx2bir.patterns.attention.layout import plan_layout
from onnx2bir.patterns.attention.padding import (
    PaddingSplit,
    describe_split,
    padding_split,
    rows_problem,
)
from onnx2bir.patterns.builder import PatternOps, expand
from onnx2bir.patterns.matcher import find_matches, validity_problem
from onnx2bir.patterns.queries import (
    cone_ops,
    cone_reaches_input,
    const_value,
    other_input,
    scalar_const,
    walk_up,
)

MAX_SCORE_STEPS = 4
_SCORE_OPS = ("Mul", "Div", "Add", "Where", "Cast", "Reshape")


# "cast_cast": softmax(scores, dtype=float32).to(query.dtype), as current transformers
# releases write eager attention, exports as Softmax → Cast → Cast. "reshape": the
# probabilities viewed with other batch dims before the PV matmul (DeBERTa, BLOOM).
TAILS = ("none", "cast", "cast_cast", "identity", "nan_guard", "reshape")


def _attention(op: PatternOps) -> str:
    """MatMul → 0..4 score steps → Softmax → optional tail → MatMul, written as its ops."""
    s = op.MatMul(None, None, key="qk")
    steps = MAX_SCORE_STEPS - op.choose(MAX_SCORE_STEPS + 1)  # the longest first
    for index in range(steps):
        s = op.any_of(*_SCORE_OPS)(s, key=f"step{index}", commutative=True)
    p = op.Softmax(s, key="softmax")
    tail = TAILS[op.choose(len(TAILS))]
    if tail == "cast":
        p = op.Cast(p, key="tail_cast")
    elif tail == "cast_cast":
        p = op.Cast(op.Cast(p, key="tail_cast"), key="tail_cast2")
    elif tail == "identity":
        p = op.any_of("Dropout", "Identity")(p, key="tail_identity")
    elif tail == "nan_guard":
        p = op.Where(op.IsNaN(p, key="isnan"), None, p, key="guard")
    elif tail == "reshape":
        p = op.Reshape(p, None, key="tail_reshape")
    op.MatMul(p, None, key="pv")
    op.tag(f"{steps} steps")
    op.tag(tail)
    return "softmax"


PATTERNS = expand("attention.mm_softmax_mm", _attention)


@dataclass
class AttentionBlock:
    """One matched block: its nodes and what the check learnt about it."""

    match: dict[str, str]
    pattern: str
    q: str = ""
    kt: str = ""
    v: str = ""
    output: str = ""
    steps: list[dict] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    # The batch dims the scores are seen in: the QK matmul's, then one per Reshape that views
    # them anew (patterns/attention/layout.py); each extra input's index into them.
    spaces: list[tuple[int, ...]] = field(default_factory=list)
    extra_spaces: list[int] = field(default_factory=list)
    post_steps: list[dict] = field(default_factory=list)
    variant: list[str] = field(default_factory=list)
    causal: bool = False  # the score mask is the causal triangle (the kernel applies it itself)
    # Per score step index, a mask read as causal (or nothing) and key padding
    # (patterns/attention/padding.py): the raise splits that step in two.
    splits: dict[int, PaddingSplit] = field(default_factory=dict)
    seq_q: int = 0
    seq_k: int = 0
    head_dim: int = 0
    dtype: Dtype = Dtype.FP32

    @property
    def nodes(self) -> list[str]:
        return list(self.match.values())


def check_block(
    graph: Graph, match: dict[str, str], pattern: str
) -> tuple[AttentionBlock | None, str | None]:
    """Read the matched block; None and a reason when it is not an attention block."""
    block = AttentionBlock(match, pattern)
    qk, softmax, pv = graph.node(match["qk"]), graph.node(match["softmax"]), graph.node(match["pv"])
    block.q, block.kt = qk["inputs"][:2]
    block.v, block.output = pv["inputs"][1], pv["outputs"][0]
    if const_value(graph, block.q) is not None or const_value(graph, block.kt) is not None:
        return None, "QK matmul has a constant operand (a projection, not attention)"
    shapes = [tuple(graph.tensors[t].shape) for t in (block.q, block.kt, block.v)]
    if any(len(s) < 2 for s in shapes):
        return None, "q, kᵀ or v has rank < 2"
    (block.seq_q, block.head_dim), (_, block.seq_k) = shapes[0][-2:], shapes[1][-2:]
    block.dtype = graph.tensors[block.q].dtype
    rank = len(graph.tensors[softmax["outputs"][0]].shape)
    axis = softmax["attrs"].get("axis", -1 if graph.opset >= 13 else 1) % rank
    if axis != rank - 1:
        return None, f"softmax over axis {axis}, not the key axis {rank - 1}"
    current = qk["outputs"][0]
    block.spaces.append(tuple(graph.tensors[current].shape[:-2]))
    step_keys = sorted((k for k in match if k.startswith("step")), key=lambda k: int(k[4:]))
    for key in step_keys:
        reason = _read_step(graph, match[key], current, block)
        if reason:
            return None, f"{graph.node(match[key])['op_type']} {match[key]!r}: {reason}"
        current = graph.node(match[key])["outputs"][0]
    _settle_splits(graph, block)
    if "guard" in match:
        guard = graph.node(match["guard"])
        if scalar_const(graph, guard["inputs"][1]) != 0.0:
            return None, "Where after softmax is not the NaN guard (fill is not 0)"
        block.post_steps.append({"op": "nan_to_zero"})
        block.variant.append("NaN guard after softmax")
    if "tail_reshape" in match:
        reason = _read_view(graph, match["tail_reshape"], softmax["outputs"][0], block)
        if reason:
            return None, f"Reshape {match['tail_reshape']!r} after softmax: {reason}"
    casts = [match[key] for key in ("tail_cast", "tail_cast2") if key in match]
    for cast in casts:
        if not graph.tensors[graph.node(cast)["outputs"][0]].dtype.is_float:
            return None, "casts the probabilities to a non-float type"
    if casts:
        block.variant.append("Cast after softmax" + (f" (x{len(casts)})" if len(casts) > 1 else ""))
    nodes = set(match.values())
    problem = validity_problem(graph, nodes, {block.output})
    if problem:
        return None, problem
    _classify_paths(graph, block)
    layout, reason = plan_layout(graph, block)
    if layout is None:
        return None, reason
    if layout.grouped:
        block.variant.append("grouped-query K/V read once per group (zero-stride heads)")
    return block, None


def _read_view(graph: Graph, node: str, current: str, block: AttentionBlock) -> str | None:
    """A Reshape of the scores that keeps each row of keys whole: a view with other batch
    dims (`block.spaces`), no step of the kernel's."""
    data = graph.node(node)
    if data["inputs"][0] != current:
        return "reshapes its shape input by the scores"
    before = tuple(graph.tensors[current].shape)
    after = tuple(graph.tensors[data["outputs"][0]].shape)
    if len(after) < 2 or after[-2:] != before[-2:]:
        return f"changes the score rows {list(before[-2:])} to {list(after[-2:])}"
    block.spaces.append(after[:-2])
    block.variant.append(f"scores viewed as {list(after[:-2])}")
    return None


def _read_step(graph: Graph, node: str, current: str, block: AttentionBlock) -> str | None:
    data = graph.node(node)
    op = data["op_type"]
    found = other_input(graph, node, current)
    if op == "Reshape":
        return _read_view(graph, node, current, block)
    if op == "Cast":
        if graph.tensors[data["outputs"][0]].dtype.is_float:
            block.variant.append("Cast around softmax")
            return None
        return "casts scores to a non-float type"
    if found is None:
        return "reads the scores twice"
    index, other = found
    if op in ("Mul", "Div"):
        value = scalar_const(graph, other)
        if value is None:
            return "does not scale by a scalar constant"
        if op == "Div" and index == 0:
            return "divides a constant by the scores"
        block.steps.append({"op": "scale" if op == "Mul" else "divide", "value": value})
        block.variant.append(f"scale {op}({value:.6g}) after QK")
        return None
    if op == "Add":
        block.extras.append(other)
        block.extra_spaces.append(len(block.spaces) - 1)
        block.steps.append({"op": "add", "input": len(block.extras) - 1})
        mask = const_value(graph, other)
        # docs/attention.md#structural-causality: a mask too big to fold is read structurally.
        why = (
            "folded" if mask is not None else causal_problem(graph, other, block.seq_q, block.seq_k)
        )
        if mask is not None and _is_causal_mask(mask, block.seq_q, block.seq_k):
            block.causal = True
            block.variant.append("causal mask (constant)")
        elif why is None:
            block.causal = True
            block.variant.append("causal mask (structural)")
        else:
            split, split_why = _split(graph, block, mask is None, other)
            if split is not None:
                return None
            kind = "causal " if {"Trilu", "LessOrEqual", "Less"} & cone_ops(graph, other) else ""
            source = "runtime" if cone_reaches_input(graph, other) else "constant"
            block.variant.append(f"additive {kind}mask/bias ({source})")
            if mask is None and looks_causal(graph, other):
                block.variant.append(f"not the causal triangle: {why}")
            if split_why and source == "runtime":
                block.variant.append(f"no causal/padding split: {split_why}")
        return None
    if op == "Where":
        inputs = data["inputs"]
        scores_at = inputs.index(current)
        fill_at = 3 - scores_at if scores_at in (1, 2) else None
        fill = scalar_const(graph, inputs[fill_at]) if fill_at else None
        if fill is None:
            return "Where without a scalar fill value"
        block.extras.append(inputs[0])
        block.extra_spaces.append(len(block.spaces) - 1)
        block.steps.append(
            {
                "op": "masked_fill",
                "input": len(block.extras) - 1,
                "value": fill,
                "fill_on_true": fill_at == 1,
            }
        )
        cond = const_value(graph, inputs[0])
        masked = (
            None if cond is None else (cond.astype(bool) if fill_at == 1 else ~cond.astype(bool))
        )
        # docs/attention.md#structural-causality: a mask too big to fold is read structurally.
        on_true = fill_at == 1
        why = (
            "folded"
            if cond is not None
            else causal_problem(graph, inputs[0], block.seq_q, block.seq_k, fill, on_true)
        )
        if (
            masked is not None
            and fill <= -1e4
            and _is_causal_mask(np.where(masked, -np.inf, 0.0), block.seq_q, block.seq_k)
        ):
            block.causal = True
            block.variant.append(f"causal masked_fill Where({fill:g}) (constant)")
        elif why is None:
            block.causal = True
            block.variant.append(f"causal masked_fill Where({fill:g}) (structural)")
        else:
            split, split_why = _split(graph, block, cond is None, inputs[0], fill, on_true)
            if split is not None:
                return None
            causal = "causal " if "Trilu" in cone_ops(graph, inputs[0]) else ""
            block.variant.append(f"{causal}masked_fill Where({fill:g})")
            if cond is None and looks_causal(graph, inputs[0]):
                block.variant.append(f"not the causal triangle: {why}")
            if split_why and cone_reaches_input(graph, inputs[0]):
                block.variant.append(f"no causal/padding split: {split_why}")
        return None
    return f"unexpected op {op}"


def _split(
    graph: Graph,
    block: AttentionBlock,
    computed: bool,
    tensor: str,
    fill: float | None = None,
    on_true: bool = True,
) -> tuple[PaddingSplit | None, str | None]:
    """The last step's mask (or condition) read as causal and key padding
    (docs/attention.md#padding-split), recorded on the block; or None and the reason. A folded
    mask is not split: it costs nothing to compute."""
    if not computed:
        return None, None
    split, why = padding_split(graph, tensor, block.seq_q, block.seq_k, fill, on_true)
    if split is not None:
        block.splits[len(block.steps) - 1] = split
        block.causal = block.causal or split.causal
        block.variant.append(describe_split(split))
    return split, why


def _settle_splits(graph: Graph, block: AttentionBlock) -> None:
    """Refuse, once every step is read, a split whose rows that keep no key the raise could not
    give the model's answer for (`padding.rows_problem`: another masking step around it): the
    mask is then read whole, and the block is causal only if another step is."""
    refused = False
    for index, split in list(block.splits.items()):
        why = rows_problem(split, block.steps, index)
        if why is None:
            continue
        del block.splits[index]
        at = block.variant.index(describe_split(split))
        block.variant[at] = f"no causal/padding split: {why}"
        refused = True
    if refused:
        block.causal = any(s.causal for s in block.splits.values()) or any(
            step["op"] in ("add", "masked_fill")
            and index not in block.splits
            and _is_causal_step(graph, step, block.extras[step["input"]], block)
            for index, step in enumerate(block.steps)
        )


def _is_causal_step(graph: Graph, step: dict, tensor: str, block: AttentionBlock) -> bool:
    """Whether an add or masked_fill step applies exactly the causal triangle: a folded
    constant, or a subgraph read structurally (docs/attention.md#structural-causality)."""
    value = const_value(graph, tensor)
    if value is None:
        fill = step["value"] if step["op"] == "masked_fill" else None
        on_true = step.get("fill_on_true", True)
        return causal_problem(graph, tensor, block.seq_q, block.seq_k, fill, on_true) is None
    if step["op"] == "add":
        return _is_causal_mask(value, block.seq_q, block.seq_k)
    masked = value.astype(bool) if step["fill_on_true"] else ~value.astype(bool)
    return step["value"] <= -1e4 and _is_causal_mask(
        np.where(masked, -np.inf, 0.0), block.seq_q, block.seq_k
    )


def _is_causal_mask(mask: np.ndarray, seq_q: int, seq_k: int) -> bool:
    """A constant mask that is 0 on and below the diagonal and very negative above it."""
    if mask.shape[-2:] != (seq_q, seq_k) or not np.issubdtype(mask.dtype, np.floating):
        return False
    rows = np.arange(seq_q)[:, None] + (seq_k - seq_q)
    above = np.arange(seq_k)[None, :] > rows
    flat = mask.reshape(-1, seq_q, seq_k)
    return bool(np.all(flat[:, ~above] == 0) and np.all(flat[:, above] <= -1e4))


def _classify_paths(graph: Graph, block: AttentionBlock) -> None:
    path_ops = {
        "Transpose",
        "Reshape",
        "Mul",
        "Div",
        "Expand",
        "Unsqueeze",
        "Squeeze",
        "Split",
        "Slice",
        "Gather",
        "Add",
        "Cast",
    }
    paths = {
        name: walk_up(graph, tensor, path_ops, limit=8)
        for name, tensor in (("q", block.q), ("k", block.kt), ("v", block.v))
    }
    scaled = [
        name
        for name in ("q", "k")
        if any(
            d["op_type"] in ("Mul", "Div") and scalar_const(graph, d["inputs"][1]) is not None
            for _, d in paths[name][:3]
        )
    ]
    if scaled == ["q", "k"]:
        block.variant.append("scale split as √scale on Q and Kᵀ")
    elif scaled == ["q"]:
        block.variant.append("scale folded into Q")
    if not any(s["op"] in ("scale", "divide") for s in block.steps) and not scaled:
        block.variant.append("no scale")
    k_ops = [d["op_type"] for _, d in paths["k"]]
    if k_ops[:1] == ["Transpose"]:
        block.variant.append(f"Kᵀ by Transpose{tuple(paths['k'][0][1]['attrs'].get('perm', []))}")
    elif k_ops[:3] == ["Reshape", "Transpose", "Reshape"] or k_ops[:2] == ["Mul", "Reshape"]:
        block.variant.append("Kᵀ by a Reshape/Transpose chain")
    if [d["op_type"] for _, d in paths["q"][:2]] == ["Transpose", "Reshape"]:
        block.variant.append("heads split by Reshape/Transpose")
    for source_op in ("Split", "Slice", "Gather"):
        if all(source_op in [d["op_type"] for _, d in paths[n]] for n in ("q", "k", "v")):
            block.variant.append(f"packed QKV ({source_op})")
            break
    if any(d["op_type"] == "Expand" for n in ("k", "v") for _, d in paths[n]):
        block.variant.append("grouped-query K/V (Expand)")
    caches = [_cache_input(graph, tensor) for tensor in (block.kt, block.v)]
    if all(caches):
        block.variant.append(f"K/V cache: past {caches[0]!r}, {caches[1]!r} + new keys (Concat)")


_CACHE_PATH = ("Transpose", "Reshape", "Expand", "Unsqueeze", "Identity", "Cast")


def _cache_input(graph: Graph, tensor: str) -> str | None:
    """The graph input a K or V is concatenated from along the keys, past before new (a KV
    cache: `present = Concat(past, new)`), through the head-repeat and Kᵀ views."""
    for _ in range(8):
        node = graph.producer(tensor)
        if node is None:
            return None
        data = graph.node(node)
        if data["op_type"] == "Concat":
            rank = len(graph.tensors[tensor].shape)
            if data["attrs"].get("axis") % rank != rank - 2 or len(data["inputs"]) < 2:
                return None
            return _input_behind(graph, data["inputs"][0])
        if data["op_type"] not in _CACHE_PATH:
            return None
        tensor = data["inputs"][0]
    return None


def _input_behind(graph: Graph, tensor: str) -> str | None:
    """The graph input `tensor` is, or is a copy of: a one-input Concat, an Identity, a Slice
    that keeps every element (a sliding-window cache longer than the past)."""
    for _ in range(4):
        if tensor in graph.inputs:
            return tensor
        node = graph.producer(tensor)
        if node is None:
            return None
        data = graph.node(node)
        source = data["inputs"][0]
        whole = graph.tensors[source].shape == graph.tensors[tensor].shape
        if not whole or data["op_type"] not in ("Concat", "Identity", "Slice"):
            return None
        if data["op_type"] == "Concat" and len(data["inputs"]) != 1:
            return None
        tensor = source
    return None


def find_blocks(graph: Graph) -> list[tuple[AttentionBlock | None, dict, str | None]]:
    """Every attention block, first in topological order wins a contested node."""
    claimed: set[str] = set()
    found = []
    for node in graph.topological_order():
        if graph.node(node)["op_type"] != "Softmax" or node in claimed:
            continue
        first_reason = None
        for pattern in PATTERNS:
            for match in find_matches(graph, pattern, node, radius=MAX_SCORE_STEPS + 4):
                if claimed & set(match.values()):
                    continue
                block, reason = check_block(graph, match, pattern.name)
                if block is not None:
                    claimed.update(match.values())
                    found.append((block, match, None))
                    break
                first_reason = first_reason or reason
            else:
                continue
            break
        else:
            found.append((None, {"softmax": node}, first_reason or describe_unmatched(graph, node)))
    return found


_PATH_LIMIT = 10  # ops walked each way from an unmatched Softmax
_MATMULS = ("MatMul", "Gemm", "Einsum")


def describe_unmatched(graph: Graph, softmax: str) -> str:
    """Why a Softmax no attention pattern matched is not a block: the ops between it and the
    matmuls on either side, as far as they go (every Softmax is listed, docs/attention.md)."""
    up, tensor, qk = [], graph.node(softmax)["inputs"][0], None
    for _ in range(_PATH_LIMIT):
        node = graph.producer(tensor)
        if node is None:
            break
        data = graph.node(node)
        live = [t for t in data["inputs"] if t and const_value(graph, t) is None]
        if data["op_type"] in _MATMULS and len(live) >= 2:
            qk = node
            break
        up.append(data["op_type"] + (" by a constant" if data["op_type"] in _MATMULS else ""))
        if len(live) != 1:
            break
        tensor = live[0]
    down, tensor, pv = [], graph.node(softmax)["outputs"][0], None
    for _ in range(_PATH_LIMIT):
        users = graph.consumers(tensor)
        if len(users) != 1:
            break
        data = graph.node(users[0][0])
        live = [t for t in data["inputs"] if t and const_value(graph, t) is None]
        if data["op_type"] in _MATMULS and len(live) >= 2:
            pv = users[0][0]
            break
        down.append(data["op_type"] + (" by a constant" if data["op_type"] in _MATMULS else ""))
        tensor = data["outputs"][0]
    before = f"QK {graph.node(qk)['op_type']} {qk!r}" if qk else "?"
    chain = " → ".join([*reversed(up), "Softmax", *down])
    after = f"PV {graph.node(pv)['op_type']} {pv!r}" if pv else "?"
    if qk is None:
        return f"no matmul of two computed operands feeds the Softmax ({chain} → {after})"
    if pv is None:
        return f"the probabilities reach no matmul with a computed operand ({before} → {chain})"
    mixing = any(op.endswith("by a constant") for op in [*up, *down])
    heads = "the scores are mixed across heads by a constant matmul (talking heads); "
    return (
        f"{before} → {chain} → {after}: "
        + (heads if mixing else "")
        + "the kernel takes only score steps (scale, Add, masked-fill Where, Cast, a row-keeping "
        "Reshape) before the softmax and a Cast, Dropout, NaN guard or Reshape after it"
    )
