"""Operands of the instruction-semantics table: their one-time checks and the store into them.

In: an Instruction and its operands bound to machine memory (`Machine.operands`). Out:
`prepare` binds and checks an instruction the first time it runs and caches what its semantics
function precomputed; `check_common` enforces the opcode table's engines, roles, attributes and
memories, the partition rules and the free dims' limits (docs/neuroncore.md#partitions);
`check_same_tile` and `check_column` the shapes elementwise operands must agree on; `enum_attr`
and `number_attr` read attributes or name the bad one; `store` writes a result into an operand's
view with the destination dtype's rounding. The semantics functions themselves are in
`runtime/machine/semantics.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnx2bir.bir.dtypes import F32, SATURATING, int_like, store_as
from onnx2bir.bir.enums import Dtype, Engine, MemoryType, Opcode
from onnx2bir.bir.ir import Instruction
from onnx2bir.bir.opcodes import (
    MAX_FREE_DIMS,
    OPCODES,
    ap_field_overflow,
    engine_rule,
    free_size_limit,
    partition_start_allowed,
)
from onnx2bir.runtime.machine.machine import Machine, Operand, instruction_error

# store_as does more than a numpy cast for these
_ROUNDED_APART = frozenset({Dtype.TF32, *SATURATING})


def store(dst: Operand, loop_values: dict[str, int], values: np.ndarray) -> None:
    """Write values into dst's view in row-major element order, rounding to dst's dtype
    (TF32 to 10 mantissa bits, FP8 e4m3 saturating at ±448: `alu.store_as`). PSUM bytes
    written here no longer hold a matmul's partial sum (rule PSUM-ACCUMULATE)."""
    view = dst.view(loop_values)
    if dst.marks is not None:
        dst.matmul_marks(loop_values)[...] = False
    target, source = view.dtype, values.dtype
    # One cast straight into the view where it is the cast `store_as` makes: from the dtype
    # itself, from fp32 (every store rounds from fp32), and any float widened to fp32 (exact).
    if dst.loc.dtype not in _ROUNDED_APART and (
        source == target
        or (source == F32 and not int_like(target))
        or (target == F32 and not int_like(source))
    ):
        if source != target:
            # Convert in the source's memory order, then copy: a cast fused with a transposing
            # copy walks one side against its strides and runs about 3x slower.
            values = values.astype(target, order="K")
        np.copyto(view, values.reshape(view.shape))
        return
    view[...] = store_as(values, dst.loc.dtype).reshape(view.shape)


# ---- static checks ----------------------------------------------------------------------------


def check_common(ins: Instruction, ops: dict[str, Operand]) -> None:
    """The opcode table's engines, roles, attributes and memories; PSUM and partition rules."""
    spec = OPCODES[ins.opcode]
    if ins.engine not in spec.engines:
        allowed = ", ".join(sorted(spec.engines))
        raise instruction_error(
            ins,
            f"engine {ins.engine} cannot run it (allowed: {allowed})",
            engine_rule(ins.opcode, ins.engine),
        )
    roles = set(ins.srcs)
    missing = set(spec.required_srcs) - roles
    unknown = roles - set(spec.required_srcs) - set(spec.optional_srcs)
    if missing or unknown:
        raise instruction_error(
            ins, f"operands missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    missing_attrs = [name for name in spec.required_attrs if name not in ins.attrs]
    if missing_attrs:
        raise instruction_error(ins, f"attributes missing: {missing_attrs}")
    if "dst" not in ops:
        raise instruction_error(ins, "has no dst")
    for role, op in ops.items():
        allowed = spec.dst_memory if role == "dst" else spec.src_memory
        if op.memory not in allowed:
            raise instruction_error(
                ins, f"operand {role!r} may not be in {op.memory}", "OPERAND-MEMORY"
            )
        if ins.engine is Engine.POOL and op.memory is MemoryType.PSUM:
            raise instruction_error(ins, f"operand {role!r} is in PSUM", "POOL-PSUM")
        if op.memory is not MemoryType.DRAM and op.loc.dtype is Dtype.INT64:
            raise instruction_error(
                ins, f"operand {role!r} is int64 in {op.memory}", "INT64-DATAPATH"
            )
        if ins.opcode in (Opcode.DMA_COPY, Opcode.DMA_GATHER):
            continue
        if not partition_start_allowed(op.ap.partition_start, op.partitions):
            raise instruction_error(
                ins,
                f"operand {role!r}: a {op.partitions}-partition tile cannot start at partition "
                f"{op.ap.partition_start}",
                "PARTITION-START",
            )
        if len(op.ap.pattern) > MAX_FREE_DIMS:
            raise instruction_error(
                ins,
                f"operand {role!r} has {len(op.ap.pattern)} free dims, max {MAX_FREE_DIMS}",
                "FREE-DIMS",
            )
        overflow = ap_field_overflow(op.ap.pattern)
        if overflow is not None:
            raise instruction_error(ins, f"operand {role!r}: {overflow}", "AP-FIELD-BITS")
        limit = free_size_limit(ins.engine, op.memory)
        if limit is not None and op.free_size > limit:
            raise instruction_error(
                ins,
                f"operand {role!r} holds {op.free_size} elements per partition in {op.memory} "
                f"(max {limit} on {ins.engine})",
                "FREE-SIZE",
            )


def check_same_tile(ins: Instruction, dst: Operand, *srcs: Operand) -> None:
    for src in srcs:
        if (src.partitions, src.free_size) != (dst.partitions, dst.free_size):
            raise instruction_error(
                ins,
                f"operand {src.role!r} is {src.partitions} partitions x {src.free_size} elements,"
                f" dst {dst.partitions} x {dst.free_size}; elementwise operands must match",
            )


def check_column(ins: Instruction, dst: Operand, col: Operand) -> None:
    if col.partitions != dst.partitions or col.free_size != 1:
        raise instruction_error(
            ins,
            f"operand {col.role!r} must be [{dst.partitions}, 1], is "
            f"[{col.partitions}, {col.free_size}]",
        )


def enum_attr(ins: Instruction, kind: type, name: str):
    try:
        return kind(ins.attrs[name])
    except (ValueError, KeyError):
        raise instruction_error(ins, f"bad {name} {ins.attrs.get(name)!r}") from None


def number_attr(ins: Instruction, name: str, default=None) -> float | int:
    value = ins.attrs.get(name, default)
    if isinstance(value, bool | int | float | np.number):
        return value
    raise instruction_error(ins, f"attribute {name} must be a number, is {value!r}")


def prepare(m: Machine, ins: Instruction, prepare: Callable) -> tuple:
    """Bind and check an instruction once; cache what its semantics function needs."""
    ops = m.operands(ins)
    check_common(ins, ops)
    result = m.prepared[ins] = prepare(ins, ops)
    return result
