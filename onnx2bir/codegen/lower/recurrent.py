"""Generic lowering of LSTM, GRU and RNN: the time steps are a loop in BIR.

The state lives transposed, the hidden units on the partitions: hᵀ (and LSTM's cᵀ) is
[≤ 128, chunks·rows], H split into chunks of at most 128 partitions side by side along the free
dim, each chunk's `rows` batch columns next to each other. Every gate is split the same way,
so the gate math runs on whole chunks, the matmuls' output rows are hidden units and hᵀ is the
next step's moving operand as it stands: nothing is transposed inside the loop.

Per direction:
1. The input projection of every step at once: XWᵀ[G·H, seq·batch] = W·Xᵀ + bias, one tiled PE
   matmul into a DRAM scratch (G gates: 4 for LSTM, 3 for GRU, 1 for RNN; the bias is Wb + Rb,
   except GRU's hidden gate with linear_before_reset, whose Rb stays inside the reset product),
   then, when it fits, loaded into SBUF whole (one DMA per chunk size), else one step's
   columns per step.
2. Rᵀ [H, G·H] is loaded into SBUF once, its H rows (the recurrent contraction) in chunks of at
   most 128 partitions; h starts from initial_h (or 0), c from initial_c (or 0).
3. A BIR loop over the static sequence length (its axis runs the time index backwards for the
   reverse direction). For each gate chunk (gate g, hidden units j·128 ..): its rows of the
   recurrent product h·Rᵀ, [units, rows] = Σ over the H chunks k of Rᵀ[k, g·H + j·128 ..]ᵀ ·
   hᵀ[k], the chunks' matmuls accumulated in PSUM; a bank holds as many gate chunks as its 512
   fp32 columns allow, the banks taken in turn, each bank's gate chunks added to XWᵀ's step
   columns on VectorE in one instruction. Then the activations (ScalarE) and the cell update
   (VectorE) over all full 128-unit chunks at once, and once more for a last partial chunk:
   LSTM (gates i, o, f, c): c = f⊙c + i⊙g, h = o⊙tanh(c);
   GRU (gates z, r, h): h̃ = tanh(xw_h + r⊙(h·R_hᵀ + Rb_h)) with linear_before_reset, else
   tanh(xw_h + (r⊙h)·R_hᵀ + Rb_h) (a second recurrent matmul, on (r⊙h)ᵀ); h = h̃ + z⊙(h − h̃);
   RNN: h = f(xw + h·Rᵀ).
   hᵀ is updated in place and stored to Y at the step's time index (one DMA per chunk size).
   A bidirectional node whose two directions' buffers fit runs both in the same loop, so that
   one direction's matmuls overlap the other's gate math; otherwise one loop per direction,
   sharing the buffers.
4. Y_h (and LSTM's Y_c) are the states after the loop.
The batch columns of one pass are at most 128 (fewer when the buffers would not fit); a bigger
batch runs the recurrence once per group of rows (the rows are independent).
Limits (refused with the reason): Rᵀ and one batch row's state must fit in SBUF (H = 1024
takes 128 KiB of a partition's 192 KiB for an LSTM, past about H = 1100 it does not fit), no
peepholes, no clip, no input_forget, activations among Sigmoid, Tanh, Relu, sequence_lens
absent or all full.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern, MemoryLocation
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS, SB_ALIGN
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.matmul import emit_gemm
from onnx2bir.codegen.matmul_tiles import MatmulTiles, MatrixView
from onnx2bir.codegen.tiling import Affine
from onnx2bir.graph import Node

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_ACTS = {"Sigmoid": ActFunc.SIGMOID, "Tanh": ActFunc.TANH, "Relu": ActFunc.RELU}
FP32 = Dtype.FP32
P = NUM_PARTITIONS
BANK = MATMUL_MAX_MOVING_FREE  # fp32 columns of one PSUM bank
MAX_ROWS = 128  # batch columns per pass


@dataclass(frozen=True, slots=True)
class _Dims:
    seq: int
    batch: int
    inp: int
    hidden: int
    gates: int
    dirs: int
    layout: int

    @property
    def gh(self) -> int:
        return self.gates * self.hidden

    @property
    def columns(self) -> int:
        """Columns of XWᵀ: one per row of X (seq·batch)."""
        return self.seq * self.batch

    @property
    def parts(self) -> int:
        return min(self.hidden, P)

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """(first unit, size) of the H chunks of at most 128 partitions."""
        return [(k, min(P, self.hidden - k)) for k in range(0, self.hidden, P)]

    @property
    def groups(self) -> list[tuple[int, int, int]]:
        """(first chunk, chunks, partitions): the full 128-unit chunks, then a partial one."""
        full, rest = divmod(self.hidden, P)
        return ([(0, full, P)] if full else []) + ([(full, 1, rest)] if rest else [])

    @property
    def xw_rows(self) -> tuple[int, int]:
        """(per step, per batch row): XWᵀ column = t·step + b·row, in X's own row order."""
        return (self.batch, 1) if self.layout == 0 else (1, self.seq)


@dataclass(frozen=True, slots=True)
class _Plan:
    rows: int  # batch columns per pass
    sets: int  # buffer sets: one per direction (run in one loop) or one shared
    banks: int  # PSUM banks per set
    resident: bool  # XWᵀ held in SBUF whole


@dataclass(slots=True)
class _Buffers:
    """One direction's on-chip buffers. Every tile of hidden-unit rows has chunk j (units
    j·128 ..) at free offset j·rows; `gates` has gate g's chunk j at (g·chunks + j)·rows, the
    resident `xw` at (g·chunks + j)·seq·batch. Rᵀ chunk k (rows k·128 .. of Rᵀ) is at k·G·H."""

    r_t: MemoryLocation
    state: MemoryLocation
    cell: MemoryLocation | None
    gates: MemoryLocation
    work: MemoryLocation
    gated: MemoryLocation | None
    rb: MemoryLocation | None
    xw: MemoryLocation | None
    acc: MemoryLocation
    banks: int
    next_bank: int = field(default=0)


@dataclass(slots=True)
class _Direction:
    d: int
    buf: _Buffers
    acts: list[ActFunc]
    backwards: bool
    xw_dram: str = ""
    step: Affine = field(default_factory=Affine)


def _input(node: Node, index: int) -> str:
    inputs = node.inputs
    return inputs[index] if len(inputs) > index and inputs[index] else ""


def _check(cg: BirCodeGen, node: Node, dims: _Dims) -> list[ActFunc]:
    op, attrs = node.op_type, node.attrs
    if _input(node, 7) and op == "LSTM":
        raise cg.fail("LSTM peepholes (input P) are not supported")
    if attrs.get("clip") is not None:
        raise cg.fail(f"{op} clip is not supported")
    if attrs.get("input_forget", 0):
        raise cg.fail("LSTM input_forget is not supported")
    if attrs.get("activation_alpha") or attrs.get("activation_beta"):
        raise cg.fail(f"{op} activation_alpha/beta are not supported")
    lens = _input(node, 4)
    if lens:
        info = cg.graph.tensors[lens]
        if not info.is_const or np.any(np.asarray(info.const) != dims.seq):
            raise cg.fail(f"{op} sequence_lens must be a constant equal to the sequence length")
    names = attrs.get("activations") or _DEFAULT_ACTS[op] * dims.dirs
    unknown = sorted({a for a in names if a not in _ACTS})
    if unknown:
        raise cg.fail(f"{op} activations {', '.join(unknown)} are not supported")
    return [_ACTS[a] for a in names]


def lower_recurrent(cg: BirCodeGen, node: Node) -> None:
    op, attrs = node.op_type, node.attrs
    x_shape = tuple(cg.graph.tensors[node.inputs[0]].shape)
    w_shape = tuple(cg.graph.tensors[node.inputs[1]].shape)
    layout = int(attrs.get("layout", 0))
    seq, batch = (x_shape[0], x_shape[1]) if layout == 0 else (x_shape[1], x_shape[0])
    dims = _Dims(seq, batch, x_shape[2], w_shape[1] // _GATES[op], _GATES[op], w_shape[0], layout)
    acts = _check(cg, node, dims)
    per_dir = len(acts) // dims.dirs
    mm = MatmulTiles(cg)
    plan = _plan(cg, node, dims)
    sets = [_allocate(cg, node, dims, plan) for _ in range(plan.sets)]
    direction = node.attr("direction", "forward")
    directions = [
        _Direction(
            d,
            sets[d % plan.sets],
            acts[d * per_dir : (d + 1) * per_dir],
            direction == "reverse" or (direction == "bidirectional" and d == 1),
        )
        for d in range(dims.dirs)
    ]
    loops = [directions] if plan.sets == dims.dirs else [[one] for one in directions]
    for together in loops:
        for one in together:
            _prepare(cg, node, dims, plan, one, mm)
        for first in range(0, batch, plan.rows):
            _Pass(cg, node, dims, plan, first, min(plan.rows, batch - first)).run(together)


def _sb_bytes(free: int) -> int:
    return -(-free * 4 // SB_ALIGN) * SB_ALIGN


def _lbr(node: Node) -> bool:
    return node.op_type == "GRU" and bool(node.attr("linear_before_reset", 0))


def _set_bytes(node: Node, dims: _Dims, rows: int, resident: bool) -> tuple[int, int]:
    """SBUF bytes per partition of one buffer set: (Rᵀ, the rest)."""
    op, k_tiles = node.op_type, len(dims.chunks)
    per_chunk = 2 + (op == "LSTM") + (op == "GRU" and not _lbr(node)) + _lbr(node)
    rest = _sb_bytes(k_tiles * rows) * per_chunk + _sb_bytes(dims.gates * k_tiles * rows)
    if resident:
        rest += _sb_bytes(dims.gates * k_tiles * dims.columns)
    return _sb_bytes(k_tiles * dims.gh), rest


def _plan(cg: BirCodeGen, node: Node, dims: _Dims) -> _Plan:
    """The widest pass (batch columns) that fits, then both directions in one loop if their
    buffers fit, then XWᵀ resident if it fits; refused when Rᵀ and one batch column do not."""
    free, psum = cg.sb_free_bytes(), cg.psum_free_banks()
    rows = min(dims.batch, MAX_ROWS)
    while True:
        for sets in sorted({dims.dirs, 1}, reverse=True):
            if psum < sets:
                continue
            for resident in (True, False):
                if sets * sum(_set_bytes(node, dims, rows, resident)) <= free:
                    return _Plan(rows, sets, psum // sets, resident)
        if rows == 1:
            break
        rows = max(1, rows // 2)
    weights, rest = _set_bytes(node, dims, 1, False)
    raise cg.fail(
        f"{node.op_type} hidden size {dims.hidden}: Rᵀ ({weights // 1024} KiB per partition: "
        f"{len(dims.chunks)} chunks of {dims.gh} columns) and the state of one batch row "
        f"({-(-rest // 1024)} KiB) need {-(-(weights + rest) // 1024)} KiB of SBUF per "
        f"partition, {free // 1024} KiB are free"
    )


def _allocate(cg: BirCodeGen, node: Node, dims: _Dims, plan: _Plan) -> _Buffers:
    op, parts, k_tiles, rows = node.op_type, dims.parts, len(dims.chunks), plan.rows
    r_t = cg.sb_tile("r_t", parts, k_tiles * dims.gh, FP32)
    state = cg.sb_tile("h_t", parts, k_tiles * rows, FP32)
    cell = cg.sb_tile("c_t", parts, k_tiles * rows, FP32) if op == "LSTM" else None
    gates = cg.sb_tile("gates", parts, dims.gates * k_tiles * rows, FP32)
    work = cg.sb_tile("work", parts, k_tiles * rows, FP32)
    gated = None
    if op == "GRU" and not _lbr(node):
        gated = cg.sb_tile("gated_t", parts, k_tiles * rows, FP32)
    rb = cg.sb_tile("rb_h", parts, k_tiles * rows, FP32) if _lbr(node) else None
    xw = None
    if plan.resident:
        xw = cg.sb_tile("xw_t", parts, dims.gates * k_tiles * dims.columns, FP32)
    acc = cg.psum_tile("recurrent", parts, plan.banks * BANK)
    return _Buffers(r_t, state, cell, gates, work, gated, rb, xw, acc, plan.banks)


def _bias(cg: BirCodeGen, node: Node, dims: _Dims, d: int) -> tuple[str, np.ndarray | None]:
    """DRAM constant of the input-projection bias [G·H], and GRU's Rb_h kept apart."""
    gh, h = dims.gh, dims.hidden
    b_name = _input(node, 3)
    if not b_name:
        both = np.zeros(2 * gh, np.float32)
    else:
        info = cg.graph.tensors[b_name]
        if not info.is_const:
            raise cg.fail(f"{node['op_type']} bias B must be a constant")
        both = np.asarray(info.const, np.float32)[d]
    wb, rb = both[:gh].copy(), both[gh:].copy()
    rb_hidden = None
    if _lbr(node):
        rb_hidden = rb[2 * h :].copy()
        rb[2 * h :] = 0.0
    loc = cg.add_dram_const(f"{cg.origin.node}/bias{d}", (wb + rb).astype(np.float32))
    return loc.name, rb_hidden


def _prepare(cg, node: Node, dims: _Dims, plan: _Plan, one: _Direction, mm: MatmulTiles) -> None:
    """XWᵀ, Rᵀ (and Rb_h) of one direction."""
    d, buf, gh, h, cols = one.d, one.buf, dims.gh, dims.hidden, dims.columns
    x_loc, w_loc, r_loc = (cg.dram(name).name for name in node.inputs[:3])
    xw = cg.dram_scratch(f"xw{d}", (gh, cols), FP32)
    one.xw_dram = xw.name
    bias_loc, rb_hidden = _bias(cg, node, dims, d)
    emit_gemm(
        cg,
        MatrixView(w_loc, Affine(d * gh * dims.inp), gh, dims.inp, dims.inp, 1),  # W
        MatrixView(x_loc, Affine(), dims.inp, cols, 1, dims.inp),  # Xᵀ
        MatrixView(xw.name, Affine(), gh, cols, cols, 1),
        mm,
        c=MatrixView(bias_loc, Affine(), gh, cols, 1, 0),
    )
    for k, (k0, size) in enumerate(dims.chunks):  # Rᵀ rows k0 .. = columns of R[d]
        dst = cg.ap(buf.r_t, [(1, gh)], k * gh, partitions=size)
        cg.dma(dst, cg.dram_ap(r_loc, Affine(d * gh * h + k0), [(1, size), (h, gh)]))
    k_tiles, rows = len(dims.chunks), plan.rows
    rb_loc = None
    if rb_hidden is not None:
        rb_loc = cg.add_dram_const(f"{cg.origin.node}/rb_h{d}", rb_hidden).name
    for c0, count, parts in dims.groups:
        # XWᵀ row g·H + (c0 + j)·128 + p -> partition p, gate chunk (g, c0 + j)
        if buf.xw is not None:
            dst = cg.ap(
                buf.xw, [(k_tiles * cols, dims.gates), (cols, count), (1, cols)], c0 * cols, parts
            )
            src = [(cols, parts), (h * cols, dims.gates), (P * cols, count), (1, cols)]
            cg.dma(dst, cg.dram_ap(xw.name, Affine(c0 * P * cols), src))
        if rb_loc is not None:
            dst = cg.ap(buf.rb, [(1, count * rows)], c0 * rows, partitions=parts)
            src = [(1, parts), (P, count), (0, rows)]
            cg.dma(dst, cg.dram_ap(rb_loc, Affine(c0 * P), src))


@dataclass(frozen=True, slots=True)
class _Run:
    """Gate chunks (gate, first chunk .. + count) of one partition size that share a bank."""

    gate: int
    first: int
    count: int
    parts: int


class _Pass:
    """One pass of the recurrence over `count` batch rows from `first`."""

    def __init__(self, cg, node: Node, dims: _Dims, plan: _Plan, first: int, count: int):
        self.cg, self.node, self.dims, self.plan = cg, node, dims, plan
        self.first, self.count = first, count
        self.k_tiles = len(dims.chunks)

    # --- access patterns ---------------------------------------------------------------
    def chunks(self, tile, chunk: int, count: int, parts: int, block: int = 0) -> AccessPattern:
        """Chunks chunk .. chunk+count of a chunked tile (of its block `block` of chunks:
        a gate of `gates`), each its `count` batch columns."""
        rows = self.plan.rows
        offset = (block * self.k_tiles + chunk) * rows
        return self.cg.ap(tile, [(rows, count), (1, self.count)], offset, partitions=parts)

    def gate(self, tile, gate: int, c0: int, count: int, parts: int, gates: int = 1):
        """Gate chunks of `gates` consecutive gates (one instruction over all of them)."""
        rows, stride = self.plan.rows, self.k_tiles * self.plan.rows
        pattern = [(stride, gates), (rows, count), (1, self.count)]
        return self.cg.ap(tile, pattern, (gate * self.k_tiles + c0) * rows, partitions=parts)

    def xw(self, one: _Direction, run: _Run) -> AccessPattern:
        """XWᵀ's columns of this step for a run of gate chunks."""
        buf, dims = one.buf, self.dims
        if buf.xw is None:  # loaded into `gates` at the start of the step
            return self.chunks(buf.gates, run.first, run.count, run.parts, run.gate)
        per_step, per_row = dims.xw_rows
        cols = dims.columns
        offset = (run.gate * self.k_tiles + run.first) * cols + one.step * per_step
        offset = offset + self.first * per_row
        pattern = [(cols, run.count), (per_row, self.count)]
        return self.cg.ap(buf.xw, pattern, offset, partitions=run.parts)

    def runs(self, gates: range) -> list[_Run]:
        per_bank = BANK // self.plan.rows
        out = []
        for g in gates:
            for c0, count, parts in self.dims.groups:
                for start in range(c0, c0 + count, per_bank):
                    out.append(_Run(g, start, min(per_bank, c0 + count - start), parts))
        return out

    # --- the pass ---------------------------------------------------------------------
    def run(self, together: list[_Direction]) -> None:
        cg, node = self.cg, self.node
        for one in together:
            self._initial_state(one)
        y_name = node.outputs[0] if node.outputs else ""
        y_loc = cg.dram(y_name).name if y_name else None
        live = range(2) if node.op_type == "GRU" else range(self.dims.gates)
        last = self.dims.seq - 1
        with cg.loop("t", 0, self.dims.seq) as axis:
            for one in together:
                forward = Affine.axis(axis)
                one.step = Affine(last) + Affine.axis(axis, -1) if one.backwards else forward
                if one.buf.xw is None:
                    self._load_step(one)
                self._recurrent(one, one.buf.state, live, self._add_to_gates(one))
            for one in together:
                if node.op_type == "LSTM":
                    self._lstm_cell(one)
                elif node.op_type == "GRU":
                    self._gru_cell(one)
                else:
                    self._rnn_cell(one)
            if y_loc is not None:
                for one in together:
                    self._store_step(one, y_loc)
        for one in together:
            self._final_state(one)

    def _state_dram(self, name: str, d: int, c0: int, parts: int, count: int):
        """initial_h/c, Y_h/c: [dirs, batch, H] (layout 0) or [batch, dirs, H] (layout 1),
        walked as hidden unit (partitions), chunk, batch row."""
        dims, h = self.dims, self.dims.hidden
        offset, per_row = (d * dims.batch * h, h) if dims.layout == 0 else (d * h, dims.dirs * h)
        offset += self.first * per_row + c0 * P
        pattern = [(1, parts), (P, count), (per_row, self.count)]
        return self.cg.dram_ap(self.cg.dram(name).name, Affine(offset), pattern)

    def _initial_state(self, one: _Direction) -> None:
        node = self.node
        for tile, name in ((one.buf.state, _input(node, 5)), (one.buf.cell, _input(node, 6))):
            if tile is None:
                continue
            for c0, count, parts in self.dims.groups:
                dst = self.chunks(tile, c0, count, parts)
                if name:
                    self.cg.dma(dst, self._state_dram(name, one.d, c0, parts, count))
                else:
                    self.cg.memset(dst, 0.0)

    def _final_state(self, one: _Direction) -> None:
        outputs = self.node.outputs
        for index, tile in ((1, one.buf.state), (2, one.buf.cell)):
            out = outputs[index] if len(outputs) > index else ""
            if not out or tile is None:
                continue
            for c0, count, parts in self.dims.groups:
                dst = self._state_dram(out, one.d, c0, parts, count)
                self.cg.dma(dst, self.chunks(tile, c0, count, parts))

    def _load_step(self, one: _Direction) -> None:
        """XWᵀ's step columns into `gates` (XWᵀ not resident)."""
        dims, cols = self.dims, self.dims.columns
        per_step, per_row = dims.xw_rows
        for c0, count, parts in dims.groups:
            offset = one.step * per_step + self.first * per_row + c0 * P * cols
            src = [(cols, parts), (dims.hidden * cols, dims.gates), (P * cols, count)]
            src.append((per_row, self.count))
            dst = self.gate(one.buf.gates, 0, c0, count, parts, dims.gates)
            self.cg.dma(dst, self.cg.dram_ap(one.xw_dram, offset, src))

    def _recurrent(self, one: _Direction, moving_tile, gates: range, consume) -> None:
        """Gate rows `gates` of (h·Rᵀ)ᵀ, `moving_tile` holding hᵀ (or (r⊙h)ᵀ): each gate
        chunk's matmuls over the H chunks accumulate in PSUM, a bank per run of gate chunks,
        then `consume(run, psum)` reads the run."""
        cg, buf, dims, rows = self.cg, one.buf, self.dims, self.plan.rows
        for run in self.runs(gates):
            base = buf.next_bank * BANK
            buf.next_bank = (buf.next_bank + 1) % buf.banks
            for i in range(run.count):
                column = run.gate * dims.hidden + (run.first + i) * P  # of Rᵀ
                dst = cg.ap(buf.acc, [(1, self.count)], base + i * rows, partitions=run.parts)
                for k, (_, size) in enumerate(dims.chunks):
                    stationary = cg.ap(
                        buf.r_t, [(1, run.parts)], k * dims.gh + column, partitions=size
                    )
                    moving = cg.ap(moving_tile, [(1, self.count)], k * rows, partitions=size)
                    cg.matmul(dst, stationary, moving, accumulate=k > 0)
            pattern = [(rows, run.count), (1, self.count)]
            consume(run, cg.ap(buf.acc, pattern, base, partitions=run.parts))

    def _add_to_gates(self, one: _Direction):
        def consume(run: _Run, acc: AccessPattern) -> None:
            dst = self.chunks(one.buf.gates, run.first, run.count, run.parts, run.gate)
            self.cg.tensor_tensor(dst, self.xw(one, run), acc, AluOp.ADD)

        return consume

    # --- the cells ----------------------------------------------------------------------
    def _lstm_cell(self, one: _Direction) -> None:
        cg, buf = self.cg, one.buf
        f_act, g_act, h_act = one.acts
        for c0, count, parts in self.dims.groups:
            i, o, f, c = (self.gate(buf.gates, g, c0, count, parts) for g in range(4))
            sigmoids = self.gate(buf.gates, 0, c0, count, parts, 3)
            cg.activation(sigmoids, sigmoids, f_act)  # i, o, f
            cg.activation(c, c, g_act)
            tmp = self.chunks(buf.work, c0, count, parts)
            cell, state = (
                self.chunks(buf.cell, c0, count, parts),
                self.chunks(buf.state, c0, count, parts),
            )
            cg.tensor_tensor(tmp, i, c, AluOp.MULTIPLY)
            cg.tensor_tensor(cell, cell, f, AluOp.MULTIPLY)
            cg.tensor_tensor(cell, cell, tmp, AluOp.ADD)
            cg.activation(tmp, cell, h_act)
            cg.tensor_tensor(state, o, tmp, AluOp.MULTIPLY)

    def _rnn_cell(self, one: _Direction) -> None:
        for c0, count, parts in self.dims.groups:
            state = self.chunks(one.buf.state, c0, count, parts)
            self.cg.activation(state, self.gate(one.buf.gates, 0, c0, count, parts), one.acts[0])

    def _gru_cell(self, one: _Direction) -> None:
        cg, buf = self.cg, one.buf
        f_act, g_act = one.acts
        groups = self.dims.groups
        for c0, count, parts in groups:
            z_r = self.gate(buf.gates, 0, c0, count, parts, 2)
            cg.activation(z_r, z_r, f_act)
        if buf.rb is not None:  # h·R_hᵀ + Rb_h, times r, onto xw_h

            def reset_product(run: _Run, acc: AccessPattern) -> None:
                tmp = self.chunks(buf.work, run.first, run.count, run.parts)
                rb = self.chunks(buf.rb, run.first, run.count, run.parts)
                cg.tensor_tensor(tmp, acc, rb, AluOp.ADD)
                r = self.chunks(buf.gates, run.first, run.count, run.parts, 1)
                cg.tensor_tensor(tmp, tmp, r, AluOp.MULTIPLY)
                cand = self.chunks(buf.gates, run.first, run.count, run.parts, 2)
                cg.tensor_tensor(cand, self.xw(one, run), tmp, AluOp.ADD)

            self._recurrent(one, buf.state, range(2, 3), reset_product)
        else:  # (r⊙h)·R_hᵀ: a second recurrent matmul on (r⊙h)ᵀ
            for c0, count, parts in groups:
                r = self.gate(buf.gates, 1, c0, count, parts)
                state = self.chunks(buf.state, c0, count, parts)
                cg.tensor_tensor(self.chunks(buf.gated, c0, count, parts), r, state, AluOp.MULTIPLY)
            self._recurrent(one, buf.gated, range(2, 3), self._add_to_gates(one))
        for c0, count, parts in groups:
            z, cand = (
                self.gate(buf.gates, 0, c0, count, parts),
                self.gate(buf.gates, 2, c0, count, parts),
            )
            tmp, state = (
                self.chunks(buf.work, c0, count, parts),
                self.chunks(buf.state, c0, count, parts),
            )
            cg.activation(cand, cand, g_act)
            cg.tensor_tensor(tmp, state, cand, AluOp.SUBTRACT)  # h − h̃
            cg.tensor_tensor(tmp, tmp, z, AluOp.MULTIPLY)
            cg.tensor_tensor(state, cand, tmp, AluOp.ADD)

    def _store_step(self, one: _Direction, y_loc: str) -> None:
        """Y[t, d, b, :] (layout 0) or Y[b, t, d, :] (layout 1) = h[b, :]."""
        dims, h = self.dims, self.dims.hidden
        if dims.layout == 0:
            offset = one.step * (dims.dirs * dims.batch * h) + one.d * dims.batch * h
            per_row = h
        else:
            per_row = dims.seq * dims.dirs * h
            offset = one.step * (dims.dirs * h) + one.d * h
        offset = offset + self.first * per_row
        for c0, count, parts in dims.groups:
            pattern = [(1, parts), (P, count), (per_row, self.count)]
            dst = self.cg.dram_ap(y_loc, offset + c0 * P, pattern)
            self.cg.dma(dst, self.chunks(one.buf.state, c0, count, parts))
