"""The generic lowering table: ONNX op type → function that emits its BIR instructions.

Each lowering module registers its functions with `@lowering("OpType", ...)`; the code
generator looks an op up here unless a pass turned it into a NativeKernel, whose `func_name`
goes to the kernel registry (`onnx2bir.kernels`) instead. An op of a vendor domain is a
different op from the standard one of the same name: it is registered and looked up as
"domain.OpType" (`lowering_key`), e.g. "com.microsoft.RotaryEmbedding".
"""

from __future__ import annotations

from collections.abc import Callable

GENERIC_LOWERINGS: dict[str, Callable] = {}
STANDARD_DOMAINS = ("", "ai.onnx")


def lowering_key(op_type: str, domain: str = "") -> str:
    """The table key of an op: its type for the standard domain, "domain.OpType" otherwise."""
    return op_type if domain in STANDARD_DOMAINS else f"{domain}.{op_type}"


def lowering(*op_types: str) -> Callable[[Callable], Callable]:
    def register(function: Callable) -> Callable:
        for op_type in op_types:
            if op_type in GENERIC_LOWERINGS:
                raise ValueError(f"two lowerings for {op_type}")
            GENERIC_LOWERINGS[op_type] = function
        return function

    return register
