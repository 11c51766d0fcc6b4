"""One builder per opcode: the typed way lowerings and kernels emit BIR instructions.

`BirCodeGen` and the `Emitter` inherit these; each builds the operands and attributes of one
opcode (the table in `onnx2bir.bir.opcodes`) and hands the instruction to `emit`. DMA
instructions take the DMA queues in turn (`next_dma_queue`).
"""

from __future__ import annotations

import numpy as np

from onnx2bir.bir.enums import Engine, Opcode
from onnx2bir.bir.ir import AccessPattern, Instruction

NUM_DMA_QUEUES = 16


def _immediate(value) -> int | float:
    """An instruction immediate: integers stay integers. A TensorScalar's scalars are fp32 on
    the device; the driver rewrites those fp32 cannot hold (docs/neuroncore.md#integers)."""
    if isinstance(value, bool | int | np.integer):
        return int(value)
    return float(value)


class InstructionBuilders:
    """Mixin: needs `emit(opcode, engine, dst, srcs, **attrs)` and `next_dma_queue()`."""

    def dma(self, dst: AccessPattern, src: AccessPattern) -> Instruction:
        queue = self.next_dma_queue()
        return self.emit(Opcode.DMA_COPY, Engine.DMA, dst, {"in": src}, queue=queue)

    def dma_gather(
        self, dst: AccessPattern, table: AccessPattern, indices: AccessPattern
    ) -> Instruction:
        """dst[p, :] = table[indices[p], :]: an indirect DMA (one descriptor per row)."""
        queue = self.next_dma_queue()
        return self.emit(
            Opcode.DMA_GATHER, Engine.DMA, dst, {"in": table, "indices": indices}, queue=queue
        )

    def matmul(
        self, dst: AccessPattern, stationary: AccessPattern, moving: AccessPattern, accumulate: bool
    ) -> Instruction:
        return self.emit(
            Opcode.MATMULT,
            Engine.PE,
            dst,
            {"stationary": stationary, "moving": moving},
            accumulate=accumulate,
        )

    def activation(
        self,
        dst: AccessPattern,
        src: AccessPattern,
        func: str,
        scale: float = 1.0,
        bias: AccessPattern | None = None,
        bias_value: float = 0.0,
    ) -> Instruction:
        srcs = {"in": src}
        if bias is not None:
            srcs["bias"] = bias
        return self.emit(
            Opcode.ACTIVATION,
            Engine.ACT,
            dst,
            srcs,
            func=str(func),
            scale=float(scale),
            bias_value=float(bias_value),
        )

    def tensor_tensor(
        self,
        dst: AccessPattern,
        in0: AccessPattern,
        in1: AccessPattern,
        op: str,
        engine: Engine = Engine.DVE,
    ) -> Instruction:
        return self.emit(Opcode.TENSOR_TENSOR, engine, dst, {"in0": in0, "in1": in1}, op=str(op))

    def tensor_scalar(
        self,
        dst: AccessPattern,
        src: AccessPattern,
        op0: str,
        operand0: AccessPattern | float,
        op1: str | None = None,
        operand1: AccessPattern | float | None = None,
        reverse0: bool = False,
        reverse1: bool = False,
        engine: Engine = Engine.DVE,
    ) -> Instruction:
        srcs = {"in": src}
        attrs: dict[str, object] = {"op0": str(op0), "reverse0": reverse0}
        for index, operand in ((0, operand0), (1, operand1)):
            if isinstance(operand, AccessPattern):
                srcs[f"scalar{index}"] = operand
            elif operand is not None:
                attrs[f"imm{index}"] = _immediate(operand)
        if op1 is not None:
            attrs.update(op1=str(op1), reverse1=reverse1)
        return self.emit(Opcode.TENSOR_SCALAR, engine, dst, srcs, **attrs)

    def tensor_reduce(
        self,
        dst: AccessPattern,
        src: AccessPattern,
        op: str,
        axes: int,
        negate: bool = False,
        engine: Engine = Engine.DVE,
    ) -> Instruction:
        return self.emit(
            Opcode.TENSOR_REDUCE, engine, dst, {"in": src}, op=str(op), axes=axes, negate=negate
        )

    def tensor_copy(
        self, dst: AccessPattern, src: AccessPattern, engine: Engine = Engine.DVE
    ) -> Instruction:
        return self.emit(Opcode.TENSOR_COPY, engine, dst, {"in": src})

    def copy_predicated(
        self,
        dst: AccessPattern,
        predicate: AccessPattern,
        src: AccessPattern | float,
        reverse: bool = False,
    ) -> Instruction:
        """dst = src where predicate is nonzero (zero when `reverse`); elsewhere dst stays."""
        srcs = {"predicate": predicate}
        attrs: dict[str, object] = {"reverse_pred": reverse}
        if isinstance(src, AccessPattern):
            srcs["in"] = src
        else:
            attrs["imm"] = _immediate(src)
        return self.emit(Opcode.COPY_PREDICATED, Engine.DVE, dst, srcs, **attrs)

    def memset(self, dst: AccessPattern, value: float, engine: Engine = Engine.POOL) -> Instruction:
        return self.emit(Opcode.MEMSET, engine, dst, {}, value=_immediate(value))
