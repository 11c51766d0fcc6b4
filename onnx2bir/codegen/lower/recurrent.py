"""Generic lowering of LSTM, GRU and RNN: the time steps are a loop in BIR.

Per direction (forward, then reverse for a bidirectional node):
1. The input projection of every step at once: XW[seq·batch, G·H] = X·Wᵀ + bias, one tiled PE
   matmul into a DRAM scratch (G gates: 4 for LSTM, 3 for GRU, 1 for RNN; the bias is Wb + Rb,
   except GRU's hidden gate with linear_before_reset, whose Rb stays inside the reset product).
2. Rᵀ [H, G·H] is loaded into SBUF once, its H rows (the recurrent contraction) in chunks of at
   most 128 partitions side by side along the free dim. h starts from initial_h (or 0), kept
   twice: h [batch, H] for the gate math (batch on the partitions, H along the free dim) and
   hᵀ, the stationary operand of the recurrent matmul, in the same H chunks [≤ 128, batch].
3. A BIR loop over the static sequence length (its axis runs the time index backwards for the
   reverse direction): DMA the step's XW rows; gates = XW + hᵀᵀ·Rᵀ, the product one column
   block (≤ 512 columns, one PSUM bank) at a time, each block the matmuls of the H chunks
   accumulated in its bank and then added into the gates on VectorE (the blocks take turns
   over the banks the node has); the activations on ScalarE over each gate's columns; the cell
   update on VectorE:
   LSTM (gates i, o, f, c): c = f⊙c + i⊙g, h = o⊙tanh(c);
   GRU (gates z, r, h): h̃ = tanh(xw_h + r⊙(h·R_hᵀ + Rb_h)) with linear_before_reset, else
   tanh(xw_h + (r⊙h)·R_hᵀ + Rb_h) (a second recurrent matmul on (r⊙h)ᵀ); h = h̃ + z⊙(h − h̃);
   RNN: h = f(xw + h·Rᵀ).
   h is stored to Y at the step's time index and transposed on the PE array (against the
   identity), one H chunk at a time, into hᵀ for the next step.
4. Y_h (and LSTM's Y_c) are the states after the loop.
A batch of more than 128 runs the recurrence once per group of 128 rows (the rows are
independent). The on-chip buffers are allocated once per direction when both directions' fit
in SBUF and PSUM (the directions then run side by side), else once and shared.
Limits (refused with the reason): Rᵀ and the state must fit in SBUF (H = 1024 takes 128 KiB of
a partition's 192 KiB for an LSTM), no peepholes, no clip, no input_forget, activations among
Sigmoid, Tanh, Relu, sequence_lens absent or all full.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import MemoryLocation
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
BANK = MATMUL_MAX_MOVING_FREE  # fp32 columns of one PSUM bank: one matmul's output at most


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
    def rows(self) -> int:
        """Batch rows per pass of the recurrence (the partitions of the gate math)."""
        return min(self.batch, P)

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """(start, size) of the H chunks of at most 128 partitions."""
        return [(k, min(P, self.hidden - k)) for k in range(0, self.hidden, P)]


@dataclass(frozen=True, slots=True)
class _Buffers:
    """One direction's on-chip buffers. Rᵀ chunk j is r_t[:size_j, j·G·H : (j+1)·G·H]; hᵀ (and
    GRU's (r⊙h)ᵀ) chunk j is state_t[:size_j, j·rows : j·rows + batch]. Column c of the
    recurrent product sits at acc offset ((c // 512) mod banks)·512 + c mod 512; the PE
    transposes of chunk j go through flip slot j mod slots."""

    r_t: MemoryLocation
    state: MemoryLocation
    state_t: MemoryLocation
    cell: MemoryLocation | None
    gates: MemoryLocation
    work: MemoryLocation
    acc: MemoryLocation
    flip: MemoryLocation
    gated_t: MemoryLocation | None
    rb: MemoryLocation | None
    banks: int
    slots: int


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
    sets = _buffer_sets(cg, node, dims)
    for d in range(dims.dirs):
        buffers = sets[d % len(sets)]
        _direction(cg, node, dims, d, acts[d * per_dir : (d + 1) * per_dir], mm, buffers)


def _sb_bytes(free: int) -> int:
    return -(-free * 4 // SB_ALIGN) * SB_ALIGN


def _buffer_sets(cg: BirCodeGen, node: Node, dims: _Dims) -> list[_Buffers]:
    """The on-chip buffers: one set per direction when every direction's fit, else one set
    the directions share; refused when one set does not fit."""
    op, h, gh, rows = node.op_type, dims.hidden, dims.gh, dims.rows
    lbr = op == "GRU" and bool(node.attr("linear_before_reset", 0))
    k_tiles = len(dims.chunks)
    weights = _sb_bytes(k_tiles * gh)
    state = (
        _sb_bytes(h) * (1 + (op == "LSTM") + lbr)  # h, c, Rb_h
        + _sb_bytes(gh)  # gates
        + _sb_bytes(2 * h)  # work
        + _sb_bytes(k_tiles * rows) * (1 + (op == "GRU"))  # hᵀ, (r⊙h)ᵀ
    )
    per_set = weights + state
    free = cg.sb_free_bytes()
    if per_set > free:
        raise cg.fail(
            f"{op} hidden size {h}: Rᵀ ({weights // 1024} KiB per partition: {k_tiles} "
            f"chunk(s) of {gh} columns) and the state ({state // 1024} KiB) need "
            f"{per_set // 1024} KiB of SBUF per partition, {free // 1024} KiB are free"
        )
    blocks = -(-gh // BANK)
    psum = cg.psum_free_banks()
    count = dims.dirs if dims.dirs * per_set <= free and psum >= 2 * dims.dirs else 1
    if psum < 2:
        raise cg.fail(f"{op} needs 2 PSUM banks, {psum} are free")
    banks = min(blocks, psum // count - 1)
    return [_allocate(cg, op, dims, lbr, banks) for _ in range(count)]


def _allocate(cg: BirCodeGen, op: str, dims: _Dims, lbr: bool, banks: int) -> _Buffers:
    h, gh, rows, k_tiles = dims.hidden, dims.gh, dims.rows, len(dims.chunks)
    parts = min(h, P)
    r_t = cg.sb_tile("r_t", parts, k_tiles * gh, FP32)
    state = cg.sb_tile("h", rows, h, FP32)
    state_t = cg.sb_tile("h_t", parts, k_tiles * rows, FP32)
    cell = cg.sb_tile("c", rows, h, FP32) if op == "LSTM" else None
    gates = cg.sb_tile("gates", rows, gh, FP32)
    work = cg.sb_tile("work", rows, 2 * h, FP32)
    acc = cg.psum_tile("recurrent", rows, min(gh, banks * BANK))
    slots = min(k_tiles, BANK // rows)
    flip = cg.psum_tile("flip", parts, slots * rows)
    gated_t = cg.sb_tile("gated_t", parts, k_tiles * rows, FP32) if op == "GRU" else None
    rb = cg.sb_tile("rb_h", rows, h, FP32) if lbr else None
    return _Buffers(r_t, state, state_t, cell, gates, work, acc, flip, gated_t, rb, banks, slots)


def _bias(cg: BirCodeGen, node: Node, dims: _Dims, d: int) -> tuple[str, np.ndarray | None]:
    """DRAM constant of the input-projection bias [G·H], and GRU's Rb_h kept apart."""
    gh, h = dims.gates * dims.hidden, dims.hidden
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
    if node.op_type == "GRU" and node.attr("linear_before_reset", 0):
        rb_hidden = rb[2 * h :].copy()
        rb[2 * h :] = 0.0
    loc = cg.add_dram_const(f"{cg.origin.node}/bias{d}", (wb + rb).astype(np.float32))
    return loc.name, rb_hidden


@dataclass(frozen=True, slots=True)
class _Pass:
    """One pass of the recurrence over `count` batch rows from `first`: the access patterns of
    its tiles, each on its `count` partitions (batch-major tiles) or columns (hᵀ)."""

    cg: BirCodeGen
    dims: _Dims
    buf: _Buffers
    first: int
    count: int

    def cols(self, tile, start: int, width: int):
        return self.cg.ap(tile, [(1, width)], start, partitions=self.count)

    def row(self, tile):
        return self.cols(tile, 0, tile.shape[1])

    def chunk(self, tile, j: int, size: int):
        """H chunk j of a transposed tile (hᵀ, (r⊙h)ᵀ): [size, count]."""
        return self.cg.ap(tile, [(1, self.count)], j * self.dims.rows, partitions=size)


def _direction(cg, node, dims: _Dims, d: int, acts, mm: MatmulTiles, buf: _Buffers) -> None:
    seq, batch, inp, h, gh = dims.seq, dims.batch, dims.inp, dims.hidden, dims.gh
    x_loc, w_loc, r_loc = (cg.dram(name).name for name in node.inputs[:3])
    # 1. XW for every step: rows in X's own order (t, b) or (b, t).
    xw = cg.dram_scratch(f"xw{d}", (seq * batch, gh), FP32)
    bias_loc, rb_hidden = _bias(cg, node, dims, d)
    emit_gemm(
        cg,
        MatrixView(x_loc, Affine(), seq * batch, inp, inp, 1),
        MatrixView(w_loc, Affine(d * gh * inp), inp, gh, 1, inp),  # Wᵀ
        MatrixView(xw.name, Affine(), seq * batch, gh, gh, 1),
        mm,
        c=MatrixView(bias_loc, Affine(), seq * batch, gh, 0, 1),
    )
    # 2. Weights on chip: Rᵀ chunk j holds rows k0..k0+size of Rᵀ, i.e. columns of R[d].
    for j, (k0, size) in enumerate(dims.chunks):
        dst = cg.ap(buf.r_t, [(1, gh)], j * gh, partitions=size)
        cg.dma(dst, cg.dram_ap(r_loc, Affine(d * gh * h + k0), [(1, size), (h, gh)]))
    if rb_hidden is not None:
        rb_loc = cg.add_dram_const(f"{cg.origin.node}/rb_h{d}", rb_hidden[None, :])
        src = cg.dram_ap(rb_loc.name, Affine(), [(0, dims.rows), (1, h)])
        cg.dma(cg.ap(buf.rb), src)
    for first in range(0, batch, P):
        _pass(node, _Pass(cg, dims, buf, first, min(P, batch - first)), d, acts)


def _pass(node: Node, ps: _Pass, d: int, acts) -> None:
    """The recurrence of batch rows ps.first .. ps.first + ps.count."""
    cg, dims, buf, b0, rows = ps.cg, ps.dims, ps.buf, ps.first, ps.count
    op = node.op_type
    seq, h, gh = dims.seq, dims.hidden, dims.gh
    t_rows, b_rows = (
        (dims.batch, 1) if dims.layout == 0 else (1, seq)
    )  # XW row = t·t_rows + b·b_rows
    init_h, init_c = _input(node, 5), _input(node, 6)
    # initial_h / initial_c: [dirs, batch, H] (layout 0) or [batch, dirs, H] (layout 1)
    s_off, s_batch = (d * dims.batch * h, h) if dims.layout == 0 else (d * h, dims.dirs * h)
    s_off += b0 * s_batch
    for tile, name in ((buf.state, init_h), (buf.cell, init_c)):
        if tile is None:
            continue
        if name:
            src = cg.dram_ap(cg.dram(name).name, Affine(s_off), [(s_batch, rows), (1, h)])
            cg.dma(ps.row(tile), src)
        else:
            cg.memset(ps.row(tile), 0.0)
    if init_h:
        for j, (k0, size) in enumerate(dims.chunks):
            pattern = [(1, size), (s_batch, rows)]
            src = cg.dram_ap(cg.dram(init_h).name, Affine(s_off + k0), pattern)
            cg.dma(ps.chunk(buf.state_t, j, size), src)
    else:
        cg.memset(cg.ap(buf.state_t), 0.0)
    y_name = node.outputs[0] if node.outputs else ""
    y_loc = cg.dram(y_name).name if y_name else None
    # 3. The time loop.
    with cg.loop("t", 0, seq) as axis:
        direction = node.attr("direction", "forward")
        backwards = direction == "reverse" or (direction == "bidirectional" and d == 1)
        step = Affine(seq - 1) + Affine.axis(axis, -1) if backwards else Affine.axis(axis)
        xw = f"{cg.origin.node}/xw{d}"
        offset = step * (t_rows * gh) + b0 * b_rows * gh
        cg.dma(ps.row(buf.gates), cg.dram_ap(xw, offset, [(b_rows * gh, rows), (1, gh)]))
        live = gh if op != "GRU" else 2 * h

        def add_to_gates(start: int, width: int, acc) -> None:
            gates = ps.cols(buf.gates, start, width)
            cg.tensor_tensor(gates, gates, acc, AluOp.ADD)

        _recurrent(ps, buf.state_t, 0, live, add_to_gates)
        if op == "LSTM":
            _lstm_cell(ps, acts)
        elif op == "GRU":
            _gru_cell(ps, node, acts)
        else:
            cg.activation(ps.row(buf.state), ps.cols(buf.gates, 0, h), acts[0])
        if y_loc is not None:
            _store_step(ps, y_loc, d, step)
        _transpose(ps, buf.state, buf.state_t)
    # 4. Final states.
    for index, tile in ((1, buf.state), (2, buf.cell)):
        out = node.outputs[index] if len(node.outputs) > index else ""
        if out and tile is not None:
            if dims.layout == 0:
                offset, stride = d * dims.batch * h + b0 * h, h
            else:
                offset, stride = d * h + b0 * dims.dirs * h, dims.dirs * h
            dst = cg.dram_ap(cg.dram(out).name, Affine(offset), [(stride, rows), (1, h)])
            cg.dma(dst, ps.row(tile))


def _recurrent(ps: _Pass, stationary, start: int, count: int, consume) -> None:
    """Columns start .. start+count of h·Rᵀ (`stationary` holds hᵀ in H chunks), one column
    block per PSUM bank they touch: the chunks' matmuls accumulate in the block's bank, then
    `consume(column, width, psum)` reads it."""
    cg, buf, gh = ps.cg, ps.buf, ps.dims.gh
    first, end = start, start + count
    while first < end:
        width = min(BANK - first % BANK, end - first)
        slot = (first // BANK) % buf.banks * BANK + first % BANK
        acc = ps.cols(buf.acc, slot, width)
        for j, (_, size) in enumerate(ps.dims.chunks):
            moving = cg.ap(buf.r_t, [(1, width)], j * gh + first, partitions=size)
            cg.matmul(acc, ps.chunk(stationary, j, size), moving, accumulate=j > 0)
        consume(first, width, acc)
        first += width


def _lstm_cell(ps: _Pass, acts: list[ActFunc]) -> None:
    cg, buf, h = ps.cg, ps.buf, ps.dims.hidden
    f_act, g_act, h_act = acts
    i, o, f, c = (ps.cols(buf.gates, k * h, h) for k in range(4))
    for gate in (i, o, f):
        cg.activation(gate, gate, f_act)
    cg.activation(c, c, g_act)
    tmp, cell, state = ps.cols(buf.work, 0, h), ps.row(buf.cell), ps.row(buf.state)
    cg.tensor_tensor(tmp, i, c, AluOp.MULTIPLY)
    cg.tensor_tensor(cell, cell, f, AluOp.MULTIPLY)
    cg.tensor_tensor(cell, cell, tmp, AluOp.ADD)
    cg.activation(tmp, cell, h_act)
    cg.tensor_tensor(state, o, tmp, AluOp.MULTIPLY)


def _gru_cell(ps: _Pass, node: Node, acts: list[ActFunc]) -> None:
    cg, buf, h = ps.cg, ps.buf, ps.dims.hidden
    f_act, g_act = acts
    z, r, cand = (ps.cols(buf.gates, k * h, h) for k in range(3))
    cg.activation(z, z, f_act)
    cg.activation(r, r, f_act)
    tmp, state = ps.cols(buf.work, 0, h), ps.row(buf.state)
    if node.attr("linear_before_reset", 0):

        def reset_product(start: int, width: int, acc) -> None:  # h·R_hᵀ + Rb_h
            column = start - 2 * h
            cg.tensor_tensor(
                ps.cols(buf.work, column, width), acc, ps.cols(buf.rb, column, width), AluOp.ADD
            )

        _recurrent(ps, buf.state_t, 2 * h, h, reset_product)
        cg.tensor_tensor(tmp, tmp, r, AluOp.MULTIPLY)
        cg.tensor_tensor(cand, cand, tmp, AluOp.ADD)
    else:  # (r⊙h)·R_hᵀ: r⊙h transposed on the PE array, then a second recurrent matmul
        cg.tensor_tensor(tmp, r, state, AluOp.MULTIPLY)
        _transpose(ps, buf.work, buf.gated_t)

        def add_to_candidate(start: int, width: int, acc) -> None:
            gates = ps.cols(buf.gates, start, width)
            cg.tensor_tensor(gates, gates, acc, AluOp.ADD)

        _recurrent(ps, buf.gated_t, 2 * h, h, add_to_candidate)
    cg.activation(cand, cand, g_act)
    cg.tensor_tensor(tmp, state, cand, AluOp.SUBTRACT)  # h − h̃
    cg.tensor_tensor(tmp, tmp, z, AluOp.MULTIPLY)
    cg.tensor_tensor(state, cand, tmp, AluOp.ADD)


def _transpose(ps: _Pass, src: MemoryLocation, dst: MemoryLocation) -> None:
    """dst's H chunks [size, rows] = src[:, chunk]ᵀ for src [rows, H] (from column 0), through
    the PE array and PSUM, one chunk at a time."""
    cg, buf = ps.cg, ps.buf
    for j, (k0, size) in enumerate(ps.dims.chunks):
        flipped = cg.ap(buf.flip, [(1, ps.count)], j % buf.slots * ps.dims.rows, partitions=size)
        cg.matmul(flipped, ps.cols(src, k0, size), cg.identity(ps.count), accumulate=False)
        cg.tensor_copy(ps.chunk(dst, j, size), flipped)


def _store_step(ps: _Pass, y_loc: str, d: int, step: Affine) -> None:
    """Y[t, d, b, :] (layout 0) or Y[b, t, d, :] (layout 1) = h[b, :]."""
    dims, h = ps.dims, ps.dims.hidden
    if dims.layout == 0:
        offset = step * (dims.dirs * dims.batch * h) + d * dims.batch * h + ps.first * h
        pattern = [(h, ps.count), (1, h)]
    else:
        row = dims.seq * dims.dirs * h
        offset = step * (dims.dirs * h) + d * h + ps.first * row
        pattern = [(row, ps.count), (1, h)]
    ps.cg.dma(ps.cg.dram_ap(y_loc, offset, pattern), ps.row(ps.buf.state))
