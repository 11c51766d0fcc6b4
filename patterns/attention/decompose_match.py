"""DecomposeAttention's own matcher: rooted at the second dot, it explores the softmax and the
mask back to the first dot (docs/attention_kernel.md#blocks-that-are-not-raised).

In: a way to find a tensor's producer (the graph, or the nodes a decomposition has staged),
the second dot's name, and what the block must contain (a mask, a scale). Out: `explore`, an
`Explored` naming the first dot and what was found between, or one of the reference pass's
diagnostics:

- "Failed to match on native softmax!" — no softmax (an ONNX Softmax, or its stable spelling
  Exp(S − ReduceMax) / ReduceSum) feeds the second dot, through an optional NaN guard;
- "Expected masked dot while exporing attention softmax!" (sic) — the scores do not come from
  a MatMul through score ops;
- "Expected to find masking select while exploring attention softmax" — a mask was expected
  and no select (Where) or mask Add lies between the dots;
- "Expected to find divide while exploring attention softmax!" — a scale was expected and no
  scalar Mul/Div lies between the dots.

DecomposeAttention runs it on every expansion it stages, before committing: an expansion that
does not read back as the block it replaces is not written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

NO_SOFTMAX = "Failed to match on native softmax!"
NO_DOT = "Expected masked dot while exporing attention softmax!"  # the reference's spelling
NO_SELECT = "Expected to find masking select while exploring attention softmax"
NO_DIVIDE = "Expected to find divide while exploring attention softmax!"

# producer(tensor) -> (node name, op type, inputs) or None; scalar(tensor) -> is a 1-value const
Producer = Callable[[str], tuple[str, str, list[str]] | None]
_SCORE_OPS = ("Mul", "Div", "Add", "Where", "Tanh", "Cast")


@dataclass(frozen=True, slots=True)
class Explored:
    dot1: str
    softmax: str  # "native" (an ONNX Softmax) or "stable" (Exp(S − max) / Σ)
    select: bool
    scale: bool
    guard: bool


def explore(
    producer: Producer,
    scalar: Callable[[str], bool],
    dot2: tuple[str, str, list[str]],
    masked: bool,
    scaled: bool,
) -> Explored | str:
    probs = dot2[2][0]
    found = producer(probs)
    guard = False
    if found and found[1] == "Where":  # Where(IsNaN(P), 0, P)
        cond = producer(found[2][0])
        if cond and cond[1] == "IsNaN":
            guard, found = True, producer(found[2][2])
    while found and found[1] == "Cast":
        found = producer(found[2][0])
    scores, kind = _softmax_input(producer, found)
    if scores is None:
        return NO_SOFTMAX
    select = scale = False
    current = producer(scores)
    for _ in range(24):
        if current is None:
            return NO_DOT
        name, op, inputs = current
        if op == "MatMul":
            if masked and not select:
                return NO_SELECT
            if scaled and not scale:
                return NO_DIVIDE
            return Explored(name, kind, select, scale, guard)
        if op not in _SCORE_OPS:
            return NO_DOT
        if op == "Where" or (op == "Add" and not any(scalar(t) for t in inputs)):
            select = True
        if op in ("Mul", "Div") and any(scalar(t) for t in inputs[1:2]):
            scale = True
        if op == "Where":  # Where(cond, fill, S) or Where(cond, S, fill)
            scores_in = inputs[2] if scalar(inputs[1]) else inputs[1]
        elif op in ("Add", "Mul") and scalar(inputs[0]):
            scores_in = inputs[1]
        else:
            scores_in = inputs[0]
        current = producer(scores_in)
    return NO_DOT


def _softmax_input(producer: Producer, node) -> tuple[str | None, str]:
    """The scores a softmax reads: a Softmax op, or Div(Exp(S − max), ReduceSum(…))."""
    if node is None:
        return None, ""
    _, op, inputs = node
    if op == "Softmax":
        return inputs[0], "native"
    if op != "Div":
        return None, ""
    exp = producer(inputs[0])
    if exp is None or exp[1] != "Exp":
        return None, ""
    shift = producer(exp[2][0])
    if shift is None or shift[1] != "Sub":
        return None, ""
    rowmax = producer(shift[2][1])
    while rowmax and rowmax[1] == "Max":  # the floor at the lowest finite value
        rowmax = producer(rowmax[2][0])
    if rowmax is None or rowmax[1] != "ReduceMax" or rowmax[2][0] != shift[2][0]:
        return None, ""
    return shift[2][0], "stable"
