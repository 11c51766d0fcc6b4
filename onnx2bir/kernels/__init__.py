"""The internal kernel registry: kernel name → tracer that emits the kernel's BIR.

A pass selects a kernel by writing its name into a NativeKernel node's `func_name`; the code
generator looks the name up here (docs/conv_selection.md#attributes: the kernel is selected by a
string). A tracer has the signature of a generic lowering, `(BirCodeGen, node) -> None`.
"""

from __future__ import annotations

from collections.abc import Callable

KERNEL_REGISTRY: dict[str, Callable] = {}


def kernel(name: str) -> Callable[[Callable], Callable]:
    def register(function: Callable) -> Callable:
        if name in KERNEL_REGISTRY:
            raise ValueError(f"two kernels named {name}")
        KERNEL_REGISTRY[name] = function
        return function

    return register


def load_kernels() -> dict[str, Callable]:
    """Import every kernel module (each registers its tracers) and return the registry."""
    from onnx2bir.kernels.attention import kernel as attention  # noqa: F401
    from onnx2bir.kernels.conv import column_packing, depthwise, rep_nhwc  # noqa: F401
    from onnx2bir.kernels.mlp import kernel as mlp  # noqa: F401

    return KERNEL_REGISTRY
