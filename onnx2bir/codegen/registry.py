"""How the code generator names an op in its tables: `lowering_key` (`op_traits.op_key`).

The generic lowering table itself is `onnx2bir.codegen.lower.GENERIC_LOWERINGS`; the kernel
table, for the NativeKernel and CustomCall nodes the passes make, is `onnx2bir.kernels`.
"""

from __future__ import annotations

from onnx2bir.op_traits import STANDARD_DOMAINS
from onnx2bir.op_traits import op_key as lowering_key

__all__ = ["STANDARD_DOMAINS", "lowering_key"]
