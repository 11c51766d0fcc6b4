"""DecomposeAttention (docs/attention.md#decompose, pass #38): expand a fused attention root back
into plain ONNX math that the generic code generator lowers.

In: a Graph after the attention raise (#37). Roots, in topological order:
1. an attention CustomCall left by LowerToCustomNativeKernel whose target is not in the kernel
   registry — "the kernel is not selected", the reference's canonicalization fallback. Its
   `steps`/`post_steps` are applied exactly, and the Casts the raise put around it for the cast
   policy are removed, so the math runs in the model's own dtype again;
2. `onnx.Attention` (opset ≥ 23, the form opset-23 exports emit, docs/attention.md#idioms):
   4-D [B, H, S, D] or 3-D [B, S, H·D] inputs, GQA/MQA, `scale`, `is_causal`, a bool or float
   `attn_mask`, `softcap` (with Tanh);
3. `com.microsoft.MultiHeadAttention` (3-D query/key/value, `bias`, a 2-D or 3-D 0/1
   `key_padding_mask`, `attention_bias`, `unidirectional`) and `com.microsoft.Attention`
   (packed weights and bias, split by numpy when constant, by Slice otherwise; a 2-D or 3-D
   0/1 `mask_index`, `attention_bias`, `unidirectional`), as onnxruntime's CPU kernels compute
   them.
Out: each root replaced by nodes named "<root>/decomposed/<part>":

    S = MatMul(Q, Kᵀ) → Mul/Div(scale) → masks (Add of a bias, Where for a masked fill)
    P = Exp(S − rowmax) / ReduceSum(Exp(S − rowmax))
    Y = MatMul(P, V)

the numerically stable softmax of docs/attention.md#decompose. The nodes are staged by
`attention_math` (the Emitter, the shared core with its fully-masked-row guard, the grouped-query
head layout); the planners here read each root's inputs and attributes into that core.

A root is rewritten only if every op of its replacement has a generic lowering (checked
against the registry at run time); otherwise it stays and its finding gives the reason. An
`onnx.Attention` the planner refuses (KV cache, `nonpad_kv_seqlen`, sliding windows, a read
`qk_matmul_output`, another `softmax_precision`) is replaced by its ONNX function body instead
(patterns/attention/function_body.py); its finding adds `expanded`, `raise_reason` (what
`read_fused` said) and the `note` the user sees, and stays listed with its reason.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import numpy as np
import onnx

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.graph import Graph
from onnx2bir.kernels import KERNELS
from onnx2bir.kernels.attention import TARGETS
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention import function_body
from onnx2bir.patterns.attention.decompose_build import (
    Emitter,
    Heads,
    Unsupported,
    broadcast,
    causal_bias,
    emit_core,
    group_shape,
    merge_heads,
    split_heads,
)
from onnx2bir.patterns.attention.decompose_build import lowest as lowest  # re-exported
from onnx2bir.patterns.attention.decompose_match import NO_SOFTMAX, explore
from onnx2bir.patterns.attention.function_body import is_onnx_attention
from onnx2bir.patterns.attention.fused import read_fused
from onnx2bir.patterns.attention.match import _is_causal_mask
from onnx2bir.patterns.attention.raising import gate
from onnx2bir.patterns.passes import PassResult, Statistic

log = logging.getLogger("onnx2bir.DecomposeAttention")

MS_DOMAIN = "com.microsoft"
DEFAULT_MASK_FILTER = -10000.0  # com.microsoft attention ops' mask_filter_value default


# --- roots -----------------------------------------------------------------------------------
def plan_custom_call(em: Emitter, data: dict) -> None:
    """The raise's CustomCall → its block, in the dtype the model had before the cast policy."""
    graph, name = em.graph, em.root
    attrs = data["attrs"]
    steps, post = json.loads(attrs.get("steps", "[]")), json.loads(attrs.get("post_steps", "[]"))
    q, kt, v = (_uncast(em, t) for t in data["inputs"][:3])
    extras = [_unview(em, t) for t in data["inputs"][3:]]
    if len({em.info(t).dtype for t in (q, kt, v)}) != 1:
        raise Unsupported("q, kᵀ and v have different dtypes")
    output = data["outputs"][0]
    users = graph.consumers(output)
    if (  # the raise's packaging: the kernel's layout viewed back into the block's output
        len(users) == 1
        and users[0][0] == f"{name}/layout_out/reshape"
        and output not in graph.outputs
    ):
        em.remove.append(users[0][0])
        output = graph.node(users[0][0])["outputs"][0]
        users = graph.consumers(output)
    if (
        len(users) == 1
        and users[0][0] == f"{name}/cast_out"
        and output not in graph.outputs
        and graph.node(users[0][0])["op_type"] == "Cast"
    ):
        em.remove.append(users[0][0])
        output = graph.node(users[0][0])["outputs"][0]
    (seq_q, seq_k), dtype = (em.shape(q)[-2], em.shape(kt)[-1]), em.info(q).dtype
    used = {s["input"] for s in steps if "input" in s}
    core = []
    for step in steps:
        op = step["op"]
        if op in ("scale", "divide"):
            core.append((op, step["value"]))
        elif op == "add":
            if em.info(extras[step["input"]]).dtype is not dtype:
                raise Unsupported(f"the added {extras[step['input']]!r} is not in {dtype}")
            core.append(("add", extras[step["input"]]))
        elif op == "masked_fill":
            core.append(("fill", extras[step["input"]], step["value"], step["fill_on_true"]))
        elif op == "causal":
            core.append(("add", _causal_extra(em, extras, used, seq_q, seq_k, dtype)))
        else:
            raise Unsupported(f"unknown step {op!r}")
    for step in post:
        if step["op"] != "nan_to_zero":
            raise Unsupported(f"unknown post step {step['op']!r}")
    nan_to_zero = any(step["op"] == "nan_to_zero" for step in post)
    result = emit_core(em, q, kt, v, core, nan_to_zero=nan_to_zero)
    em.finish(em.reshape("layout_out", result, tuple(graph.tensors[output].shape)), output)


def _unview(em: Emitter, tensor: str) -> str:
    """Look through an identity Reshape of the raise's packaging ("<root>/layout_<role>"), so
    a constant mask reads as the constant it is."""
    producer = em.graph.producer(tensor)
    if producer is None or not producer.startswith(f"{em.root}/layout_"):
        return tensor
    source = em.graph.node(producer)["inputs"][0]
    return source if em.shape(source) == em.shape(tensor) else tensor


def _uncast(em: Emitter, tensor: str) -> str:
    """Bypass a Cast the raise inserted for the cast policy ("<root>/cast_<role>")."""
    producer = em.graph.producer(tensor)
    if producer is None or not producer.startswith(f"{em.root}/cast_"):
        return tensor
    if any(user != em.root for user, _ in em.graph.consumers(tensor)) or (
        tensor in em.graph.outputs
    ):
        return tensor
    if producer not in em.remove:
        em.remove.append(producer)
    return em.graph.node(producer)["inputs"][0]


def _causal_extra(
    em: Emitter, extras: list[str], used: set[int], seq_q: int, seq_k: int, dtype: Dtype
) -> str:
    """The constant triangle the raise turned into a "causal" step (still an operand), else a
    new one aligned as the raise's check reads it (key j visible iff j ≤ i + seq_k − seq_q)."""
    for index, tensor in enumerate(extras):
        value = em.const_value(tensor)
        if index not in used and value is not None and _is_causal_mask(value, seq_q, seq_k):
            return tensor
    return em.const("causal_mask", causal_bias(seq_q, seq_k, seq_k - seq_q, dtype))


def _outputs_unused(graph: Graph, data: dict, what: str) -> None:
    extra = [t for t in data["outputs"][1:] if t and (graph.consumers(t) or t in graph.outputs)]
    if extra:
        raise Unsupported(f"{what} output(s) {', '.join(extra)} are not supported")


def plan_onnx_attention(em: Emitter, data: dict) -> None:
    """onnx.Attention (opset 23) → heads, MatMul, scale, softcap, mask, softmax, MatMul."""
    graph, attrs = em.graph, data["attrs"]
    inputs = list(data["inputs"]) + [""] * (7 - len(data["inputs"]))
    q, k, v, mask = inputs[:4]
    if inputs[4] or inputs[5]:
        raise Unsupported("past_key/past_value (KV cache) are not supported")
    if inputs[6]:
        raise Unsupported("nonpad_kv_seqlen is not supported")
    _outputs_unused(graph, data, "present_key/present_value/qk_matmul_output")
    for window in ("left_window_size", "right_window_size"):
        if attrs.get(window, -1) != -1:
            raise Unsupported(f"{window} (sliding window) is not supported")
    dtype = em.info(q).dtype
    precision = attrs.get("softmax_precision")
    if precision and onnx.helper.tensor_dtype_to_np_dtype(precision) != dtype.numpy:
        raise Unsupported(f"softmax_precision {precision} differs from the input dtype {dtype}")
    sq_, sk_, sv_ = em.shape(q), em.shape(k), em.shape(v)
    rank = len(sq_)
    if rank == 4:
        h = Heads(sq_[0], sq_[1], sk_[1], sq_[2], sk_[2], sq_[3], sv_[3])
    elif rank == 3:
        if "q_num_heads" not in attrs or "kv_num_heads" not in attrs:
            raise Unsupported("3-D inputs without q_num_heads/kv_num_heads")
        hq, hkv = attrs["q_num_heads"], attrs["kv_num_heads"]
        if sq_[2] % hq or sk_[2] % hkv or sv_[2] % hkv:
            raise Unsupported(
                f"hidden sizes {sq_[2]}, {sk_[2]}, {sv_[2]} do not split into {hq}/{hkv} heads"
            )
        h = Heads(sq_[0], hq, hkv, sq_[1], sk_[1], sq_[2] // hq, sv_[2] // hkv)
    else:
        raise Unsupported(f"inputs of rank {rank} (expected 3 or 4)")
    if h.q_heads % h.kv_heads:
        raise Unsupported(f"{h.q_heads} query heads are not a multiple of {h.kv_heads} kv heads")
    scale = attrs.get("scale")
    steps: list[tuple] = [("scale", 1.0 / math.sqrt(h.head) if scale is None else scale)]
    if attrs.get("softcap", 0.0) > 0:
        steps.append(("softcap", attrs["softcap"]))
    full = (h.batch, h.q_heads, h.seq_q, h.seq_k)
    causal = causal_bias(h.seq_q, h.seq_k, 0, dtype) if attrs.get("is_causal", 0) else None
    if mask:
        if broadcast(em.shape(mask), full) != full:
            raise Unsupported(
                f"attn_mask {em.shape(mask)} does not broadcast to {full} (a "
                "mask shorter than the key sequence is padded by the spec)"
            )
        value = em.const_value(mask)
        if value is not None:  # fold a constant mask, and the causal triangle, into one bias
            bias = np.where(value, 0.0, -np.inf) if value.dtype == bool else value
            bias = (bias if causal is None else bias + causal).astype(dtype.numpy)
            steps.append(("add", em.const("attn_bias", bias.reshape(group_shape(bias.shape, h)))))
            causal = None
        elif em.info(mask).dtype is Dtype.BOOL:  # True = may attend (spec)
            grouped = em.reshape("attn_mask", mask, group_shape(em.shape(mask), h))
            steps.append(("fill", grouped, -np.inf, False))
        else:
            steps.append(("add", em.reshape("attn_mask", mask, group_shape(em.shape(mask), h))))
    if causal is not None:
        steps.append(("add", em.const("causal_mask", causal)))
    qh = split_heads(em, q, "q", h, h.q_dims, h.seq_q, h.head)
    kt = split_heads(em, k, "k", h, h.kv_dims, h.seq_k, h.head)
    vh = split_heads(em, v, "v", h, h.kv_dims, h.seq_k, h.v_head)
    # Only a mask can empty a row: the causal triangle without a past always shows key 0.
    out = emit_core(em, qh, kt, vh, steps, guard=bool(mask))
    em.finish(merge_heads(em, out, h, rank), data["outputs"][0])


def plan_ms_attention(em: Emitter, data: dict) -> None:
    """com.microsoft.Attention: packed input projection, then as MultiHeadAttention."""
    attrs = data["attrs"]
    inputs = list(data["inputs"]) + [""] * (7 - len(data["inputs"]))
    x, weights, bias, mask, past, attention_bias, past_length = inputs[:7]
    if past or past_length:
        raise Unsupported("past state is not supported")
    if attrs.get("do_rotary", 0):
        raise Unsupported("do_rotary is not supported")
    _outputs_unused(em.graph, data, "present")
    total = em.shape(weights)[1]
    sizes = attrs.get("qkv_hidden_sizes") or [total // 3] * 3
    if sum(sizes) != total:
        raise Unsupported(f"Q/K/V hidden sizes {sizes} do not add up to the weights' {total}")
    ends = np.cumsum([0, *sizes]).tolist()
    projected = []
    for i, role in enumerate("qkv"):
        w = em.take(f"w{role}", weights, ends[i], ends[i + 1])
        y = em.matmul(f"{role}_proj", x, w)
        if bias:
            y = em.binary("Add", f"{role}_bias", y, em.take(f"b{role}", bias, ends[i], ends[i + 1]))
        projected.append(y)
    q, k, v = projected
    _ms_core(em, data, q, k, v, mask, attention_bias)


def plan_ms_mha(em: Emitter, data: dict) -> None:
    """com.microsoft.MultiHeadAttention with separate 3-D query, key and value."""
    inputs = list(data["inputs"]) + [""] * (10 - len(data["inputs"]))
    q, k, v, bias, mask, attention_bias = inputs[:6]
    if any(inputs[6:]):
        raise Unsupported(
            "past_key/past_value/past_sequence_length/cache_indirection are not supported"
        )
    _outputs_unused(em.graph, data, "present_key/present_value/qk")
    if not k or not v or len(em.shape(q)) != 3 or len(em.shape(k)) != 3:
        raise Unsupported(
            "packed QKV/KV or a BNSH key is not supported (3-D query, key and value only)"
        )
    if bias:
        d, dv = em.shape(q)[2], em.shape(v)[2]
        bounds = ((0, d), (d, 2 * d), (2 * d, 2 * d + dv))
        q, k, v = (
            em.binary("Add", f"{role}_bias", t, em.take(f"b{role}", bias, *bound))
            for role, t, bound in zip("qkv", (q, k, v), bounds, strict=True)
        )
    _ms_core(em, data, q, k, v, mask, attention_bias)


def _ms_core(
    em: Emitter, data: dict, q: str, k: str, v: str, mask: str, attention_bias: str
) -> None:
    """ORT's CPU semantics: scale·QKᵀ + attention_bias + mask_filter_value where the padding
    mask is 0 or the key is in the future (unidirectional), set once, not summed."""
    attrs = data["attrs"]
    heads = attrs["num_heads"]
    (batch, seq_q, d), (_, seq_k, _), (_, _, dv) = em.shape(q), em.shape(k), em.shape(v)
    if d % heads or dv % heads:
        raise Unsupported(f"hidden sizes {d}, {dv} are not multiples of num_heads {heads}")
    h = Heads(batch, heads, heads, seq_q, seq_k, d // heads, dv // heads)
    dtype = em.info(q).dtype
    scale = attrs.get("scale", 0.0) or 1.0 / math.sqrt(h.head)
    steps: list[tuple] = [("scale", scale)]
    if attention_bias:
        steps.append(("add", attention_bias))
    bias = _ms_mask_bias(
        em,
        mask,
        bool(attrs.get("unidirectional", 0)) and seq_q > 1,
        attrs.get("mask_filter_value", DEFAULT_MASK_FILTER),
        h,
        dtype,
    )
    if bias:
        steps.append(("add", bias))
    qh = split_heads(em, q, "q", h, h.q_dims, seq_q, h.head)
    kt = split_heads(em, k, "k", h, h.kv_dims, seq_k, h.head)
    vh = split_heads(em, v, "v", h, h.kv_dims, seq_k, h.v_head)
    em.finish(merge_heads(em, emit_core(em, qh, kt, vh, steps), h, 3), data["outputs"][0])


def _ms_mask_bias(
    em: Emitter, mask: str, causal: bool, fill: float, h: Heads, dtype: Dtype
) -> str | None:
    """The additive [B, 1, Sq|1, T] bias: `fill` where masked (padding or future), else 0."""
    allowed_causal = causal_bias(h.seq_q, h.seq_k, 0, dtype, 1.0) == 0 if causal else None
    if not mask:
        if allowed_causal is None:
            return None
        return em.const("mask_bias", np.where(allowed_causal, 0.0, fill).astype(dtype.numpy))
    shape = em.shape(mask)
    if shape == (h.batch, h.seq_k):
        shape4 = (h.batch, 1, 1, h.seq_k)
    elif shape == (h.batch, h.seq_q, h.seq_k):
        shape4 = (h.batch, 1, h.seq_q, h.seq_k)
    else:
        raise Unsupported(
            f"mask of shape {shape}: only (batch, kv_sequence) and (batch, "
            "sequence, kv_sequence) 0/1 masks are supported"
        )
    value = em.const_value(mask)
    if value is not None:
        allowed = (value > 0).reshape(shape4)
        if allowed_causal is not None:
            allowed = allowed & allowed_causal
        return em.const("mask_bias", np.where(allowed, 0.0, fill).astype(dtype.numpy))
    em.require("Cast", "a runtime integer mask")
    as_float = em.node(
        "Cast",
        "mask_cast",
        [mask],
        shape,
        dtype,
        to=onnx.helper.np_dtype_to_tensor_dtype(dtype.numpy),
    )
    # (mask > 0) for integers, with arithmetic only: clamp to [0, 1].
    allowed = em.binary(
        "Min",
        "mask_allowed",
        em.binary("Max", "mask_floor", as_float, em.scalar("zero", 0.0, dtype)),
        em.scalar("one", 1.0, dtype),
    )
    allowed = em.reshape("mask_4d", allowed, shape4)
    if allowed_causal is not None:
        allowed = em.binary(
            "Mul",
            "mask_causal",
            allowed,
            em.const("causal_allowed", allowed_causal.astype(dtype.numpy)),
        )
    masked = em.binary("Sub", "mask_masked", em.scalar("one", 1.0, dtype), allowed)
    return em.binary("Mul", "mask_bias", masked, em.scalar("mask_filter", fill, dtype))


# --- the read-back ---------------------------------------------------------------------------
def read_back(em: Emitter) -> dict:
    """Explore the staged expansion from its second dot, as the reference pass's matcher does;
    a diagnostic (the expansion is not the block it replaces) refuses the rewrite."""
    staged = {out: (name, op, ins) for name, op, ins, outs, _ in em.nodes for out in outs}

    def producer(tensor: str):
        if tensor in staged:
            return staged[tensor]
        node = em.graph.producer(tensor)
        if node is None or node in em.remove:
            return None
        data = em.graph.node(node)
        return node, data["op_type"], list(data["inputs"])

    def scalar(tensor: str) -> bool:
        value = em.const_value(tensor) if tensor else None
        return value is not None and value.size == 1

    dot2 = next((n for n in em.nodes if n[0].endswith("/pv") and n[1] == "MatMul"), None)
    if dot2 is None:
        raise Unsupported(NO_SOFTMAX)
    masked, scaled = em.expect
    found = explore(producer, scalar, (dot2[0], dot2[1], dot2[2]), masked, scaled)
    if isinstance(found, str):
        raise Unsupported(f"internal: the expansion does not read back: {found}")
    return {
        "dot1": found.dot1,
        "softmax": found.softmax,
        "select": found.select,
        "scale": found.scale,
        "guard": found.guard,
    }


# --- the pass --------------------------------------------------------------------------------
def classify(data: dict, kernels) -> tuple[str | None, str | None]:
    """(planner key, None) for a root to expand, (None, reason) for one to leave, (None, None)
    for any other node."""
    op, domain = data["op_type"], data["domain"]
    if op == "CustomCall" and data["attrs"].get("custom_call_target") in TARGETS:
        target = data["attrs"]["custom_call_target"]
        if target in kernels:
            return None, f"kernel {target} is registered; the native attention stays"
        return "custom_call", None
    if op == "Attention" and domain in ("", "ai.onnx"):
        return "onnx", None
    if domain == MS_DOMAIN and op == "MultiHeadAttention":
        return "ms_mha", None
    if domain == MS_DOMAIN and op == "Attention":
        return "ms_attention", None
    return None, None


PLANNERS = {
    "custom_call": plan_custom_call,
    "onnx": plan_onnx_attention,
    "ms_mha": plan_ms_mha,
    "ms_attention": plan_ms_attention,
}


@dataclass(frozen=True)
class DecomposeAttention:
    """Expand fused/native attention into matmul → stable softmax → matmul
    (docs/attention.md#decompose)."""

    name: str = "DecomposeAttention"
    lowerings: frozenset[str] | None = None  # None: the generic lowering table at run time

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        available = frozenset(GENERIC_LOWERINGS if self.lowerings is None else self.lowerings)
        kernels = KERNELS
        findings, decomposed, expanded = [], 0, 0
        for root in graph.topological_order():
            if root not in graph.nx:  # a Cast removed with the CustomCall it served
                continue
            data = graph.node(root)
            key, reason = classify(data, kernels)
            if key is None and reason is None:
                continue
            finding = {
                "nodes": [root],
                "source": data["op_type"],
                "domain": data["domain"],
                "reason": reason,
                "decomposed": False,
            }
            if data["op_type"] == "CustomCall":
                finding["target"] = data["attrs"]["custom_call_target"]
            if key is not None:
                em = Emitter(graph, root, available, remove=[root])
                try:
                    PLANNERS[key](em, data)
                    missing = em.missing_ops()
                    if missing:
                        raise Unsupported(f"no generic lowering for {', '.join(missing)}")
                    finding["explored"] = read_back(em)
                except Unsupported as exc:
                    finding["reason"] = str(exc)
                    if is_onnx_attention(data):
                        expanded += self._expand(graph, root, finding, options, available)
                else:
                    em.commit()
                    decomposed += 1
                    finding.update(
                        nodes=em.remove, decomposed=True, notes=em.notes, new_nodes=len(em.nodes)
                    )
            if finding["reason"]:
                log.info("%s %r not decomposed: %s", data["op_type"], root, finding["reason"])
            findings.append(finding)
        stats = [
            Statistic(
                self.name,
                "attention_roots_found",
                "Number of fused attention roots found",
                len(findings),
            ),
            Statistic(
                self.name,
                "attention_roots_decomposed",
                "Number of fused attention roots decomposed into matmul-softmax-matmul",
                decomposed,
            ),
            Statistic(
                self.name,
                "attention_roots_expanded",
                "Number of onnx.Attention roots replaced by their ONNX function body",
                expanded,
            ),
        ]
        return PassResult(decomposed + expanded > 0, stats, findings)

    @staticmethod
    def _expand(
        graph: Graph, root: str, finding: dict, options: CompileOptions, available: frozenset
    ) -> int:
        """The generic path of an onnx.Attention the decomposition gave up on: its ONNX
        function body (patterns/attention/function_body.py). Records in the finding whether
        the body replaced the node, why the raise and the decomposition did not take it, and
        the note the user sees; returns 1 when the body replaced it."""
        block = read_fused(graph, root)
        not_raised = block.problem or (gate(block, options)[1] if block.heads else None)
        not_raised = not_raised or "the kernel does not take it"
        body, why = function_body.check(graph, root, available)
        finding.update(
            raise_reason=not_raised,
            expanded=body is not None,
            note=function_body.note(root, not_raised, finding["reason"], body, why),
        )
        if body is None:
            finding["expansion_reason"] = why
            log.info("Attention %r keeps no function body: %s", root, why)
            return 0
        function_body.splice_body(graph, body)
        finding.update(new_nodes=len(body.nodes), body_ops=body.op_counts())
        log.info(
            "Attention %r replaced by its ONNX function body (%d nodes)", root, len(body.nodes)
        )
        return 1
