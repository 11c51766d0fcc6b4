"""The instruction-semantics table: one function per BIR opcode, run on a `Machine`.

In: a Machine, an Instruction and the current loop values ({axis: value}). Out: the instruction's
dst written into machine memory, with real dtype rounding (ml_dtypes bf16, numpy fp16, RNE).
`SEMANTICS` maps every Opcode to its function; the meaning of each is the docstring of
`onnx2bir.bir.opcodes`, which this module follows word for word.

Rules enforced, each raising MachineError (docs/neuroncore.md#partitions,
docs/neuroncore.md#pe-array): the engine, operand roles, attributes and memories of the opcode
table (TensorCopy not on ScalarE); POOL never touches PSUM; compute-engine tiles keep the
partition-start rule, at most 4 free dims whose sizes and strides fit 16-bit fields, and on
VectorE/ScalarE at most 64K elements per partition from SBUF, 4K from PSUM; elementwise operands
share partitions and elements per partition ([P, 1] for scalar and bias columns); Matmult K <= 128
on both inputs, M <= 128, N <= 512, dst fp32 in PSUM with M partitions and N elements inside one
2 KiB bank, operand dtypes from `PE_INPUT_DTYPES` paired as `pe_operands_pair` allows, and it
accumulates only onto bytes a Matmult wrote last; two TensorTensor inputs are never both in PSUM;
an Activation's argument lies in its function's valid input range. Static rules are checked the
first time an instruction runs (the rules every opcode shares, and the store of a result into its
dst, are in `runtime/machine/operands.py`); loop-dependent bounds, the Matmult bank, the PSUM
accumulation and the activation ranges on every run.

Math (docs/neuroncore.md#integers): ScalarE and VectorE compute in fp32 whatever the operand
dtypes, so an int32 beyond 2^24 rounds on the way in; GpSimd computes exactly in int32 when every
operand is an integer; no engine takes an int64 operand (INT64-DATAPATH). TensorScalar's scalars
are fp32 (an immediate or a column is rounded to fp32 first). A bitvec operator (bitwise,
shifts) computes on int32 bit patterns on VectorE and GpSimd, integer operands only (rule
ALU-BITVEC). Integer divide truncates toward
zero; fp32 to integer truncates and saturates. The ALU and activation functions, `cast` and the
windowed max/min fold of TensorReduce are in `runtime/machine/alu.py` (`erf` re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnx2bir.bir.dtypes import F32, int_like, store_as
from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, MemoryType, Opcode
from onnx2bir.bir.ir import Instruction
from onnx2bir.bir.opcodes import (
    ACT_INPUT_RANGES,
    ACT_RANGE_ON_MAGNITUDE,
    BITVEC_OPS,
    DMA_MAX_DIMS,
    MATMUL_MAX_MOVING_FREE,
    MATMUL_MAX_STATIONARY_FREE,
    NUM_PARTITIONS,
    PSUM_BANK_BYTES,
    bitvec_problem,
)
from onnx2bir.runtime.machine.alu import (
    ACTIVATIONS,
    FOLD_MAX_WINDOW,
    ORDER_FREE,
    REDUCTIONS,
    alu,
    fold_window,
    math_dtype,
    op_math_dtype,
)
from onnx2bir.runtime.machine.alu import erf as erf
from onnx2bir.runtime.machine.machine import Machine, Operand, instruction_error
from onnx2bir.runtime.machine.operands import (
    check_column,
    check_same_tile,
    enum_attr,
    number_attr,
    prepare,
    store,
)

F64 = np.dtype(np.float64)
Semantics = Callable[[Machine, Instruction, dict[str, int]], None]


# The PE array's operand dtypes (docs/autocast.md#the-pe-array): any two of these may meet in one
# Matmult, except that fp32 and tf32 (the 4-byte formats) pair only with each other.
PE_INPUT_DTYPES = frozenset(
    {Dtype.FP8_E4M3, Dtype.FP8_E5M2, Dtype.BF16, Dtype.FP16, Dtype.TF32, Dtype.FP32}
)
_PE_WIDE = frozenset({Dtype.FP32, Dtype.TF32})


def pe_operands_pair(stationary: Dtype, moving: Dtype) -> bool:
    """Whether the PE array takes a stationary and a moving operand of these dtypes."""
    if stationary not in PE_INPUT_DTYPES or moving not in PE_INPUT_DTYPES:
        return False
    return (stationary in _PE_WIDE) == (moving in _PE_WIDE)


def _check_bank(ins: Instruction, dst: Operand, offset: int) -> None:
    first = dst.loc.address + (offset + dst.low) * dst.itemsize
    last = dst.loc.address + (offset + dst.high + 1) * dst.itemsize - 1
    if first // PSUM_BANK_BYTES != last // PSUM_BANK_BYTES:
        raise instruction_error(
            ins,
            f"matmul output bytes [{first}, {last}] cross a {PSUM_BANK_BYTES}-byte PSUM bank",
            "PSUM-BANK",
        )


# ---- one function per opcode, each with its one-time preparation -------------------------------


def _prep_dma(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    src, dst = ops["in"], ops["dst"]
    for side in (src, dst):
        if len(side.ap.shape) > DMA_MAX_DIMS:
            raise instruction_error(
                ins,
                f"a DMA descriptor walks at most {DMA_MAX_DIMS} dims, "
                f"{side.loc.name!r} is accessed with {len(side.ap.shape)}",
            )
    if src.ap.num_elements != dst.ap.num_elements:
        raise instruction_error(
            ins, f"copies {src.ap.num_elements} elements into {dst.ap.num_elements}"
        )
    return src, dst


def dma_copy(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """DmaCopy: row-major element copy between DRAM/SB, through fp32 when dtypes differ. A
    float64 or uint64 value narrowed to its on-chip dtype must fit it (NARROWING-CHECKED)."""
    src, dst = m.prepared.get(ins) or prepare(m, ins, _prep_dma)
    values = src.view(loop_values)
    if src.loc.dtype in _CHECKED_NARROWING and dst.loc.memory is not MemoryType.DRAM:
        _check_narrowing(ins, src.loc.dtype, dst.loc.dtype, values)
    store(dst, loop_values, values)


_CHECKED_NARROWING = frozenset({Dtype.FP64, Dtype.UINT64})


def _check_narrowing(ins: Instruction, source: Dtype, target: Dtype, values: np.ndarray) -> None:
    """A load onto chip: the values must fit the on-chip dtype (a cast between DRAM tensors,
    ONNX's Cast, overflows to inf as the standard says and is not checked here)."""
    if target is Dtype.FP32:
        bad = np.isfinite(values) & (np.abs(values) > float(np.finfo(np.float32).max))
    elif target is Dtype.UINT32:
        bad = values > np.iinfo(np.uint32).max
    else:
        return
    if bad.any():
        first = values[bad].reshape(-1)[0]
        raise instruction_error(
            ins,
            f"{int(bad.sum())} {source} value(s) (first {first.item()!r}) do not fit {target}",
            "NARROWING-CHECKED",
        )


def _prep_dma_gather(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    table, index, dst = ops["in"], ops["indices"], ops["dst"]
    if table.memory is not MemoryType.DRAM:
        raise instruction_error(ins, "an indirect DMA gathers rows of a DRAM table")
    if index.memory is not MemoryType.SB or index.loc.dtype.is_float:
        raise instruction_error(
            ins, f"indices must be an integer SBUF tile, are {index.loc.dtype} in {index.memory}"
        )
    shape = table.ap.shape
    if len(shape) != 2:
        raise instruction_error(ins, f"the table view must be [rows, row], is {list(shape)}")
    rows, row = shape
    if (index.partitions, index.free_size) != (dst.partitions, 1):
        raise instruction_error(
            ins,
            f"indices are {index.partitions} x {index.free_size}; one row number per "
            f"partition of dst ({dst.partitions}) is needed",
        )
    if dst.free_size != row:
        raise instruction_error(ins, f"dst holds {dst.free_size} elements a row, the table {row}")
    integers = not dst.loc.dtype.is_float and not table.loc.dtype.is_float
    if dst.loc.dtype is not table.loc.dtype and not integers:
        raise instruction_error(
            ins,
            f"dst is {dst.loc.dtype}, the table {table.loc.dtype}: a gather copies bits (or "
            "narrows an integer table, as any DMA does)",
        )
    return table, index, dst, rows


def dma_gather(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """DmaGather: dst[p, :] = table[indices[p], :], refusing a row outside the table."""
    table, index, dst, rows = m.prepared.get(ins) or prepare(m, ins, _prep_dma_gather)
    picks = np.asarray(index.view(loop_values)).reshape(-1).astype(np.int64)
    outside = np.flatnonzero((picks < 0) | (picks >= rows))
    if outside.size:
        p = int(outside[0])
        raise instruction_error(
            ins,
            f"index {picks[p]} (partition {p}) is outside table {table.loc.name!r} of {rows} rows",
            "DMA-OOB",
        )
    store(dst, loop_values, table.view(loop_values)[picks])


def _prep_matmult(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    stat, mov, dst = ops["stationary"], ops["moving"], ops["dst"]
    k, m_size, n_size = stat.partitions, stat.free_size, mov.free_size
    if mov.partitions != k or k > NUM_PARTITIONS:
        raise instruction_error(
            ins, f"contraction K: stationary {k}, moving {mov.partitions}", "PE-SHAPE"
        )
    if m_size > MATMUL_MAX_STATIONARY_FREE or n_size > MATMUL_MAX_MOVING_FREE:
        raise instruction_error(
            ins, f"M = {m_size} (max 128) or N = {n_size} (max 512) too big", "PE-SHAPE"
        )
    if (dst.partitions, dst.free_size) != (m_size, n_size):
        raise instruction_error(
            ins,
            f"dst is {dst.partitions} x {dst.free_size}, result is {m_size} x {n_size}",
            "PE-SHAPE",
        )
    if dst.loc.dtype is not Dtype.FP32:
        raise instruction_error(ins, f"the PSUM dst is {dst.loc.dtype}", "PE-PSUM-FP32")
    if not pe_operands_pair(stat.loc.dtype, mov.loc.dtype):
        raise instruction_error(
            ins,
            f"input dtypes {stat.loc.dtype}, {mov.loc.dtype} cannot pair on the PE array "
            f"(inputs among {', '.join(sorted(PE_INPUT_DTYPES))}; fp32/tfloat32 pair only "
            "with fp32/tfloat32)",
            "PE-DTYPE",
        )
    accumulate = ins.attrs["accumulate"]
    if not isinstance(accumulate, bool | np.bool_):
        raise instruction_error(ins, f"accumulate must be True or False, is {accumulate!r}")
    if not dst.terms:
        _check_bank(ins, dst, dst.ap.offset)
    return stat, mov, dst, k, m_size, n_size, bool(accumulate)


def matmult(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """Matmult: dst[M, N] (+)= stationary[K, M]ᵀ · moving[K, N], fp32 accumulation.

    Every PE column computes its dot product the same way, so an output element depends on its
    operands alone, never on where it sits in the tile: the K products are summed in float64
    and rounded once to fp32. fp32 BLAS does not promise this:
    its kernels block columns unevenly, and equal columns can come out a few ULP apart, which
    a softmax over huge equal logits turns into wrong probabilities.
    """
    stat, mov, dst, k, m_size, n_size, accumulate = m.prepared.get(ins) or prepare(
        m, ins, _prep_matmult
    )
    if dst.terms:
        _check_bank(ins, dst, dst.element_offset(loop_values))
    # Scratch arrays per shape, reused run after run: a fresh 512 KiB array per Matmult costs
    # page faults that take longer than the arithmetic (docs/simulation_speed.md).
    key = (k, m_size, n_size)
    scratch = m.scratch.get(key)
    if scratch is None:
        scratch = m.scratch[key] = (
            np.empty((k, m_size), F64),
            np.empty((k, n_size), F64),
            np.empty((m_size, n_size), F64),
            np.empty((m_size, n_size), F32),
        )
    a, b, wide, result = scratch
    stat_view, mov_view = stat.view(loop_values), mov.view(loop_values)
    out = dst.view(loop_values)
    _check_accumulate(ins, dst, loop_values, accumulate)
    if not (k == n_size and _is_identity(mov_view, k) and _transposed(stat_view, a, result)):
        np.copyto(a.reshape(stat_view.shape), stat_view, casting="unsafe")  # exact: to float64
        np.copyto(b.reshape(mov_view.shape), mov_view, casting="unsafe")
        np.matmul(a.T, b, out=wide)
        if not accumulate:  # the one rounding, float64 to fp32, straight into PSUM
            np.copyto(out, wide.reshape(out.shape), casting="same_kind")
            return
        np.copyto(result, wide, casting="same_kind")
    if accumulate:
        np.add(result, out.reshape(m_size, n_size), out=result)
    np.copyto(out, result.reshape(out.shape))


def _check_accumulate(
    ins: Instruction, dst: Operand, loop_values: dict[str, int], accumulate: bool
) -> None:
    """A Matmult accumulates only onto bytes a Matmult wrote last; an overwriting one makes its
    bytes such (rule PSUM-ACCUMULATE). Before the write: a refused program leaves PSUM as it
    was."""
    marks = dst.matmul_marks(loop_values)
    if not accumulate:
        marks[...] = True
    elif not marks.all():
        elements = marks.reshape(-1, dst.itemsize).all(axis=1)
        raise instruction_error(
            ins,
            f"accumulates onto {elements.size - int(elements.sum())} of {elements.size} "
            f"elements of {dst.loc.name!r} that no Matmult wrote last (never written, or "
            "written since by another instruction)",
            "PSUM-ACCUMULATE",
        )


_IDENTITIES: dict[tuple[int, np.dtype], np.ndarray] = {}


def _is_identity(view: np.ndarray, k: int) -> bool:
    """Whether a [K, K] moving operand holds the identity (a PE transpose)."""
    eye = _IDENTITIES.get((k, view.dtype))
    if eye is None:
        eye = _IDENTITIES[(k, view.dtype)] = np.eye(k, dtype=view.dtype)
    return bool(np.array_equal(view.reshape(k, k), eye))


def _transposed(stat_view: np.ndarray, rows: np.ndarray, result: np.ndarray) -> bool:
    """A Matmult against the identity, without the arithmetic: result = stationaryᵀ.

    Each output element's float64 sum is one product x·1 = x and K - 1 products ±0, started
    from +0: exactly x, except that a -0 comes out +0 (adding 0.0 in fp32 does the same) and a
    non-finite x turns the zeros of its row into NaN. So when every value is finite the
    transpose has the bits of the product (tests/runtime/test_fast_paths.py); otherwise it
    returns False and the product runs. Every PE input dtype widens to fp32 exactly; the rows
    are copied out of SBUF first (`rows`, a scratch array) so the transposing copy stays in
    the cache."""
    np.copyto(rows.reshape(stat_view.shape), stat_view, casting="unsafe")
    np.copyto(result, rows.T, casting="same_kind")
    if not np.isfinite(result).all():
        return False
    result += np.float32(0.0)
    return True


def _prep_activation(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    src, dst, bias = ops["in"], ops["dst"], ops.get("bias")
    check_same_tile(ins, dst, src)
    bias_value = number_attr(ins, "bias_value", 0.0)
    if bias is not None:
        check_column(ins, dst, bias)
        if bias_value:
            raise instruction_error(ins, "has both a bias operand and a nonzero bias_value")
    name = enum_attr(ins, ActFunc, "func")
    scale = np.float32(number_attr(ins, "scale"))
    return src, dst, bias, name, ACTIVATIONS[name], scale, np.float32(bias_value)


def activation(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """Activation: dst = func(in · scale + bias) in fp32, the argument inside the function's
    valid input range (rule ACT-RANGE)."""
    src, dst, bias, name, func, scale, bias_value = m.prepared.get(ins) or prepare(
        m, ins, _prep_activation
    )
    x = src.view(loop_values).reshape(src.partitions, -1).astype(F32, copy=False)
    if bias is not None:
        bias_value = bias.view(loop_values).reshape(-1, 1).astype(F32)
    argument = x * scale + bias_value
    valid = ACT_INPUT_RANGES.get(name)
    if valid is not None:
        _check_act_range(ins, name, argument, valid)
    store(dst, loop_values, func(argument))


def _check_act_range(
    ins: Instruction, name: ActFunc, argument: np.ndarray, valid: tuple[float, float]
) -> None:
    """Refuse an argument outside the function's valid input range; NaN passes (it compares
    false both ways) and comes out NaN."""
    low, high = valid
    checked = np.abs(argument) if name in ACT_RANGE_ON_MAGNITUDE else argument
    outside = (checked < low) | (checked > high)
    if not outside.any():
        return
    numbers = argument[~np.isnan(argument)]
    what = "|in · scale + bias|" if name in ACT_RANGE_ON_MAGNITUDE else "in · scale + bias"
    raise instruction_error(
        ins,
        f"{name}: {what} leaves [{low:.9g}, {high:.9g}] at {int(outside.sum())} of "
        f"{argument.size} elements (inputs from {numbers.min():.9g} to "
        f"{numbers.max():.9g}; largest |input| {np.abs(numbers).max():.9g})",
        "ACT-RANGE",
    )


def check_bitvec(ins: Instruction, ops: dict[str, Operand]) -> bool:
    """Refuse a bitvec operator off integer bit patterns (rule ALU-BITVEC,
    `opcodes.bitvec_problem`); True when the instruction has one."""
    dtypes = {role: operand.loc.dtype for role, operand in ops.items()}
    problem = bitvec_problem(ins.opcode, ins.engine, ins.attrs, dtypes)
    if problem is not None:
        raise instruction_error(ins, problem, "ALU-BITVEC")
    keys = ("op", "op0", "op1")
    return any(ins.attrs.get(key) in BITVEC_OPS for key in keys)


def _prep_tensor_tensor(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    a, b, dst = ops["in0"], ops["in1"], ops["dst"]
    check_same_tile(ins, dst, a, b)
    if a.memory is MemoryType.PSUM and b.memory is MemoryType.PSUM:
        raise instruction_error(ins, "both inputs are in PSUM", "TT-PSUM-INPUTS")
    check_bitvec(ins, ops)
    op = enum_attr(ins, AluOp, "op")
    return a, b, dst, op, op_math_dtype(ins.engine, (op,), a.dtype, b.dtype)


def tensor_tensor(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """TensorTensor: dst = in0 op in1 elementwise."""
    a, b, dst, op, dt = m.prepared.get(ins) or prepare(m, ins, _prep_tensor_tensor)
    x = a.view(loop_values).reshape(a.partitions, -1).astype(dt, copy=False)
    y = b.view(loop_values).reshape(b.partitions, -1).astype(dt, copy=False)
    store(dst, loop_values, alu(op, x, y, dt))


def _prep_tensor_scalar(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    src, dst = ops["in"], ops["dst"]
    check_same_tile(ins, dst, src)
    if ins.attrs.get("op1") is None and "scalar1" in ops:
        raise instruction_error(ins, "has operand scalar1 but no op1")
    # The scalars are fp32 (nki.isa.tensor_scalar): an immediate is rounded to fp32 here, a
    # column on every read. GpSimd keeps its integer lanes when every scalar is a whole number.
    steps, integral = [], int_like(src.dtype)
    for i in (0, 1):
        if i == 1 and ins.attrs.get("op1") is None:
            break
        op, col, imm = enum_attr(ins, AluOp, f"op{i}"), ops.get(f"scalar{i}"), None
        if col is not None:
            check_column(ins, dst, col)
            integral = integral and int_like(col.dtype)
            if ins.attrs.get(f"imm{i}") is not None:
                raise instruction_error(ins, f"has both scalar{i} and imm{i}")
        elif ins.attrs.get(f"imm{i}") is None:
            raise instruction_error(ins, f"op{i} needs operand scalar{i} or attribute imm{i}")
        else:
            imm = np.float32(number_attr(ins, f"imm{i}"))
            integral = integral and bool(np.isfinite(imm)) and float(imm).is_integer()
        steps.append((op, col, imm, bool(ins.attrs.get(f"reverse{i}", False))))
    dt = math_dtype(ins.engine, src.dtype) if integral else F32
    if check_bitvec(ins, ops):  # integral, by ALU-BITVEC: an immediate wraps to 32 bits
        dt = op_math_dtype(ins.engine, [op for op, *_ in steps])
        steps = [
            (op, col, None if imm is None else np.asarray(int(imm), np.int64), rev)
            for op, col, imm, rev in steps
        ]
    steps = [
        (op, col, None if col is not None else np.asarray(imm).astype(dt), rev)
        for op, col, imm, rev in steps
    ]
    return src, dst, steps, dt


def tensor_scalar(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """TensorScalar: dst = (in op0 s0) op1 s1, `reverse<i>` swapping the operands of step i."""
    src, dst, steps, dt = m.prepared.get(ins) or prepare(m, ins, _prep_tensor_scalar)
    x = src.view(loop_values).reshape(src.partitions, -1).astype(dt, copy=False)
    for op, col, imm, reverse in steps:
        s = imm
        if col is not None:  # a column is read as fp32, then widened to the math dtype
            s = col.view(loop_values).reshape(-1, 1)
            if op not in BITVEC_OPS:  # a bitvec operator reads the column's bit pattern
                s = s.astype(F32, copy=False)
            s = s.astype(dt, copy=False)
        x = alu(op, s, x, dt) if reverse else alu(op, x, s, dt)
    store(dst, loop_values, np.broadcast_to(x, (src.partitions, src.free_size)))


def _prep_tensor_reduce(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    src, dst = ops["in"], ops["dst"]
    op = enum_attr(ins, AluOp, "op")
    if op not in REDUCTIONS:
        raise instruction_error(ins, f"cannot reduce with {op}")
    counts, axes = src.ap.counts, ins.attrs["axes"]
    if not isinstance(axes, int) or isinstance(axes, bool) or not 1 <= axes <= len(counts):
        raise instruction_error(ins, f"axes {axes!r} is not a count of trailing free dims")
    kept = math.prod(counts[: len(counts) - axes])
    if (dst.partitions, dst.free_size) != (src.partitions, kept):
        raise instruction_error(
            ins, f"dst is {dst.partitions} x {dst.free_size}, result is {src.partitions} x {kept}"
        )
    axis = tuple(range(1 + len(counts) - axes, 1 + len(counts)))
    negate = bool(ins.attrs.get("negate", False))
    return src, dst, REDUCTIONS[op], axis, negate, math_dtype(ins.engine, src.dtype)


def tensor_reduce(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """TensorReduce: reduce the last `axes` free dims with op; `negate` flips the sign."""
    src, dst, ufunc, axis, negate, dt = m.prepared.get(ins) or prepare(m, ins, _prep_tensor_reduce)
    values = src.view(loop_values).astype(dt, copy=False)
    result = None
    if ufunc in ORDER_FREE and math.prod(values.shape[axis[0] :]) <= FOLD_MAX_WINDOW:
        result = fold_window(ufunc, values, axis[0])
    if result is None:
        result = ufunc.reduce(values, axis=axis)
    store(dst, loop_values, -result if negate else result)


def _prep_tensor_copy(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    check_same_tile(ins, ops["dst"], ops["in"])
    return ops["in"], ops["dst"]


def tensor_copy(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """TensorCopy: dst = in, bit-exact for equal dtypes, else through fp32."""
    src, dst = m.prepared.get(ins) or prepare(m, ins, _prep_tensor_copy)
    store(dst, loop_values, src.view(loop_values))


def _prep_copy_predicated(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    dst, predicate, src = ops["dst"], ops["predicate"], ops.get("in")
    check_same_tile(ins, dst, predicate, *([src] if src is not None else []))
    if not int_like(predicate.dtype):
        raise instruction_error(ins, f"predicate must be an integer tile, not {predicate.dtype}")
    if src is not None and src.dtype != dst.dtype:
        raise instruction_error(ins, f"copies {src.dtype} into {dst.dtype}; dtypes must match")
    if src is None:
        if "imm" not in ins.attrs:
            raise instruction_error(ins, "needs an 'in' operand or an 'imm' value")
        src = store_as(np.asarray(number_attr(ins, "imm")), dst.loc.dtype)
    return dst, predicate, src, bool(ins.attrs.get("reverse_pred", False))


def copy_predicated(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """CopyPredicated: dst = in where the predicate is nonzero (zero with reverse_pred)."""
    dst, predicate, src, reverse = m.prepared.get(ins) or prepare(m, ins, _prep_copy_predicated)
    out = dst.view(loop_values).reshape(dst.partitions, -1)
    mask = predicate.view(loop_values).reshape(dst.partitions, -1) != 0
    if reverse:
        mask = ~mask
    values = src.view(loop_values).reshape(dst.partitions, -1) if isinstance(src, Operand) else src
    np.copyto(out, values, where=mask)
    if not np.shares_memory(out, dst.view(loop_values)):
        dst.view(loop_values)[...] = out.reshape(dst.view(loop_values).shape)
    if dst.marks is not None:  # the bytes written no longer hold a matmul's partial sum
        marks = dst.matmul_marks(loop_values)
        np.copyto(marks, False, where=mask.reshape(*marks.shape[:-1], 1))


def _prep_memset(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    value = number_attr(ins, "value")
    dtype = np.int64 if isinstance(value, bool | int | np.integer) else F32
    return ops["dst"], store_as(np.asarray(value, dtype), ops["dst"].loc.dtype)


def memset(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """Memset: every element of dst becomes `value`."""
    dst, fill = m.prepared.get(ins) or prepare(m, ins, _prep_memset)
    dst.view(loop_values)[...] = fill
    if dst.marks is not None:
        dst.matmul_marks(loop_values)[...] = False


def _prep_iota(ins: Instruction, ops: dict[str, Operand]) -> tuple:
    dst = ops["dst"]
    try:
        steps = [int(step) for step in ins.attrs["steps"]]
        base, mult = int(ins.attrs["base"]), int(ins.attrs["channel_multiplier"])
    except (TypeError, ValueError):
        raise instruction_error(
            ins, "base, channel_multiplier and steps must be integers"
        ) from None
    if len(steps) != len(dst.ap.counts):
        raise instruction_error(ins, f"{len(steps)} steps for {len(dst.ap.counts)} free dims")
    grid = np.indices(dst.ap.shape, dtype=np.int64)
    values = base + grid[0] * mult + sum(g * s for g, s in zip(grid[1:], steps, strict=True))
    return dst, store_as(values, dst.loc.dtype)


def iota(m: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """Iota: dst[p, i1, …] = base + p · channel_multiplier + Σ i_k · steps[k], integer math."""
    dst, values = m.prepared.get(ins) or prepare(m, ins, _prep_iota)
    dst.view(loop_values)[...] = values


SEMANTICS: dict[Opcode, Semantics] = {
    Opcode.DMA_COPY: dma_copy,
    Opcode.DMA_GATHER: dma_gather,
    Opcode.MATMULT: matmult,
    Opcode.ACTIVATION: activation,
    Opcode.TENSOR_TENSOR: tensor_tensor,
    Opcode.TENSOR_SCALAR: tensor_scalar,
    Opcode.TENSOR_REDUCE: tensor_reduce,
    Opcode.TENSOR_COPY: tensor_copy,
    Opcode.COPY_PREDICATED: copy_predicated,
    Opcode.MEMSET: memset,
    Opcode.IOTA: iota,
}
