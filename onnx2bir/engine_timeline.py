"""The engine timeline the cost model's list schedule implies, for the report page.

In: a BIR module. Out: `Timeline`, the busy intervals of each engine (DMA: each queue) in
seconds, from the same schedule `runtime/cost.py` uses for the estimated device time (same
costs, same dependency rule, same loop approximation: one iteration scheduled, the others
back to back). A loop is one bar per resource, spanning all its trips, labelled with its trip
count; a top-level instruction is its own bar, labelled with its ONNX node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx2bir.bir.ir import Instruction, Loop, Module
from onnx2bir.runtime import cost


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


def _resource_name(resource) -> str:
    if isinstance(resource, tuple):
        engine, queue = resource
        return f"{engine.value} q{queue}" if queue is not None else engine.value
    return resource.value


class _RecordingSchedule(cost._Schedule):
    """The cost model's schedule, keeping each instruction's interval."""

    def __init__(self, function, table):
        super().__init__(function, table)
        self.records: list[Interval] = []

    def instruction(self, ins: Instruction, frame, repeat: int) -> None:
        super().instruction(ins, frame, repeat)
        resource = (ins.engine, ins.attrs.get("queue")) if ins.engine.value == "DMA" else ins.engine
        end = self.finish[ins.id]
        seconds = cost.instruction_cost(ins, self.function, self.table)[1]
        self.records.append(
            Interval(_resource_name(resource), end - seconds, end, ins.origin.node or "")
        )

    def loop(self, loop: Loop, outer, repeat: int) -> None:
        first = len(self.records)
        super().loop(loop, outer, repeat)
        inner = self.records[first:]
        if not inner:
            return
        ids = [i.id for i in loop.body.instructions()]
        end = max((self.finish[i] for i in ids if i in self.finish), default=-math.inf)
        spans: dict[str, list[float]] = {}
        for record in inner:
            span = spans.setdefault(record.resource, [math.inf, -math.inf])
            span[0] = min(span[0], record.start)
            span[1] = max(span[1], record.end)
        node = next((r.label for r in inner if r.label), "")
        del self.records[first:]
        for resource, (start, stop) in spans.items():
            self.records.append(
                Interval(resource, start, max(stop, end), f"loop x{loop.trip_count} ({node})")
            )


def engine_timeline(module: Module, table: cost.CostTable = cost.DEFAULT_TABLE) -> Timeline:
    function = module.functions[0]
    schedule = _RecordingSchedule(function, table)
    top = cost._Frame()
    schedule.block(function.entry, top, 1)
    return Timeline(tuple(schedule.records), max(top.end, 0.0))
