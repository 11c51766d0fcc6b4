"""estimate_instances: how many instruction instances running a BIR function executes.

In: a `bir.Function`. Out: an `InstanceEstimate`: the static count (instructions in the
program text), the dynamic count (each loop body counted once per trip, loops nested
multiplicatively), both per engine, and whether the dynamic count is exact. The reference code
generator computes the same figure after lowering each function (`num_dynamic_instances`).

A runtime loop (DynamicFor, DoWhile; docs/loops.md) has no trip count before it runs: its body
is counted once, which makes the dynamic count a lower bound, and `exact` is then False. To
count a run exactly, use the interpreter's observer (`runtime/machine/progress.py` counts that way).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from onnx2bir.bir.ir import BasicBlock, DoWhile, DynamicLoop, Function, Loop


@dataclass(frozen=True, slots=True)
class InstanceEstimate:
    static: int
    dynamic: int
    exact: bool
    static_per_engine: dict[str, int] = field(default_factory=dict)
    dynamic_per_engine: dict[str, int] = field(default_factory=dict)
    runtime_loops: int = 0  # loops whose trips are counted once


def estimate_instances(function: Function) -> InstanceEstimate:
    static: Counter = Counter()
    dynamic: Counter = Counter()
    runtime = _walk(function.entry, 1, static, dynamic)
    return InstanceEstimate(
        static=sum(static.values()),
        dynamic=sum(dynamic.values()),
        exact=runtime == 0,
        static_per_engine=dict(sorted(static.items())),
        dynamic_per_engine=dict(sorted(dynamic.items())),
        runtime_loops=runtime,
    )


def _walk(block: BasicBlock, repeat: int, static: Counter, dynamic: Counter) -> int:
    """Count `block` run `repeat` times; returns the number of runtime loops met."""
    runtime = 0
    for item in block.items:
        if isinstance(item, DynamicLoop | DoWhile):
            runtime += 1 + _walk(item.body, repeat, static, dynamic)
        elif isinstance(item, Loop):
            runtime += _walk(item.body, repeat * item.trip_count, static, dynamic)
        else:
            engine = str(item.engine)
            static[engine] += 1
            dynamic[engine] += repeat
    return runtime
