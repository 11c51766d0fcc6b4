"""Nodes the code generator drops before it lowers anything: the Reshapes and Transposes a
pass built that leave their input as it is (docs/attention_kernel.md#packaging).

In: the graph after the passes. Out: the same graph without them; what each identity read is
read by its readers instead. The attention raise emits its packaging whole — a Reshape and a
Transpose for each operand whether or not the operand needs one — and relies on this to make
the identities free. The model's own identity Reshapes stay: their outputs are tensors of the
model, which the verdict reads as probes (docs/validation.md).
"""

from __future__ import annotations

from onnx2bir.graph import Graph


def is_identity_view(graph: Graph, node: str) -> bool:
    data = graph.node(node)
    op, inputs, outputs = data["op_type"], data["inputs"], data["outputs"]
    if op not in ("Reshape", "Transpose") or not inputs or not outputs:
        return False
    source, out = graph.tensors[inputs[0]], graph.tensors[outputs[0]]
    if source.shape != out.shape or source.dtype is not out.dtype:
        return False
    if op == "Transpose":
        perm = data["attrs"].get("perm")
        return perm is not None and list(perm) == list(range(len(out.shape)))
    return True


def drop_identity_views(graph: Graph) -> int:
    """Remove every identity Reshape/Transpose a pass built. Its readers read its input
    instead; when its output is the model's tensor (a raised kernel's result viewed back into
    the block's output) and its input only a pass's, the input's writer writes the model's
    tensor directly, so the tensor keeps its name (a probe of the verdict, a graph output)."""
    dropped = 0
    for node in graph.topological_order():
        if not is_identity_view(graph, node):
            continue
        source, out = graph.node(node)["inputs"][0], graph.node(node)["outputs"][0]
        renames = (
            graph.producer(source) is not None
            and len(graph.consumers(source)) == 1
            and source not in graph.outputs
            and (graph.is_model_tensor(out) or out in graph.outputs)
            and not graph.is_model_tensor(source)
        )
        if not renames and (out in graph.outputs or graph.is_model_tensor(out)):
            continue
        graph.remove_node(node)
        if renames:
            graph.rename_output(source, out)
        else:
            graph.redirect_uses(out, source)
        dropped += 1
    return dropped
