"""The engine timeline the device-time simulation implies, for the report page.

In: a BIR module. Out: `Timeline`, the busy intervals of each engine (DMA: each queue) in
seconds, from the simulation `runtime/timing/device_time.py` runs for the estimated device time. A
top-level loop is one bar per stream, spanning all its trips, labelled with its trip count; a
top-level instruction is its own bar, labelled with its ONNX node.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.ir import Loop, Module
from onnx2bir.runtime.timing import cost
from onnx2bir.runtime.timing.device_time import simulate


@dataclass(frozen=True, slots=True)
class Interval:
    resource: str
    start: float
    end: float
    label: str


@dataclass(frozen=True, slots=True)
class Timeline:
    intervals: tuple[Interval, ...]
    total_seconds: float

    @property
    def resources(self) -> list[str]:
        order = {"PE": 0, "ACT": 1, "DVE": 2, "POOL": 3}
        names = {i.resource for i in self.intervals}

        def key(name: str) -> tuple[int, int, str]:
            queue = name.rpartition(" q")[2]
            return order.get(name, 4), int(queue) if queue.isdigit() else -1, name

        return sorted(names, key=key)


def engine_timeline(module: Module, table: cost.CostTable = cost.DEFAULT_TABLE) -> Timeline:
    function = module.functions[0]
    sim = simulate(function, table)
    top_loop: dict[int, Loop] = {}  # instruction object id -> its outermost loop
    for item in function.entry.items:
        if isinstance(item, Loop):
            for ins in item.body.instructions():
                top_loop[id(ins)] = item
    records: list[Interval] = []
    spans: dict[tuple[int, str], list] = {}
    for s in sim.slices:
        loop = top_loop.get(id(s.ins))
        if loop is None:
            records.append(Interval(s.stream, s.start, s.end, s.ins.origin.node or ""))
            continue
        span = spans.setdefault((id(loop), s.stream), [s.start, s.end, loop, s.ins.origin.node])
        span[0], span[1] = min(span[0], s.start), max(span[1], s.end)
    for (_, stream), (start, end, loop, node) in spans.items():
        records.append(Interval(stream, start, end, f"loop x{loop.trip_count} ({node or ''})"))
    records.sort(key=lambda r: r.start)
    return Timeline(tuple(records), sim.total_seconds)
