"""The generic path of `onnx.Attention`: the function body the ONNX standard defines
(docs/attention_kernel.md#blocks-that-are-not-raised).

In: a Graph and an `onnx.Attention` node (opset 23/24) that DecomposeAttention gave up on —
a KV cache (past_key/past_value in, present_key/present_value out), `nonpad_kv_seqlen`, a
sliding window, a `qk_matmul_output` that is read, a `softmax_precision` other than the
input's dtype — with the reasons the raise and the decomposition did not take it. Out: the
node replaced by its ONNX function body, built for its attributes and input types and folded
at the graph's shapes (`frontend.function_expansion.graph_node_body`), when every op of the
body has a generic lowering; and a finding that says so, with the note the user sees.

The rule, as every rule of the attention passes: a pattern (`is_onnx_attention`), a check that
returns the reason it does not apply (`check`), and the rewrite (`splice_body`). The node
keeps its name as the prefix of the body's nodes (`<node>/...`), so reports, the cast plan and
`--localize` still point at it. onnxruntime runs its own kernel for the op, so the validation
compares the body with that kernel like any lowering.
"""

from __future__ import annotations

from onnx2bir.frontend.function_expansion import NodeBody, graph_node_body, splice_body
from onnx2bir.graph import Graph

__all__ = ["check", "is_onnx_attention", "note", "splice_body"]


def is_onnx_attention(data) -> bool:
    return data["op_type"] == "Attention" and data["domain"] in ("", "ai.onnx")


def check(graph: Graph, node: str, available: frozenset[str]) -> tuple[NodeBody | None, str | None]:
    """(the body, None) when the node's function body can replace it, else (None, why not)."""
    body, reason = graph_node_body(graph, node)
    if body is None:
        return None, reason
    missing = sorted(set(body.op_counts()) - available)
    if missing:
        return None, f"its function body needs {', '.join(missing)}, which have no generic lowering"
    return body, None


def note(node: str, not_raised: str, not_decomposed: str, body: NodeBody | None, why: str | None):
    """The one line the user sees for the node: what it got and why it got it."""
    reasons = f"not raised: {not_raised}; not decomposed: {not_decomposed}"
    if body is None:
        return f"Attention node {node!r} stays ({reasons}; no function body replaces it: {why})"
    return (
        f"Attention node {node!r} replaced by the function body the ONNX standard defines "
        f"({len(body.nodes)} nodes; {reasons}); onnxruntime runs its own kernel, so the "
        "validation checks the body"
    )
