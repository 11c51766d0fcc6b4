"""The device-time part of `report`: the "cost" JSON object and its text lines.

In: a `CostReport` (runtime/timing/cost.py). Out: `cost_json` (JSON-ready dict; keys are only ever
added) and `cost_text` (the lines `report` prints). docs/device_time.md explains the model.
"""

from __future__ import annotations

from onnx2bir.codegen.driver import IDENTITY_DRAM
from onnx2bir.runtime.timing.cost import CostReport

MODEL = "runtime/timing/cost.py (NeuronCore-v2 clocks and instruction costs)"


def cost_json(estimate: CostReport) -> dict:
    total = estimate.total_seconds
    streams = estimate.stream_busy_seconds

    def share(busy: float) -> float:
        return busy / total if total else 0.0

    queues = sum(1 for s in streams if s.startswith("DMA"))
    return {
        "estimated_seconds": total,
        # per engine kind; DMA is the sum over its queues, so it can exceed the estimate
        "busy_seconds": {e.value: t for e, t in sorted(estimate.busy_seconds.items())},
        "dma_bytes": estimate.dma_bytes,
        "model": MODEL,
        "utilisation": {
            e.value: share(t / (queues or 1) if e.value == "DMA" else t)
            for e, t in sorted(estimate.busy_seconds.items())
        },
        "stream_busy_seconds": dict(sorted(streams.items(), key=lambda kv: _stream_key(kv[0]))),
        "stream_utilisation": {s: share(t) for s, t in streams.items()},
        "busiest_stream_seconds": max(streams.values(), default=0.0),
        "total_busy_seconds": sum(streams.values()),
        "critical_path": estimate.critical_path,
        "top_nodes": estimate.top_nodes,
        "matmul_flops": estimate.flops,
        "achieved_flops_per_second": estimate.achieved_flops,
        "pe_peak_flops_per_second": estimate.pe_peak_flops,
        "pe_peak_fraction": estimate.achieved_flops / estimate.pe_peak_flops,
        "dma_bytes_compulsory": estimate.compulsory_dma_bytes,
        "dma_bytes_other": estimate.dma_bytes - estimate.compulsory_dma_bytes,
        # what DMAs read out of the model's weights and constants, every trip counted; the
        # resident identity matrix of the PE transposes, loaded once, is not a weight
        "dma_bytes_weights": sum(
            n for loc, n in estimate.payload_dma_bytes.items() if loc != IDENTITY_DRAM
        ),
    }


def _stream_key(name: str) -> tuple[int, int]:
    order = {"PE": 0, "ACT": 1, "DVE": 2, "POOL": 3}
    queue = name.rpartition(" q")[2]
    return order.get(name, 4), int(queue) if queue.isdigit() else -1


def cost_text(cost: dict) -> list[str]:
    us = 1e6
    busy = ", ".join(f"{e} {t * us:.0f} us" for e, t in cost["busy_seconds"].items() if t)
    bound = " (at least: loops with a run-time trip count costed as one trip)"
    lines = [
        f"estimated device time (cost model, runtime/timing/cost.py): "
        f"{cost['estimated_seconds'] * us:.0f} us{bound if cost.get('lower_bound') else ''}",
        f"  busy time per engine kind: {busy} (DMA is the sum over its 16 queues, so it can "
        f"exceed the total); DMA bytes {cost['dma_bytes']}",
    ]
    if "stream_busy_seconds" not in cost:
        return lines
    streams = ", ".join(
        f"{s} {t * us:.0f} us ({cost['stream_utilisation'][s]:.0%})"
        for s, t in cost["stream_busy_seconds"].items()
    )
    lines += [
        f"  busy time per stream (utilisation): {streams}",
        f"  busiest stream {cost['busiest_stream_seconds'] * us:.0f} us <= estimate <= all "
        f"streams' busy time {cost['total_busy_seconds'] * us:.0f} us",
        f"  matmul {cost['matmul_flops'] / 1e9:.3f} GFLOP: "
        f"{cost['achieved_flops_per_second'] / 1e12:.2f} TFLOP/s achieved, "
        f"{cost['pe_peak_fraction']:.1%} of the PE peak "
        f"{cost['pe_peak_flops_per_second'] / 1e12:.2f} TFLOP/s",
        f"  DMA bytes: {cost['dma_bytes_compulsory']} compulsory (weights, constants, graph "
        f"inputs and outputs, each once), {cost['dma_bytes_other']} other "
        f"({cost['dma_bytes'] / max(cost['dma_bytes_compulsory'], 1):.2f}x compulsory in all)",
        "  most expensive ONNX nodes (busy time on all streams):",
    ]
    lines += [
        f"    {n['node']:<32} {n['busy_seconds'] * us:>9.1f} us {n['share']:>6.1%}  {n['rule']}"
        for n in cost["top_nodes"]
    ]
    lines.append("  critical path (longest runs, in time order):")
    lines += [
        f"    {r['start'] * us:>9.1f} us +{r['seconds'] * us:>8.1f} us  {r['stream']:<7} "
        f"{r['opcode']:<14} x{r['instructions']:<5} {r['node']}"
        for r in cost["critical_path"]
    ]
    return lines
