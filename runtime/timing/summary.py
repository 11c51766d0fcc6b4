"""From a device-time simulation to a `CostReport`: totals, critical path, costliest nodes.

In: the Function, its `Simulation` (runtime/timing/device_time.py) and the `CostTable`. Out: the
`CostReport` of runtime/timing/cost.py. The critical path follows each slice back to the slice whose
end let it start (its stream's previous slice, a dependency, or the shared DMA bandwidth's
previous user), each step counted from the end of the one it waited for; consecutive steps on
the same ONNX node and stream are merged into one run.
"""

from __future__ import annotations

from onnx2bir.bir.enums import Engine
from onnx2bir.bir.ir import Function
from onnx2bir.runtime.timing.cost import CostReport, CostTable
from onnx2bir.runtime.timing.device_time import Simulation

TOP_NODES = 10
CRITICAL_RUNS = 20  # the longest runs of the critical path that the report lists


def critical_path(sim: Simulation) -> list[dict]:
    """Runs of the critical path in time order: node, stream, opcode, instructions, seconds."""
    if not sim.slices:
        return []
    index = max(range(len(sim.slices)), key=lambda i: sim.slices[i].end)
    steps = []
    seen: set[int] = set()
    while index >= 0 and index not in seen:
        seen.add(index)
        steps.append(sim.slices[index])
        index = sim.slices[index].cause
    runs: list[dict] = []
    for step in reversed(steps):
        node = step.ins.origin.node or "(no node)"
        # On the path, a step begins where the step it waited for ends (a DMA stalled on the
        # shared bandwidth began its own transfer earlier).
        begin = max(step.start, sim.slices[step.cause].end) if step.cause >= 0 else step.start
        if runs and runs[-1]["node"] == node and runs[-1]["stream"] == step.stream:
            run = runs[-1]
            run["instructions"] += 1
            run["end"] = step.end
        else:
            run = {
                "node": node,
                "stream": step.stream,
                "opcode": step.ins.opcode.value,
                "instructions": 1,
                "start": begin,
                "end": step.end,
            }
            runs.append(run)
    for run in runs:
        run["seconds"] = run["end"] - run["start"]
    if len(runs) > CRITICAL_RUNS:
        longest = sorted(runs, key=lambda r: -r["seconds"])[:CRITICAL_RUNS]
        runs = sorted(longest, key=lambda r: r["start"])
    return runs


def top_nodes(sim: Simulation, count: int = TOP_NODES) -> list[dict]:
    """The ONNX nodes with the most busy time (all streams), with the rule or kernel."""
    rules: dict[str, str] = {}
    for s in sim.slices:
        rules.setdefault(s.ins.origin.node or "(no node)", s.ins.origin.rule)
    total = sum(sim.node_seconds.values()) or 1.0
    ranked = sorted(sim.node_seconds.items(), key=lambda item: -item[1])[:count]
    return [
        {"node": node, "rule": rules.get(node, ""), "busy_seconds": t, "share": t / total}
        for node, t in ranked
    ]


def cost_report(function: Function, sim: Simulation, table: CostTable) -> CostReport:
    busy_seconds: dict[Engine, float] = {}
    for stream, seconds in sim.busy.items():
        engine = Engine.DMA if stream.startswith("DMA") else Engine(stream)
        busy_seconds[engine] = busy_seconds.get(engine, 0.0) + seconds
    return CostReport(
        function=function.name,
        busy_cycles={e: c for e, c in sim.cycles.items() if e is not Engine.DMA},
        busy_seconds=busy_seconds,
        instruction_counts=dict(sim.counts),
        dma_bytes=sim.dma_bytes,
        total_seconds=sim.total_seconds,
        stream_busy_seconds=dict(sim.busy),
        compulsory_dma_bytes=min(sim.compulsory_bytes, sim.dma_bytes),
        payload_dma_bytes=dict(sim.payload_bytes),
        flops=sim.flops,
        pe_peak_flops=table.pe_peak_flops,
        critical_path=critical_path(sim),
        top_nodes=top_nodes(sim),
    )
