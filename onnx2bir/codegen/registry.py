"""How the code generator names an op in its tables: `lowering_key`.

The generic lowering table itself is `onnx2bir.codegen.lower.GENERIC_LOWERINGS`; the kernel
table, for the NativeKernel and CustomCall nodes the passes make, is `onnx2bir.kernels`. An op
of a vendor domain is a different op from the standard one of the same name: it is registered
and looked up as "domain.OpType" (`lowering_key`), e.g. "com.microsoft.RotaryEmbedding".
"""

from __future__ import annotations

STANDARD_DOMAINS = ("", "ai.onnx")


def lowering_key(op_type: str, domain: str = "") -> str:
    """The table key of an op: its type for the standard domain, "domain.OpType" otherwise."""
    return op_type if domain in STANDARD_DOMAINS else f"{domain}.{op_type}"
