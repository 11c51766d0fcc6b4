"""Fused attention ops as attention blocks (docs/attention_kernel.md#blocks).

In: a Graph node that is already one attention — `onnx.Attention` (opset 23) or the
com.microsoft `Attention`, `MultiHeadAttention` and `GroupQueryAttention` contrib ops. Out:
`read_fused`, a `FusedAttention` with what the gates need (sequence lengths, head dims, dtype,
causal) plus the reason the kernel cannot take this form (None when it can: the block is then
raised if the gates pass, decomposed by DecomposeAttention otherwise); and `raise_fused`, the
rewrite into the kernel's operands.

The kernel takes q [B, G…, Sq, D], kᵀ [B, G…, D, Sk], v [B, G…, Sk, Dv] with batch dims that
broadcast: grouped-query heads are laid out as q [B, Hkv, r, Sq, D] against K/V
[B, Hkv, 1, …], so every query head of a group reads its K/V head through a zero stride, never
a copy. `raise_fused` builds that packaging (Reshape, Transpose, and Casts for the cast
policy) around one CustomCall and merges the heads back into the op's output layout; it
returns how many nodes of each kind it built, which the report lists.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph
from onnx2bir.patterns.attention.decompose_build import (
    Emitter,
    Heads,
    broadcast,
    group_shape,
    merge_heads,
    split_heads,
)

MS_DOMAIN = "com.microsoft"
SOURCES = {
    ("", "Attention"): "onnx.Attention",
    ("ai.onnx", "Attention"): "onnx.Attention",
    (MS_DOMAIN, "Attention"): "com.microsoft.Attention",
    (MS_DOMAIN, "MultiHeadAttention"): "com.microsoft.MultiHeadAttention",
    (MS_DOMAIN, "GroupQueryAttention"): "com.microsoft.GroupQueryAttention",
}


def source_of(data: dict) -> str | None:
    return SOURCES.get((data["domain"], data["op_type"]))


@dataclass
class FusedAttention:
    """One fused attention node and what the raise needs to know about it."""

    node: str
    source: str
    dtype: Dtype
    heads: Heads | None = None
    rank: int = 4
    q: str = ""
    k: str = ""
    v: str = ""
    output: str = ""
    scale: float = 1.0
    causal: bool = False
    mask: str = ""
    mask_bool: bool = False
    variant: list[str] = field(default_factory=list)
    problem: str | None = None  # why the kernel cannot take this form

    # the gate's view, shared with matched blocks
    @property
    def seq_q(self) -> int:
        return self.heads.seq_q if self.heads else 0

    @property
    def seq_k(self) -> int:
        return self.heads.seq_k if self.heads else 0

    @property
    def head_dim(self) -> int:
        return self.heads.head if self.heads else 0

    @property
    def nodes(self) -> list[str]:
        return [self.node]


def _shape(graph: Graph, tensor: str) -> tuple[int, ...]:
    return tuple(graph.tensors[tensor].shape)


def _unused_outputs(graph: Graph, data: dict) -> str | None:
    used = [t for t in data["outputs"][1:] if t and (graph.consumers(t) or t in graph.outputs)]
    return f"outputs {', '.join(used)} are used (only the attention output is)" if used else None


def read_fused(graph: Graph, node: str) -> FusedAttention | None:
    data = graph.node(node)
    source = source_of(data)
    if source is None:
        return None
    inputs = list(data["inputs"])
    block = FusedAttention(node, source, graph.tensors[inputs[0]].dtype)
    block.output = data["outputs"][0]
    block.variant.append(source)
    reader = {
        "onnx.Attention": _read_onnx,
        "com.microsoft.MultiHeadAttention": _read_ms_mha,
    }.get(source)
    if reader is None:
        block.problem = (
            "packed input projection (weights inside the op): decomposed, not raised"
            if source == "com.microsoft.Attention"
            else "rotary and KV-cache inputs of GroupQueryAttention are not supported"
        )
        return block
    block.problem = reader(graph, data, block) or _unused_outputs(graph, data)
    return block


def _read_onnx(graph: Graph, data: dict, b: FusedAttention) -> str | None:
    attrs = data["attrs"]
    inputs = list(data["inputs"]) + [""] * (7 - len(data["inputs"]))
    b.q, b.k, b.v, b.mask = inputs[:4]
    sq_, sk_, sv_ = _shape(graph, b.q), _shape(graph, b.k), _shape(graph, b.v)
    b.rank = len(sq_)
    if b.rank == 4:
        b.heads = Heads(sq_[0], sq_[1], sk_[1], sq_[2], sk_[2], sq_[3], sv_[3])
    elif b.rank == 3 and "q_num_heads" in attrs and "kv_num_heads" in attrs:
        hq, hkv = attrs["q_num_heads"], attrs["kv_num_heads"]
        if sq_[2] % hq or sk_[2] % hkv or sv_[2] % hkv:
            return f"hidden sizes {sq_[2]}, {sk_[2]}, {sv_[2]} do not split into {hq}/{hkv} heads"
        b.heads = Heads(sq_[0], hq, hkv, sq_[1], sk_[1], sq_[2] // hq, sv_[2] // hkv)
    else:
        return f"inputs of rank {b.rank} without q_num_heads/kv_num_heads"
    h = b.heads
    if h.q_heads % h.kv_heads:
        return f"{h.q_heads} query heads are not a multiple of {h.kv_heads} kv heads"
    if h.group > 1:
        b.variant.append(f"grouped-query {h.q_heads}/{h.kv_heads} heads")
    b.scale = attrs.get("scale") or 1.0 / math.sqrt(h.head)
    b.causal = bool(attrs.get("is_causal", 0))
    if b.causal:
        b.variant.append("is_causal")
    if b.mask:
        b.mask_bool = graph.tensors[b.mask].dtype is Dtype.BOOL
        b.variant.append(f"{'bool' if b.mask_bool else 'float'} attn_mask")
    if inputs[4] or inputs[5]:
        b.variant.append("past K/V")
        return "past_key/past_value (KV cache) are not supported by the kernel"
    if inputs[6]:
        return "nonpad_kv_seqlen is not supported by the kernel"
    if attrs.get("softcap", 0.0) > 0:
        b.variant.append(f"softcap {attrs['softcap']:g}")
        return "softcap needs a tanh score step the kernel does not have"
    for window in ("left_window_size", "right_window_size"):
        if attrs.get(window, -1) != -1:
            return f"{window} (sliding window) is not supported by the kernel"
    precision = attrs.get("softmax_precision")
    if precision and onnx.helper.tensor_dtype_to_np_dtype(precision) not in (
        np.float32,
        b.dtype.numpy,
    ):
        return f"softmax_precision {precision} is neither fp32 nor the input dtype"
    if b.causal and h.seq_q != h.seq_k:
        return f"is_causal with {h.seq_q} queries and {h.seq_k} keys (the kernel aligns the ends)"
    return _check_mask(graph, b, (h.batch, h.q_heads, h.seq_q, h.seq_k))


def _read_ms_mha(graph: Graph, data: dict, b: FusedAttention) -> str | None:
    attrs = data["attrs"]
    inputs = list(data["inputs"]) + [""] * (10 - len(data["inputs"]))
    b.q, b.k, b.v, bias, padding, b.mask = inputs[:6]
    if not b.k or not b.v or len(_shape(graph, b.q)) != 3 or len(_shape(graph, b.k)) != 3:
        return "packed QKV/KV or a BNSH key (only 3-D query, key and value are raised)"
    heads = attrs["num_heads"]
    (batch, seq_q, d), (_, seq_k, _), (_, _, dv) = (
        _shape(graph, b.q),
        _shape(graph, b.k),
        _shape(graph, b.v),
    )
    if d % heads or dv % heads:
        return f"hidden sizes {d}, {dv} are not multiples of num_heads {heads}"
    b.rank = 3
    b.heads = Heads(batch, heads, heads, seq_q, seq_k, d // heads, dv // heads)
    b.scale = attrs.get("scale", 0.0) or 1.0 / math.sqrt(b.heads.head)
    b.causal = bool(attrs.get("unidirectional", 0)) and seq_q > 1
    if b.causal:
        b.variant.append("unidirectional")
    if b.mask:
        b.variant.append("attention_bias")
    if any(inputs[6:]):
        return "past state inputs are not supported by the kernel"
    if bias:
        return "the packed q/k/v bias input is decomposed, not raised"
    if padding:
        return "key_padding_mask (filled with mask_filter_value) is decomposed, not raised"
    if b.causal and seq_q != seq_k:
        return f"unidirectional with {seq_q} queries and {seq_k} keys"
    return _check_mask(graph, b, (batch, heads, seq_q, seq_k))


def _check_mask(graph: Graph, b: FusedAttention, full: tuple[int, ...]) -> str | None:
    if not b.mask:
        return None
    shape = _shape(graph, b.mask)
    try:
        if broadcast(shape, full) != full:
            return f"mask {shape} does not broadcast to the scores {full}"
    except Exception:  # noqa: BLE001 — Unsupported from broadcast, reported as the reason
        return f"mask {shape} does not broadcast to the scores {full}"
    return None


# --- the rewrite -------------------------------------------------------------------------------
def raise_fused(
    graph: Graph,
    b: FusedAttention,
    target: str,
    storage: Dtype,
    config: dict,
    available: frozenset[str],
) -> Counter:
    """Replace the node by packaging + one CustomCall; returns the packaging's op counts."""
    h = b.heads
    em = Emitter(graph, b.node, available | {"CustomCall"}, remove=[b.node], stage="")
    operands = [
        split_heads(em, b.q, "q", h, h.q_dims, h.seq_q, h.head),
        split_heads(em, b.k, "k", h, h.kv_dims, h.seq_k, h.head),
        split_heads(em, b.v, "v", h, h.kv_dims, h.seq_k, h.v_head),
    ]
    operands = [
        _cast(em, tensor, storage, f"cast_{role}")
        for tensor, role in zip(operands, ("q", "kt", "v"), strict=True)
    ]
    steps: list[dict] = [{"op": "scale", "value": b.scale}]
    if b.causal:
        steps.append({"op": "causal"})
    extras, post = [], []
    if b.mask:
        extras.append(em.reshape("attn_mask", b.mask, group_shape(em.shape(b.mask), h)))
        if b.mask_bool:  # True = may attend
            fill = {"op": "masked_fill", "input": 0, "value": -math.inf, "fill_on_true": False}
            steps.append(fill)
        else:
            steps.append({"op": "add", "input": 0})
        post.append({"op": "nan_to_zero"})  # a fully masked row gives 0, as the decomposition
    out_shape = (h.batch, *h.q_dims, h.seq_q, h.v_head)
    y = em.node(
        "CustomCall",
        "kernel",
        [*operands, *extras],
        out_shape,
        storage,
        custom_call_target=target,
        backend_config=json.dumps(config),
        api_version=1,
        steps=json.dumps(steps),
        post_steps=json.dumps(post),
        storage_dtype=str(storage),
    )
    out_dtype = graph.tensors[b.output].dtype
    if storage is not out_dtype:
        y = _cast(em, y, out_dtype, "cast_out")
    em.finish(merge_heads(em, y, h, b.rank), b.output)
    # The kernel node takes the fused node's name, so reports and origins keep pointing at it.
    em.nodes = [
        (b.node if op == "CustomCall" else name, op, ins, outs, attrs)
        for name, op, ins, outs, attrs in em.nodes
    ]
    packaging = Counter(op for _, op, _, _, _ in em.nodes if op != "CustomCall")
    em.commit()
    return packaging


def _cast(em: Emitter, tensor: str, dtype: Dtype, part: str) -> str:
    if em.info(tensor).dtype is dtype:
        return tensor
    to = onnx.helper.np_dtype_to_tensor_dtype(dtype.numpy)
    return em.node("Cast", part, [tensor], em.shape(tensor), dtype, to=to)
