"""The raised attention kernel as the oracle computes it: its online softmax, tile by tile.

In: the ONNX nodes of an attention block (a matched MatMul → score steps → Softmax → MatMul, or
the function body the ONNX standard gives `Attention`), the kernel's key tile and storage dtype
(`OnlineSoftmax` in the cast plan). Out: the block's Softmax and PV MatMul replaced by onnxruntime
ops that compute what the kernel computes (kernels/attention/kernel.py), in its order and with
its roundings, and optionally, per output element, how far the machine's value may lie from it
(docs/validation.md#online-softmax).

The kernel, per row of scores S (fp32) and key tile j of `key_tile` keys:

    m_j = max(m_{j-1}, rowmax S_j)          (m_0 = max(rowmax S_0, −FLT_MAX))
    c_j = exp(m_{j-1} − m_j)
    P_j = round(exp(S_j − m_j))              rounded to the storage dtype
    l_j = l_{j-1}·c_j + Σ P_j
    A_j = A_{j-1}·c_j + P_j · V_j            V rounded to the storage dtype, PSUM in fp32
    O   = round(A / l)                       l raised to FLT_MIN first under a NaN guard

The oracle computes exactly these steps on onnxruntime's own scores (the block's ops up to the
Softmax, on q and kᵀ rounded as the kernel rounds them). Key tiles the causal kernel never
computes are computed here: every score in them is −inf, so they change none of m, l and A (max
with −inf, exp(0) = 1, P = 0). So P is rounded at the same value as on the device, whose
roundings no cast around the ONNX Softmax can repeat.

What still differs is fp32 arithmetic in another order: the scores' sums (the QK product's
summation allowance, carried through the score steps, plus four fp32 steps of each step's
value), exp (onnxruntime's and the machine's differ by under two fp32 ULPs, measured; 2^-20 is
allowed), the sums of each tile (2·(λ·√key_tile + 1)·u), and the fp32 updates (2^-22 each). With
δ the largest score error of a row (over the keys within 1 of its maximum: no other can be the
maximum), the fp32 exp argument S − m is off by at most 2δ, so P before its rounding lies within
r = d·(1 + d)·P of the oracle's (d = 2δ + 2^-20, ≥ e^d − 1), and the machine's rounded P lies
between round(P(1 − r)) and round(P(1 + r)) (rounding is monotone): the deviation `dev` of
each rounded P is bounded exactly, a flip at a half-way point included. A weight w = C·P (C the
product of the rescales, off by at most γ = 2δ + T·(2^-20 + 2^-22) relative) then moves O by
Σ δw·(v − O)/l, so

    allowance(O) = (Σ_j C_j·E_j·|V_j| + |O|·Σ_j C_j·ΣE_j) / l,   E_j = dev_j + (γ + s)·P_j

with s the tiles' summation allowance, accumulated with the same rescales as A and l; the
output's own rounding to the storage dtype is bounded as P's is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx2bir.frontend.attention_block import Block

FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
EXP_REACH = 2.0**-20  # onnxruntime's Exp and numpy's: under 2 fp32 ULPs apart (measured)
FP32_STEP = 2.0**-22  # one fp32 update (a multiply or add) done on values slightly apart
SCORE_STEP = 2.0**-21  # a score step's fp32 rounding, or a scale folded in another order
RELEVANT = 1.0  # keys further below their row's maximum cannot be it


# --- the nodes ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    """What the kernel does that the block's ONNX ops do not say: its key tile, the dtype it
    stores P and O in, the head dim (the QK product's length) and the key count."""

    key_tile: int
    storage: str
    head_dim: int
    seq_k: int


def online_nodes(
    block: Block,
    kernel: Kernel,
    opset: int,
    allowance: str | None,
    flips: tuple[str, ...] = (),
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing `block.pv`'s output as the kernel does (module docstring), and, with
    `allowance`, that tensor: the most the machine's value may lie from it. `flips`: the
    operands (q, kᵀ or v, unrounded) the machine never stores, so the oracle cannot start from
    its values: their roundings may flip where fp32 differences reach a half-way point, and
    the allowance takes each such flip's effect on the scores or on O."""
    from onnx2bir.runtime.oracle import emulating
    from onnx2bir.runtime.oracle.emulating import (
        ACCUMULATION_LAMBDA,
        FORMATS,
        FP32_UNIT_ROUNDOFF,
        _Builder,
        accumulation_allowance_nodes,
        rounding_nodes,
    )

    result = block.pv.output[0]
    b = _Builder(f"{result}/online")
    scores, values = block.softmax.input[0], block.pv.input[1]

    def rounded(x: str) -> str:
        out = b.name("round")
        new, consts = rounding_nodes(x, out, kernel.storage, opset, out)
        b.nodes.extend(new)
        b.consts.extend(consts)
        return out

    def reduce(op: str, x: str) -> str:
        return _reduce(b, op, x, opset)

    if block.view is not None:  # a row-keeping view: the softmax commutes with it
        scores = b.op("Reshape", scores, block.view.input[1])
    tiles = [
        (k0, min(kernel.seq_k, k0 + kernel.key_tile))
        for k0 in range(0, kernel.seq_k, kernel.key_tile)
    ]
    reach = alpha = None
    magnitude_v = None

    def unrounded(tensor: str) -> str | None:
        plain = tensor.split("::")[0]
        return plain if plain in flips else None

    value_steps = None
    if allowance:
        score_flips = []
        for position in (0, 1):
            operand = unrounded(block.qk.input[position])
            if operand:
                name = b.name("qk_flips")
                new, consts = emulating.flip_allowance_nodes(
                    block.qk, position, operand, kernel.storage, name
                )
                b.nodes.extend(new)
                b.consts.extend(consts)
                score_flips.append(name)
        operand = unrounded(block.pv.input[1])
        if operand:
            value_steps = emulating.flip_steps(b, operand, FORMATS[kernel.storage])
        delta = _score_error(
            b, block, scores, accumulation_allowance_nodes, kernel.head_dim, opset, score_flips
        )
        d = b.op("Add", b.op("Mul", delta, b.const(2.0)), b.const(EXP_REACH))
        reach = b.op("Mul", d, b.op("Add", d, b.const(1.0)))
        terms = kernel.key_tile
        summation = 2.0 * (ACCUMULATION_LAMBDA * math.sqrt(terms) + 1.0) * FP32_UNIT_ROUNDOFF
        gamma = len(tiles) * (EXP_REACH + FP32_STEP) + summation
        alpha = b.op("Add", b.op("Mul", delta, b.const(2.0)), b.const(gamma))
        magnitude_v = b.op("Abs", values)
    m = total = acc = spread = spread_sum = None
    for j, (k0, k1) in enumerate(tiles):
        keys = b.indices(k0, k1)
        s = b.op("Gather", scores, keys, axis=-1)
        v = b.op("Gather", values, keys, axis=-2)
        top = reduce("ReduceMax", s)
        if j == 0:
            m = b.op("Max", top, b.const(-FLT_MAX))
            c = None
        else:
            new = b.op("Max", top, m)
            c = b.op("Exp", b.op("Sub", m, new))
            m = new
        p_exact = b.op("Exp", b.op("Sub", s, m))
        p = rounded(p_exact)
        tile_sum = reduce("ReduceSum", p)
        product = b.op("MatMul", p, v)
        total = tile_sum if c is None else b.op("Add", b.op("Mul", total, c), tile_sum)
        acc = product if c is None else b.op("Add", b.op("Mul", acc, c), product)
        if allowance:
            low = rounded(b.op("Mul", p_exact, b.op("Sub", b.const(1.0), reach)))
            high = rounded(b.op("Mul", p_exact, b.op("Add", b.const(1.0), reach)))
            dev = b.op("Max", b.op("Sub", high, p), b.op("Sub", p, low))
            e = b.op("Add", dev, b.op("Mul", p, alpha))
            e_v = b.op("MatMul", e, b.op("Gather", magnitude_v, keys, axis=-2))
            if value_steps is not None:  # a flip of v moves O by P·step / l
                e_v = b.op(
                    "Add", e_v, b.op("MatMul", p, b.op("Gather", value_steps, keys, axis=-2))
                )
            e_sum = reduce("ReduceSum", e)
            if c is None:
                spread, spread_sum = e_v, e_sum
            else:
                spread = b.op("Add", b.op("Mul", spread, c), e_v)
                spread_sum = b.op("Add", b.op("Mul", spread_sum, c), e_sum)
    if block.guard:
        total = b.op("Max", total, b.const(FLT_MIN))
    exact = b.op("Div", acc, total)
    out = rounded(exact)
    b.nodes.append(helper.make_node("Identity", [out], [result], name=f"{result}/online"))
    if allowance:
        size = b.op("Abs", exact)
        moved = b.op("Div", b.op("Add", spread, b.op("Mul", size, spread_sum)), total)
        moved = b.op(
            "Add",
            b.op("Mul", moved, b.const(1.0 + 2.0**-10)),
            b.op("Mul", size, b.const(FP32_STEP)),
        )
        low, high = rounded(b.op("Sub", exact, moved)), rounded(b.op("Add", exact, moved))
        bound = b.op("Max", b.op("Sub", high, out), b.op("Sub", out, low))
        b.nodes.append(helper.make_node("Identity", [bound], [allowance], name=allowance))
    return b.nodes, b.consts


def _reduce(b, op: str, x: str, opset: int) -> str:
    """`op` (ReduceMax or ReduceSum) over the last axis, keeping it, in the opset's form."""
    if (op == "ReduceSum" and opset >= 13) or opset >= 18:
        return b.op(op, x, b.array(np.array([-1], np.int64)), keepdims=1)
    return b.op(op, x, axes=[-1], keepdims=1)


def _score_error(
    b,
    block: Block,
    scores: str,
    accumulation_allowance_nodes,
    head_dim: int,
    opset: int,
    flips: list[str],
) -> str:
    """Per row, the most a score the maximum depends on may lie from the oracle's (module
    docstring): the QK product's summation allowance carried through the score steps (scaled
    by a Mul or Div, zero where a Where fills), plus SCORE_STEP of each step's value, plus the
    bounds `flips` of what flips of an unstored q or kᵀ move the product by."""
    start = b.name("qk_error")
    new, consts = accumulation_allowance_nodes(block.qk, head_dim, start)
    b.nodes.extend(new)
    b.consts.extend(consts)
    error = start
    for bound in flips:  # what flips of an unstored q or kᵀ can move the scores by
        error = b.op("Add", error, bound)
    for node, at in block.chain:
        op, value = node.op_type, node.output[0]
        if op in ("Mul", "Div"):
            error = b.op(op, error, b.op("Abs", node.input[1 - at]))
        elif op == "Where":
            zero = b.const(0.0)
            pair = (error, zero) if at == 1 else (zero, error)
            error = b.op("Where", node.input[0], *pair)
        elif op == "Reshape":
            error = b.op("Reshape", error, node.input[1])
        elif op == "Cast":
            error = b.op("Cast", error, to=TensorProto.FLOAT)
        error = b.op("Add", error, b.op("Mul", b.op("Abs", value), b.const(SCORE_STEP)))
    if block.view is not None:
        error = b.op("Reshape", error, block.view.input[1])
    finite = b.op("Not", b.is_special(scores))
    error = b.op("Where", finite, b.op("Min", error, b.const(1.0)), b.const(0.0))
    top = _reduce(b, "ReduceMax", scores, opset)
    near = b.op("Not", b.op("Less", scores, b.op("Sub", top, b.const(RELEVANT))))
    return _reduce(b, "ReduceMax", b.op("Where", near, error, b.const(0.0)), opset)
