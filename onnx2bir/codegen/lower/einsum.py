"""Generic lowering of Einsum, every equation, by one decomposition: permute, matmul, permute.

Operands are contracted left to right, two at a time (one operand is paired with a scalar 1).
For a pair A, B and the letters the result keeps (the output's, or those a later operand still
needs), each letter is one of:
- batch: in A, B and the result;   m: in A and the result only;   n: in B and the result only;
- k: in no result: summed. A letter of one operand only is summed as well, the other operand
  being read with stride 0 along it (Σ_k a·b over a letter b lacks is (Σ_k a)·b).
A is copied by strided DMA into a contiguous scratch [batch, m, k], B into [batch, k, n]; each
batch index is one tiled PE matmul (`emit_gemm`) into [batch, m, n], which a last strided copy
permutes into the result's letter order. Ellipses become letters of their own (broadcast
right-aligned, size-1 dims read with stride 0); the implicit output is the letters that appear
once, in alphabetical order, after the ellipsis. A letter repeated inside one operand (a
diagonal) is refused.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.data import copy_strided
from onnx2bir.codegen.lower.matmul import emit_gemm
from onnx2bir.codegen.matmul_tiles import MatmulTiles, MatrixView
from onnx2bir.codegen.tiling import Affine, contiguous_strides, tiles
from onnx2bir.graph import Node

_ELLIPSIS_LETTERS = "0123456789"


def parse_equation(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Operand letter strings and the output's, ellipses replaced by digit letters."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"{len(terms)} operand terms for {len(ranks)} inputs")
    width = max(
        (rank - (len(term) - 3) for term, rank in zip(terms, ranks, strict=True) if "..." in term),
        default=0,
    )
    ellipsis = _ELLIPSIS_LETTERS[10 - width :] if width else ""

    def expand(term: str, rank: int | None) -> str:
        if "..." not in term:
            return term
        count = width if rank is None else rank - (len(term) - 3)
        return term.replace("...", ellipsis[width - count :])

    letters = [expand(term, rank) for term, rank in zip(terms, ranks, strict=True)]
    for term, rank in zip(letters, ranks, strict=True):
        if len(term) != rank:
            raise ValueError(f"term {term!r} does not match an input of rank {rank}")
        if len(set(term)) != len(term):
            raise ValueError(f"term {term!r} repeats a letter (a diagonal)")
    if arrow:
        output = expand(rhs, None)
    else:
        counts = {c: sum(t.count(c) for t in letters) for c in set("".join(letters))}
        output = ellipsis + "".join(sorted(c for c, n in counts.items() if n == 1 and c.isalpha()))
    return letters, output


class _Operand:
    """A DRAM tensor seen through its letters: size and element stride per letter."""

    def __init__(self, loc: str, letters: str, shape: tuple[int, ...]) -> None:
        self.loc, self.letters = loc, letters
        strides = contiguous_strides(shape)
        self.size = dict(zip(letters, shape, strict=True))
        walk = zip(letters, shape, strides, strict=True)
        self.stride = {c: (0 if s == 1 else st) for c, s, st in walk}

    def strides(self, letters: str) -> tuple[int, ...]:
        return tuple(self.stride.get(c, 0) for c in letters)


def lower_einsum(cg: BirCodeGen, node: Node) -> None:
    names = [name for name in node.inputs if name]
    out = node.outputs[0]
    shapes = [tuple(cg.graph.tensors[name].shape) for name in names]
    try:
        letters, output = parse_equation(str(node.attrs["equation"]), [len(s) for s in shapes])
    except ValueError as exc:
        raise cg.fail(f"Einsum {node['attrs']['equation']!r}: {exc}") from exc
    sizes: dict[str, int] = {}
    for term, shape in zip(letters, shapes, strict=True):
        for c, size in zip(term, shape, strict=True):
            sizes[c] = max(sizes.get(c, 1), size)
    out_info = cg.graph.tensors[out]
    if math.prod(out_info.shape) == 0:
        return
    mm = MatmulTiles(cg)
    operands = [
        _Operand(cg.dram(name).name, term, shape)
        for name, term, shape in zip(names, letters, shapes, strict=True)
    ]
    if len(operands) == 1:
        one = cg.add_dram_const(f"{cg.origin.node}/one", np.ones(1, np.float32))
        operands.append(_Operand(one.name, "", ()))
    left = operands[0]
    for index, right in enumerate(operands[1:], start=1):
        later = "".join(op.letters for op in operands[index + 1 :])
        last = index == len(operands) - 1
        keep = (
            output
            if last
            else "".join(
                dict.fromkeys(c for c in left.letters + right.letters if c in output + later)
            )
        )
        target = cg.dram(out).name if last else None
        left = _contract(cg, mm, left, right, keep, sizes, target)


def _contract(
    cg: BirCodeGen,
    mm: MatmulTiles,
    a: _Operand,
    b: _Operand,
    keep: str,
    sizes: dict[str, int],
    target: str | None,
) -> _Operand:
    batch = "".join(c for c in keep if c in a.letters and c in b.letters)
    m = "".join(c for c in keep if c in a.letters and c not in b.letters)
    n = "".join(c for c in keep if c in b.letters and c not in a.letters)
    k = "".join(dict.fromkeys(c for c in a.letters + b.letters if c not in keep))

    def extent(group: str) -> int:
        return math.prod(sizes[c] for c in group)

    nb, nm, nn, nk = extent(batch), extent(m), extent(n), extent(k)
    a_shape = tuple(sizes[c] for c in batch + m + k)
    b_shape = tuple(sizes[c] for c in batch + k + n)
    a_tmp = cg.dram_scratch("lhs", a_shape or (1,), Dtype.FP32)
    b_tmp = cg.dram_scratch("rhs", b_shape or (1,), Dtype.FP32)
    copy_strided(
        cg,
        a_tmp.name,
        Affine(),
        a.loc,
        Affine(),
        a_shape,
        contiguous_strides(a_shape),
        a.strides(batch + m + k),
    )
    copy_strided(
        cg,
        b_tmp.name,
        Affine(),
        b.loc,
        Affine(),
        b_shape,
        contiguous_strides(b_shape),
        b.strides(batch + k + n),
    )
    product = batch + m + n
    y_shape = tuple(sizes[c] for c in product)
    direct = target is not None and product == keep
    y_loc = target if direct else cg.dram_scratch("product", y_shape or (1,), Dtype.FP32).name
    for t in tiles(cg, nb, 1, "b"):
        emit_gemm(
            cg,
            MatrixView(a_tmp.name, t.start * (nm * nk), nm, nk, nk, 1),
            MatrixView(b_tmp.name, t.start * (nk * nn), nk, nn, nn, 1),
            MatrixView(y_loc, t.start * (nm * nn), nm, nn, nn, 1),
            mm,
        )
    result = _Operand(y_loc, product, y_shape)
    if direct or target is None:
        return result
    out_shape = tuple(sizes[c] for c in keep)
    copy_strided(
        cg,
        target,
        Affine(),
        y_loc,
        Affine(),
        out_shape,
        contiguous_strides(out_shape),
        result.strides(keep),
    )
    return _Operand(target, keep, out_shape)
