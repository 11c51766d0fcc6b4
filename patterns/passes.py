"""The pass manager: runs graph passes in the reference pipeline's order and keeps their
Statistic counters.

A pass is a small frozen object with a `name` and `run(graph, options) -> PassResult`. Its
result says whether the graph changed and carries its counters, named and described as the
seeds name them (e.g. "Number of times kernel <NAME> is matched"), plus any per-block findings
a report shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions


@dataclass(frozen=True)
class Statistic:
    pass_name: str
    name: str
    description: str
    value: int | float | str

    def to_json(self) -> dict:
        return {
            "pass": self.pass_name,
            "name": self.name,
            "description": self.description,
            "value": self.value,
        }


@dataclass
class PassResult:
    changed: bool
    statistics: list[Statistic] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)


class Pass(Protocol):
    name: str

    def run(self, graph: Graph, options: CompileOptions) -> PassResult: ...


@dataclass
class PassRecord:
    name: str
    changed: bool
    seconds: float
    result: PassResult


@dataclass
class PassManager:
    passes: list[Pass]
    records: list[PassRecord] = field(default_factory=list)

    def run(self, graph: Graph, options: CompileOptions) -> Graph:
        for graph_pass in self.passes:
            start = time.perf_counter()
            result = graph_pass.run(graph, options)
            self.records.append(
                PassRecord(graph_pass.name, result.changed, time.perf_counter() - start, result)
            )
        return graph

    @property
    def statistics(self) -> list[Statistic]:
        return [stat for record in self.records for stat in record.result.statistics]

    def result_of(self, name: str) -> PassResult | None:
        for record in self.records:
            if record.name == name:
                return record.result
        return None


def format_statistics(statistics: list[Statistic]) -> str:
    """The `--stats` text: one line per counter, grouped by pass."""
    lines = []
    current = None
    for stat in statistics:
        if stat.pass_name != current:
            current = stat.pass_name
            lines.append(f"=== {current} ===")
        lines.append(f"{stat.value!s:>10}  {stat.description}")
    return "\n".join(lines)
