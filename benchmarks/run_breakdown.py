"""Where one `simulate` run spends its time, per model: setup, first-use binding, the
live-bytes check, each opcode, and the float64 GEMM floor under the Matmults.

Usage:
    python benchmarks/run_breakdown.py                       # the speed set of bench_models
    python benchmarks/run_breakdown.py --models light:resnet50 bert:12 --repeats 5

Each model is compiled once and run `--repeats` times in this process (default options, the
memory planner and bf16 autocast on); the fastest run's figures are kept. Per run:

- setup = `load_machine`: the sentinel fill of every memory, the inputs and constants, and the
  live-bytes check's analysis of the program;
- check = the live-bytes check before each instruction instance (`live_bytes.check_before`);
- each opcode = its semantics function, including the first-use binding of its operands
  (the run that follows on the same machine, `warm`, shows what binding costs);
- GEMM floor = the float64 tile products alone (`gemm_floor.py`), part of the Matmult row;
- in parallel loops = the instruction instances inside loops the dependency analysis marks
  parallel, and those loops' median trip count (what running such a loop batched, each body
  instruction once over all its trips, could save dispatch on).

Seconds are wall time on a shared machine; read the shares. The tables are in
benchmarks/profile.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "models"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_models import SPEED_SET, _resolve  # noqa: E402
from gemm_floor import floor_seconds, pe_products  # noqa: E402

from onnx2bir.bir.ir import BasicBlock, Loop  # noqa: E402
from onnx2bir.compiler import compile_model  # noqa: E402
from onnx2bir.options import CompileOptions  # noqa: E402
from onnx2bir.runtime.machine import interpreter, semantics  # noqa: E402
from onnx2bir.runtime.machine.live_bytes import LiveBytes  # noqa: E402
from onnx2bir.runtime.oracle.ort import synthesize_inputs  # noqa: E402


def _timed(spent: Counter, key: str, function):
    def run(*args):
        start = time.perf_counter()
        try:
            return function(*args)
        finally:
            spent[key] += time.perf_counter() - start

    return run


def parallel_share(block: BasicBlock) -> tuple[int, int, list[int]]:
    """(instances in parallel loops, all instances, trip counts of the outermost parallel
    loops, one per instance of such a loop); a runtime loop's body counts once."""
    inside = total = 0
    trips: list[int] = []

    def walk(block: BasicBlock, times: int, parallel: bool) -> None:
        nonlocal inside, total
        for item in block.items:
            if isinstance(item, Loop):
                count = item.trip_count if isinstance(item.stop, int) else 1
                if item.parallel and not parallel:
                    trips.extend([count] * times)
                walk(item.body, times * count, parallel or item.parallel)
            else:
                total += times
                inside += times if parallel else 0

    walk(block, 1, False)
    return inside, total, trips


def breakdown(name: str, repeats: int) -> dict:
    compilation = compile_model(_resolve(name), CompileOptions())
    function = compilation.module.functions[0]
    feeds = synthesize_inputs(compilation.graph, 0)
    spent: Counter = Counter()
    table = dict(semantics.SEMANTICS)
    check, load = interpreter.check_before, interpreter.load_machine
    try:
        for opcode, run in table.items():
            semantics.SEMANTICS[opcode] = _timed(spent, opcode.name.lower(), run)
        interpreter.check_before = _timed(spent, "check", check)
        interpreter.load_machine = _timed(spent, "setup", load)
        best = None
        for _ in range(repeats):
            spent.clear()
            start = time.perf_counter()
            interpreter.run_function(compilation.module, feeds)
            total = time.perf_counter() - start
            if best is None or total < best[0]:
                best = (total, dict(spent))
        # The same machine again: operands bound, semantics prepared, scratch allocated.
        machine = load(compilation.module, function, feeds)
        interpreter.execute(machine, function.entry)
        machine.live_bytes = LiveBytes(function)
        start = time.perf_counter()
        interpreter.execute(machine, function.entry)
        warm = time.perf_counter() - start
    finally:
        semantics.SEMANTICS.update(table)
        interpreter.check_before, interpreter.load_machine = check, load
    floor, gflop = floor_seconds(pe_products(function))
    total, parts = best
    row = {"model": name, "total": total, "parts": parts, "warm": warm, "floor": floor}
    row["parallel"] = parallel_share(function.entry)
    return row


COLUMNS = ("setup", "check", "matmult", "dma_copy", "tensor_copy", "activation")


def markdown(rows: list[dict]) -> str:
    head = [
        "model",
        "run s",
        *COLUMNS,
        "other ops",
        "GEMM floor",
        "warm run s",
        "in parallel loops",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        parts, total = row["parts"], row["total"]
        other = sum(v for k, v in parts.items() if k not in COLUMNS)
        cells = [f"{parts.get(c, 0.0):.3f} ({parts.get(c, 0.0) / total:.0%})" for c in COLUMNS]
        cells.append(f"{other:.3f} ({other / total:.0%})")
        cells.append(f"{row['floor']:.3f} ({row['floor'] / total:.0%})")
        inside, instances, trips = row["parallel"]
        median = sorted(trips)[len(trips) // 2] if trips else 0
        cells.append(f"{row['warm']:.3f}")
        cells.append(f"{inside} of {instances} ({median} trips)")
        lines.append(f"| {row['model']} | {total:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="light:<name>, bert:<layers> or paths")
    parser.add_argument("--repeats", type=int, default=3, help="runs per model (best kept)")
    args = parser.parse_args()
    rows = [breakdown(name, args.repeats) for name in args.models or SPEED_SET]
    print(markdown(rows))


if __name__ == "__main__":
    main()
