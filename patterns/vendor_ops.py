"""Ops of vendor domains that nothing in onnx2bir handles, found before the passes run.

The passes match standard ONNX ops; a `com.microsoft` Add or MatMul is a different op that
happens to share a name. Such a node is refused as unsupported before any pass could absorb
it into a kernel (`docs/input_contracts.md#model`). The vendor ops onnx2bir does handle are
kernel calls (NativeKernel, CustomCall), the attention ops the decomposition expands, the
quantized ops the quant passes expand (`patterns/quant`), and the ops with a lowering registered
under "domain.OpType" (`codegen.registry.lowering_key`).
"""

from __future__ import annotations

from collections import Counter

import onnx

from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.codegen.driver import kernel_name_of
from onnx2bir.errors import CompileError, UserError
from onnx2bir.graph import Graph
from onnx2bir.op_traits import STANDARD_DOMAINS, op_key
from onnx2bir.patterns.quant import EXPANDED_VENDOR_OPS


def unhandled_vendor_ops(graph: Graph, kernels) -> Counter:
    from onnx2bir.patterns.attention.decompose import classify

    missing: Counter = Counter()
    for _, data in graph.nodes():
        if data["domain"] in STANDARD_DOMAINS or kernel_name_of(data) is not None:
            continue
        if op_key(data["op_type"], data["domain"]) in GENERIC_LOWERINGS:
            continue  # a vendor op with a lowering of its own (com.microsoft RotaryEmbedding)
        if op_key(data["op_type"], data["domain"]) in EXPANDED_VENDOR_OPS:
            continue  # a quantized op the quant passes expand (patterns/quant)
        if classify(data, kernels)[0] is not None:
            continue
        missing[f"{data['domain']}.{data['op_type']}"] += 1
    return missing


def check_vendor_ops(graph: Graph, kernels) -> None:
    missing = unhandled_vendor_ops(graph, kernels)
    if missing:
        listing = ", ".join(f"{op} x{count}" for op, count in sorted(missing.items()))
        # An op onnx itself defines (ai.onnx.ml, ai.onnx.preview.training): a valid model
        # onnx2bir cannot compile (exit 1). Any other: an op of no known operator set.
        defined = all(onnx.defs.has(op.rsplit(".", 1)[1], op.rsplit(".", 1)[0]) for op in missing)
        error = CompileError if defined else UserError
        raise error(f"unsupported ops in {graph.name}: {listing}")
