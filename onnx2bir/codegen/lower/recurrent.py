"""Generic lowering of LSTM, GRU and RNN: the time steps are a loop in BIR.

Per direction (forward, then reverse for a bidirectional node):
1. The input projection of every step at once: XW[seq·batch, G·H] = X·Wᵀ + bias, one tiled PE
   matmul into a DRAM scratch (G gates: 4 for LSTM, 3 for GRU, 1 for RNN; the bias is Wb + Rb,
   except GRU's hidden gate with linear_before_reset, whose Rb stays inside the reset product).
2. Rᵀ [H, G·H] is loaded into SBUF once; h starts from initial_h (or 0), kept twice: h [batch,
   H] for the gate math and hᵀ [H, batch], the stationary operand of the recurrent matmul.
3. A BIR loop over the static sequence length (its axis runs the time index backwards for the
   reverse direction): DMA the step's XW rows; gates = XW + hᵀᵀ·Rᵀ (PE into PSUM, ≤ 512 columns
   per matmul, VectorE adds); the activations on ScalarE over each gate's columns; the cell
   update on VectorE:
   LSTM (gates i, o, f, c): c = f⊙c + i⊙g, h = o⊙tanh(c);
   GRU (gates z, r, h): h̃ = tanh(xw_h + r⊙(h·R_hᵀ + Rb_h)) with linear_before_reset, else
   tanh(xw_h + (r⊙h)·R_hᵀ + Rb_h) (a second recurrent matmul on (r⊙h)ᵀ); h = h̃ + z⊙(h − h̃);
   RNN: h = f(xw + h·Rᵀ).
   h is stored to Y at the step's time index and transposed on the PE array (against the
   identity) into hᵀ for the next step.
4. Y_h (and LSTM's Y_c) are the states after the loop.
Limits (refused with the reason): H ≤ 128, batch ≤ 128, no peepholes, no clip,
no input_forget, activations among Sigmoid, Tanh, Relu, sequence_lens absent or all full.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.matmul import emit_gemm
from onnx2bir.codegen.matmul_tiles import MatmulTiles, MatrixView
from onnx2bir.codegen.tiling import Affine
from onnx2bir.graph import Node

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_ACTS = {"Sigmoid": ActFunc.SIGMOID, "Tanh": ActFunc.TANH, "Relu": ActFunc.RELU}
FP32 = Dtype.FP32


@dataclass(frozen=True, slots=True)
class _Dims:
    seq: int
    batch: int
    inp: int
    hidden: int
    gates: int
    dirs: int
    layout: int


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
    if dims.hidden > NUM_PARTITIONS or dims.batch > NUM_PARTITIONS:
        raise cg.fail(f"{op} hidden size {dims.hidden} and batch {dims.batch} must be <= 128")
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
    for d in range(dims.dirs):
        _direction(cg, node, dims, d, acts[d * per_dir : (d + 1) * per_dir], mm)


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


def _direction(cg, node, dims: _Dims, d: int, acts: list[ActFunc], mm: MatmulTiles) -> None:
    op = node.op_type
    seq, batch, inp, h, gh = dims.seq, dims.batch, dims.inp, dims.hidden, dims.gates * dims.hidden
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
    t_rows, b_rows = (batch, 1) if dims.layout == 0 else (1, seq)  # XW row = t·t_rows + b·b_rows
    # 2. State and weights on chip.
    r_t = cg.sb_tile("r_t", h, gh, FP32)
    cg.dma(cg.ap(r_t), cg.dram_ap(r_loc, Affine(d * gh * h), [(1, h), (h, gh)]))
    state = cg.sb_tile("h", batch, h, FP32)
    state_t = cg.sb_tile("h_t", h, batch, FP32)
    cell = cg.sb_tile("c", batch, h, FP32) if op == "LSTM" else None
    gates = cg.sb_tile("gates", batch, gh, FP32)
    work = cg.sb_tile("work", batch, 2 * h, FP32)
    acc = cg.psum_tile("recurrent", batch, gh)
    flip = cg.psum_tile("flip", h, batch)
    gated_t = cg.sb_tile("gated_t", h, batch, FP32) if op == "GRU" else None
    rb_tile = None
    if rb_hidden is not None:
        rb_loc = cg.add_dram_const(f"{cg.origin.node}/rb_h{d}", rb_hidden[None, :])
        rb_tile = cg.sb_tile("rb_h", batch, h, FP32)
        cg.dma(cg.ap(rb_tile), cg.dram_ap(rb_loc.name, Affine(), [(0, batch), (1, h)]))
    init_h, init_c = _input(node, 5), _input(node, 6)
    # initial_h / initial_c: [dirs, batch, H] (layout 0) or [batch, dirs, H] (layout 1)
    s_off, s_batch = (d * batch * h, h) if dims.layout == 0 else (d * h, dims.dirs * h)
    for tile, name in ((state, init_h), (cell, init_c)):
        if tile is None:
            continue
        if name:
            src = cg.dram_ap(cg.dram(name).name, Affine(s_off), [(s_batch, batch), (1, h)])
            cg.dma(cg.ap(tile), src)
        else:
            cg.memset(cg.ap(tile), 0.0)
    if init_h:
        src = cg.dram_ap(cg.dram(init_h).name, Affine(s_off), [(1, h), (s_batch, batch)])
        cg.dma(cg.ap(state_t), src)
    else:
        cg.memset(cg.ap(state_t), 0.0)
    y_name = node.outputs[0] if node.outputs else ""
    y_loc = cg.dram(y_name).name if y_name else None
    # 3. The time loop.
    with cg.loop("t", 0, seq) as axis:
        direction = node.attr("direction", "forward")
        backwards = direction == "reverse" or (direction == "bidirectional" and d == 1)
        step = Affine(seq - 1) + Affine.axis(axis, -1) if backwards else Affine.axis(axis)
        cg.dma(
            cg.ap(gates), cg.dram_ap(xw.name, step * (t_rows * gh), [(b_rows * gh, batch), (1, gh)])
        )
        _recurrent(cg, acc, cg.ap(state_t), r_t, 0, gh if op != "GRU" else 2 * h)
        live = gh if op != "GRU" else 2 * h
        cg.tensor_tensor(
            _cols(cg, gates, 0, live), _cols(cg, gates, 0, live), _cols(cg, acc, 0, live), AluOp.ADD
        )
        if op == "LSTM":
            _lstm_cell(cg, gates, cell, state, work, h, acts)
        elif op == "GRU":
            tiles = (gates, state, state_t, work, acc, flip, r_t, rb_tile, gated_t)
            _gru_cell(cg, node, tiles, h, acts)
        else:
            cg.activation(cg.ap(state), _cols(cg, gates, 0, h), acts[0])
        if y_loc is not None:
            _store_step(cg, y_loc, state, dims, d, step)
        _transpose(cg, flip, state, state_t, batch, h)
    # 4. Final states.
    for index, tile in ((1, state), (2, cell)):
        out = node.outputs[index] if len(node.outputs) > index else ""
        if out and tile is not None:
            if dims.layout == 0:
                dst = cg.dram_ap(cg.dram(out).name, Affine(d * batch * h), [(h, batch), (1, h)])
            else:
                dst = cg.dram_ap(cg.dram(out).name, Affine(d * h), [(dims.dirs * h, batch), (1, h)])
            cg.dma(dst, cg.ap(tile))


def _cols(cg: BirCodeGen, tile, start: int, count: int):
    return cg.ap(tile, [(1, count)], start)


def _recurrent(cg, acc, stationary, r_t, start: int, count: int) -> None:
    """acc[:, start:start+count] = h·R[start:start+count]ᵀ (`stationary` is hᵀ), one matmul
    per PSUM bank the columns touch."""
    first, end = start, start + count
    while first < end:
        width = min(MATMUL_MAX_MOVING_FREE - first % MATMUL_MAX_MOVING_FREE, end - first)
        cg.matmul(
            _cols(cg, acc, first, width), stationary, _cols(cg, r_t, first, width), accumulate=False
        )
        first += width


def _lstm_cell(cg, gates, cell, state, work, h: int, acts: list[ActFunc]) -> None:
    f_act, g_act, h_act = acts
    i, o, f, c = (_cols(cg, gates, k * h, h) for k in range(4))
    for gate in (i, o, f):
        cg.activation(gate, gate, f_act)
    cg.activation(c, c, g_act)
    tmp = _cols(cg, work, 0, h)
    cg.tensor_tensor(tmp, i, c, AluOp.MULTIPLY)
    cg.tensor_tensor(cg.ap(cell), cg.ap(cell), f, AluOp.MULTIPLY)
    cg.tensor_tensor(cg.ap(cell), cg.ap(cell), tmp, AluOp.ADD)
    cg.activation(tmp, cg.ap(cell), h_act)
    cg.tensor_tensor(cg.ap(state), o, tmp, AluOp.MULTIPLY)


def _gru_cell(cg, node, tiles, h: int, acts: list[ActFunc]) -> None:
    gates, state, state_t, work, acc, flip, r_t, rb_tile, gated_t = tiles
    f_act, g_act = acts
    z, r, cand = (_cols(cg, gates, k * h, h) for k in range(3))
    cg.activation(z, z, f_act)
    cg.activation(r, r, f_act)
    recur = _cols(cg, acc, 2 * h, h)
    tmp = _cols(cg, work, 0, h)
    if node.attr("linear_before_reset", 0):
        _recurrent(cg, acc, cg.ap(state_t), r_t, 2 * h, h)
        cg.tensor_tensor(tmp, recur, cg.ap(rb_tile), AluOp.ADD)
        cg.tensor_tensor(tmp, tmp, r, AluOp.MULTIPLY)
        cg.tensor_tensor(cand, cand, tmp, AluOp.ADD)
    else:  # (r⊙h)·R_hᵀ: r⊙h transposed on the PE array, then a second recurrent matmul
        cg.tensor_tensor(tmp, r, cg.ap(state), AluOp.MULTIPLY)
        _transpose_ap(cg, flip, tmp, cg.ap(gated_t), state.shape[0], h)
        _recurrent(cg, acc, cg.ap(gated_t), r_t, 2 * h, h)
        cg.tensor_tensor(cand, cand, recur, AluOp.ADD)
    cg.activation(cand, cand, g_act)
    cg.tensor_tensor(tmp, cg.ap(state), cand, AluOp.SUBTRACT)  # h − h̃
    cg.tensor_tensor(tmp, tmp, z, AluOp.MULTIPLY)
    cg.tensor_tensor(cg.ap(state), cand, tmp, AluOp.ADD)


def _transpose_ap(cg, flip, src, dst, batch: int, h: int) -> None:
    """dst[H, batch] = srcᵀ for src [batch, H], through the PE array and PSUM."""
    flipped = cg.ap(flip, [(1, batch)], partitions=h)
    cg.matmul(flipped, src, cg.identity(batch), accumulate=False)
    cg.tensor_copy(dst, flipped)


def _transpose(cg, flip, state, state_t, batch: int, h: int) -> None:
    _transpose_ap(cg, flip, cg.ap(state), cg.ap(state_t), batch, h)


def _store_step(cg, y_loc: str, state, dims: _Dims, d: int, step: Affine) -> None:
    """Y[t, d, b, :] (layout 0) or Y[b, t, d, :] (layout 1) = h[b, :]."""
    h, batch = dims.hidden, dims.batch
    if dims.layout == 0:
        offset = step * (dims.dirs * batch * h) + d * batch * h
        pattern = [(h, batch), (1, h)]
    else:
        offset = step * (dims.dirs * h) + d * h
        pattern = [(dims.seq * dims.dirs * h, batch), (1, h)]
    cg.dma(cg.dram_ap(y_loc, offset, pattern), cg.ap(state))
