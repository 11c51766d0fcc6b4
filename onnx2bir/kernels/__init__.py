"""The kernels: name → tracer that emits the kernel's BIR (docs/conv_selection.md#attributes:
a kernel is selected by a string, as in the reference compiler).

A pass selects a kernel by writing its name into a node: a CustomCall's `custom_call_target`
(the attention and MLP raises) or a NativeKernel's `func_name` (the conv selection). A tracer
has the signature of a generic lowering, `(BirCodeGen, node) -> None`. `KERNELS` is the table of
the CustomCall targets; the conv kernels are named with their tracers by the rows of the conv
registry (`patterns/conv/selection.py`), and the compiler puts the two together
(`onnx2bir.compiler.kernel_table`).
"""

from __future__ import annotations

from collections.abc import Callable

from onnx2bir.kernels import attention, mlp
from onnx2bir.kernels.attention.kernel import trace_attention
from onnx2bir.kernels.mlp.kernel import trace_mlp

KERNELS: dict[str, Callable] = {
    attention.ATTENTION: trace_attention,
    attention.ATTENTION_WITHOUT_SWAP: trace_attention,
    attention.CAUSAL_ATTENTION_WITHOUT_SWAP: trace_attention,
    mlp.TARGET: trace_mlp,
}
