"""An attention block read off ONNX nodes, for the oracle that computes the raised attention
kernel as it computes (runtime/oracle/online_softmax.py, docs/validation.md#online-softmax).

In: a list of ONNX nodes (a model's, or the function body the ONNX standard gives
`Attention`) and the name of a Softmax among them. Out: a `Block` — the QK MatMul that makes the
scores, the score steps between it and the Softmax, the ops between the Softmax and the PV
MatMul (a row-keeping Reshape, Casts, Dropout, a NaN guard) — or the reason the block is not
one the oracle can compute key tile by key tile. The compile's cast plan and the oracle read
the same nodes with it, so they agree on which kernels are emulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

MIN_OPSET = 11  # the emulation gathers key tiles along a negative axis

_SCORE_UNARY = ("Cast", "Identity", "Reshape")
_SCORE_BINARY = ("Mul", "Div", "Add", "Sub", "Where")
_TAIL_UNARY = ("Cast", "Identity", "Dropout", "Reshape")
_SEARCH_DEPTH = 12


@dataclass
class Block:
    """An attention block as ONNX nodes: `qk` makes the scores, `chain` the score steps from
    its output to the softmax's input (each with the index of its scores input), `tail` the
    nodes from the softmax's output to `pv`'s probabilities (`view` a Reshape among them,
    `guard` a Where that zeroes fully masked rows), `side` the IsNaN of a NaN guard."""

    qk: onnx.NodeProto
    chain: list[tuple[onnx.NodeProto, int]]
    softmax: onnx.NodeProto
    pv: onnx.NodeProto
    tail: list[onnx.NodeProto] = field(default_factory=list)
    side: list[onnx.NodeProto] = field(default_factory=list)
    view: onnx.NodeProto | None = None
    guard: bool = False

    @property
    def replaced(self) -> list[onnx.NodeProto]:
        return [self.softmax, *self.tail, *self.side, self.pv]


class _Index:
    def __init__(self, nodes: list[onnx.NodeProto]):
        self.producer = {t: n for n in nodes for t in n.output if t}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            for t in n.input:
                if t:
                    self.readers.setdefault(t, []).append(n)


def _reaches_matmul(index: _Index, tensor: str, depth: int) -> bool:
    node = index.producer.get(tensor)
    if node is None or depth == 0:
        return False
    if node.op_type == "MatMul":
        return True
    if node.op_type in _SCORE_UNARY:
        return _reaches_matmul(index, node.input[0], depth - 1)
    if node.op_type in _SCORE_BINARY:
        return any(_reaches_matmul(index, t, depth - 1) for t in node.input if t)
    return False


def read_block(nodes: list[onnx.NodeProto], softmax: str) -> tuple[Block | None, str | None]:
    """The block around Softmax node `softmax` among `nodes`, or (None, why the oracle cannot
    compute it as the kernel does)."""
    index = _Index(nodes)
    found = next((n for n in nodes if n.name == softmax and n.op_type == "Softmax"), None)
    if found is None:
        return None, f"no Softmax {softmax!r}"
    chain: list[tuple[onnx.NodeProto, int]] = []
    tensor = found.input[0]
    while True:
        node = index.producer.get(tensor)
        if node is None:
            return None, "no MatMul makes the scores"
        if node.op_type == "MatMul":
            qk = node
            break
        if node.op_type in _SCORE_UNARY:
            at = 0
        elif node.op_type in _SCORE_BINARY:
            sides = [
                i
                for i, t in enumerate(node.input)
                if t and _reaches_matmul(index, t, _SEARCH_DEPTH - len(chain))
            ]
            if len(sides) != 1:
                return None, f"{node.op_type} {node.name!r} mixes two products into the scores"
            at = sides[0]
            if node.op_type == "Div" and at != 0:
                return None, f"Div {node.name!r} divides by the scores"
            if node.op_type == "Where" and at == 0:
                return None, f"Where {node.name!r} selects by the scores"
        else:
            return None, f"{node.op_type} {node.name!r} between the QK product and the softmax"
        if len(chain) >= _SEARCH_DEPTH:
            return None, "too many score steps"
        chain.append((node, at))
        tensor = node.input[at]
    chain.reverse()
    block = Block(qk, chain, found, found)  # pv found below
    tensor = found.output[0]
    while True:
        readers = index.readers.get(tensor, [])
        pv = [n for n in readers if n.op_type == "MatMul"]
        if pv and len(readers) == 1:
            if pv[0].input[0] != tensor:
                return None, f"MatMul {pv[0].name!r} takes the probabilities as its right operand"
            block.pv = pv[0]
            return block, None
        isnan = [n for n in readers if n.op_type == "IsNaN"]
        # A CastLike reads only the type of its second input (the body's zero fill)
        typed = [n for n in readers if n.op_type == "CastLike" and n.input[0] != tensor]
        rest = [n for n in readers if n.op_type != "IsNaN" and n not in typed]
        if len(rest) != 1:
            return None, "the probabilities are read outside the block"
        node = rest[0]
        if node.op_type == "Where":
            guard = _guard(index, node, tensor, isnan)
            if guard is not None:
                return None, guard
            block.guard = True
            block.side.extend(isnan)
            block.side.extend(typed)
        elif typed:
            return None, "the probabilities' type is read outside the block"
        elif node.op_type in _TAIL_UNARY and not isnan:
            if node.op_type == "Reshape":
                if block.view is not None:
                    return None, "two Reshapes of the probabilities"
                block.view = node
        else:
            return None, f"{node.op_type} {node.name!r} between the softmax and the PV product"
        block.tail.append(node)
        tensor = node.output[0]


def _guard(index: _Index, where: onnx.NodeProto, tensor: str, isnan: list) -> str | None:
    """None when Where `where` zeroes rows the kernel's guard zeroes: Where(IsNaN(P), 0, P)
    (a fully masked row's NaN) or the ONNX body's Where(rowmax(bias) = −inf, 0, P)."""
    if len(where.input) != 3 or where.input[2] != tensor:
        return f"Where {where.name!r} does not keep the probabilities where its condition is false"
    cond = index.producer.get(where.input[0])
    if cond is None:
        return f"Where {where.name!r} with a condition of its own"
    if cond.op_type == "IsNaN" and cond.input[0] == tensor and isnan == [cond]:
        return None
    if not isnan and cond.op_type == "Equal":
        sources = [index.producer.get(t) for t in cond.input]
        if any(s is not None and s.op_type == "ReduceMax" for s in sources):
            return None
    return f"Where {where.name!r} is not a NaN guard"
