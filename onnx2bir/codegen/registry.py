"""The generic lowering table: ONNX op type → function that emits its BIR instructions.

Each lowering module registers its functions with `@lowering("OpType", ...)`; the code
generator looks an op up here unless a pass turned it into a NativeKernel, whose `func_name`
goes to the kernel registry (`onnx2bir.kernels`) instead.
"""

from __future__ import annotations

from collections.abc import Callable

GENERIC_LOWERINGS: dict[str, Callable] = {}


def lowering(*op_types: str) -> Callable[[Callable], Callable]:
    def register(function: Callable) -> Callable:
        for op_type in op_types:
            if op_type in GENERIC_LOWERINGS:
                raise ValueError(f"two lowerings for {op_type}")
            GENERIC_LOWERINGS[op_type] = function
        return function

    return register
