"""Predicated instructions: what a `Predicate` cuts and the loop values worth checking.

An instruction with a predicate runs on the leading-dimension indices below its bound, in every
operand (partitions on SB/PSUM, the outermost free dim on DRAM). `narrow` gives the instruction
the bound leaves (the machine runs it); `predicate_cases` gives the loop values at which the
verifier checks the operand spans: each predicate axis at its first and last value and where
the bound crosses the leading extent or zero, so a span that is only legal because of the
predicate is checked at the trips that matter (docs/predicates.md).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

from onnx2bir.bir.ir import AccessPattern, Instruction


def leading_extent(ins: Instruction) -> int:
    """The longest leading dimension among the operands (what a predicate bound cuts)."""
    return max(_leading(ap) for ap, _ in ins.accesses())


def _leading(ap: AccessPattern) -> int:
    if ap.num_partitions:
        return ap.num_partitions
    return ap.pattern[0][1] if ap.pattern else 1


def narrow(ins: Instruction, bound: int) -> Instruction:
    """The instruction on the leading-dim indices below `bound` of every operand."""

    def cut(ap: AccessPattern) -> AccessPattern:
        if ap.num_partitions:
            return dataclasses.replace(ap, num_partitions=min(ap.num_partitions, bound))
        if not ap.pattern:
            return ap
        (stride, count), *rest = ap.pattern
        return dataclasses.replace(ap, pattern=((stride, min(count, bound)), *rest))

    return dataclasses.replace(
        ins,
        dst=None if ins.dst is None else cut(ins.dst),
        srcs={role: cut(ap) for role, ap in ins.srcs.items()},
        predicate=None,
    )


def predicate_cases(
    ins: Instruction, ranges: dict[str, tuple[int, int]]
) -> Iterator[tuple[Instruction, dict[str, tuple[int, int]]]]:
    """(the instruction as it runs, axis ranges with the predicate's axes fixed) per case."""
    predicate = ins.predicate
    assert predicate is not None
    axes = [axis for axis, _ in predicate.terms]
    lead = leading_extent(ins)
    choices = []
    for axis, coef in predicate.terms:
        first, last = ranges[axis]
        values = {first, last}
        if len(axes) == 1 and coef:
            for target in (lead, 0):
                crossing = (target - predicate.const) / coef
                for value in (int(crossing // 1), int(-(-crossing // 1))):
                    if first <= value <= last:
                        values.add(value)
        choices.append(sorted(values))
    for assignment in itertools.product(*choices):
        values = dict(zip(axes, assignment, strict=True))
        bound = predicate.bound(values)
        if bound <= 0:
            continue
        fixed = dict(ranges)
        fixed.update({axis: (value, value) for axis, value in values.items()})
        yield (narrow(ins, bound) if bound < lead else ins), fixed
