"""TensorScalar immediates that fp32 cannot hold (docs/neuroncore.md#integers).

A TensorScalar's scalars are fp32 on the device, so an integer immediate past 2^24 would round.
The code generator emits such an instruction as exact steps instead: each step's scalar set
into an int32 column by a Memset, then a TensorTensor against the column broadcast along the
free dims (on GpSimd's integer lanes, `emitter.integer_lanes`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from onnx2bir.bir.enums import Dtype, Engine, Opcode
from onnx2bir.bir.ir import AccessPattern, Instruction
from onnx2bir.bir.opcodes import NUM_PARTITIONS

if TYPE_CHECKING:
    from onnx2bir.codegen.driver import BirCodeGen


def inexact_immediates(attrs: dict[str, object]) -> bool:
    """Whether a TensorScalar has an integer immediate that rounds on its way to fp32."""
    values = (attrs.get("imm0"), attrs.get("imm1"))
    return any(
        isinstance(v, int) and not isinstance(v, bool) and int(np.float32(v)) != v for v in values
    )


def exact_scalar_steps(
    cg: BirCodeGen, dst: AccessPattern, src: AccessPattern, attrs: dict[str, object]
) -> Instruction:
    """The TensorScalar `dst = src op0 imm0 [op1 imm1]` as exact steps (module docstring)."""
    column = cg.sb_tile("scalar", NUM_PARTITIONS, 1, Dtype.INT32)
    source, last = src, None
    for step in (0, 1):
        op = attrs.get(f"op{step}")
        if op is None:
            break
        value = attrs.get(f"imm{step}")
        if value is None:
            raise cg.fail("an exact integer TensorScalar takes immediates only")
        held = AccessPattern(column.name, ((1, 1),), 0, (), dst.partition_start, dst.num_partitions)
        cg.emit(Opcode.MEMSET, Engine.POOL, held, {}, value=value)
        spread = replace(held, pattern=tuple((0, count) for _, count in dst.pattern))
        operands = (spread, source) if attrs.get(f"reverse{step}") else (source, spread)
        last = cg.tensor_tensor(dst, *operands, op)
        source = dst
    return last
