"""Per-node time of the row loops (Softmax, LogSoftmax and the row normalisations) on the
estimated device timeline, and the estimated device time, of the calibration models.

Usage (after `nice -n 10 /work/venv-export/bin/python models/calibration.py`):
    python benchmarks/row_loops.py                       # BERT-base, 1 and 2 layers
    python benchmarks/row_loops.py MODEL.onnx ...        # other models

For every node of those ops: its span on the simulated timeline (docs/device_time.md) from its
first compute instruction's start to its last instruction's end (the DMA loads of constants
such as a LayerNormalization's scale have no inputs and run whenever a queue is free, so they
are left out of the start), and its busy time summed over all streams. Then the estimate of
`onnx2bir report` (the default cost table) and of benchmarks/device_time.py (matmul operands
costed as bf16).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.calibration import path_of  # noqa: E402
from onnx2bir.bir.enums import Dtype, Engine  # noqa: E402
from onnx2bir.compiler import compile_model  # noqa: E402
from onnx2bir.runtime.timing.cost import CostTable  # noqa: E402
from onnx2bir.runtime.timing.device_time import simulate  # noqa: E402

OPS = (
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
)


def node_figures(path: Path) -> tuple[list[dict], float, float]:
    """(per-node rows, report estimate, estimate with bf16 matmul operands) of one model."""
    compilation = compile_model(path)
    function = compilation.module.functions[0]
    ops = {name: data["op_type"] for name, data in compilation.graph.nodes()}
    sim = simulate(function, CostTable())
    first, last, busy = {}, defaultdict(float), defaultdict(float)
    for s in sim.slices:
        node = s.ins.origin.node
        if ops.get(node) not in OPS:
            continue
        if s.ins.engine is not Engine.DMA:
            first[node] = min(first.get(node, s.start), s.start)
        last[node] = max(last[node], s.end)
        busy[node] += (s.end - s.start) * s.weight
    rows = [
        {
            "node": node,
            "op": ops[node],
            "span_us": (last[node] - first[node]) * 1e6,
            "busy_us": busy[node] * 1e6,
        }
        for node in sorted(first, key=lambda n: first[n])
    ]
    calibrated = simulate(function, CostTable(pe_dtype=Dtype.BF16)).total_seconds
    return rows, sim.total_seconds, calibrated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = args.models or [path_of("bert_base", layers) for layers in (1, 2)]
    for path in paths:
        rows, report, calibrated = node_figures(path)
        print(f"## {path.name}\n")
        print(f"estimated device time: {report * 1e6:.1f} us (report), ", end="")
        print(f"{calibrated * 1e6:.1f} us (bf16 matmul operands)\n")
        print("| node | op | span (us) | busy, all streams (us) |")
        print("|---|---|---|---|")
        for row in rows:
            print(f"| {row['node']} | {row['op']} | {row['span_us']:.1f} | {row['busy_us']:.1f} |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
