"""How far the machine's fp32 reductions sit from onnxruntime's: the data behind the
summation-order allowance (docs/validation.md#reductions).

Usage:

    python benchmarks/summation_order.py                          # models/ and the sweep's exports
    python benchmarks/summation_order.py models/resnet18.onnx --json out.json
    python benchmarks/summation_order.py --from-json out.json     # the table again

Each model is validated in its own process (seed-0 random inputs, the default autocast, so
every stored intermediate is a probe fed on from the machine). For every probed output of a
matmul or convolution the emulating oracle computes the allowance 2·(λ·√K + 1)·u·Σ|t|
(`runtime/oracle/emulating.py`); from it this script recovers u·Σ|t| per element and reports
the largest |machine − onnxruntime| in units of u·Σ|t| and of u·√K·Σ|t|, per model. λ is
chosen from the second figure's worst case over all models.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "models" / ".cache" / "sweep"


def measure(model: str) -> dict:
    """In this process: validate `model` and measure its reductions."""
    import numpy as np

    import onnx2bir.validation.run as run
    from onnx2bir.options import CompileOptions
    from onnx2bir.runtime.oracle import emulating
    from onnx2bir.runtime.oracle.tolerance import TolerancePolicy, reduction_length

    seen: dict = {}
    judge = run.judge

    def hooked(graph, plan, evidence, policy, run_oracle, max_drift=None):
        def recording(machine_values, wanted):
            values = run_oracle(machine_values, wanted)
            seen.update(graph=graph, evidence=evidence, oracle=values)
            return values

        return judge(graph, plan, evidence, policy, recording, max_drift)

    run.judge = hooked
    doc, _, _ = run.run_validate(model, CompileOptions(), TolerancePolicy())
    graph, evidence, oracle = seen["graph"], seen["evidence"], seen["oracle"]
    worst = {"per_u_sum": 0.0, "per_u_sqrt_k_sum": 0.0, "tensor": None, "k": None}
    checked = 0
    for tensor, machine in evidence.probes.items():
        allowance = oracle.get(tensor + emulating.ACCUMULATION_SUFFIX)
        if allowance is None:
            continue
        checked += 1
        k = reduction_length(graph, graph.producer(tensor))
        factor = 2 * (emulating.ACCUMULATION_LAMBDA * math.sqrt(k) + 1)
        unit = np.asarray(allowance, np.float64) / factor  # u·Σ|t|
        gap = np.abs(np.asarray(machine, np.float64) - np.asarray(oracle[tensor], np.float64))
        usable = np.isfinite(gap) & np.isfinite(unit) & (unit > 0)
        if not usable.any():
            continue
        ratio = float(np.max(gap[usable] / unit[usable]))
        if ratio / math.sqrt(k) > worst["per_u_sqrt_k_sum"]:
            worst.update(per_u_sqrt_k_sum=ratio / math.sqrt(k), tensor=tensor, k=k)
        worst["per_u_sum"] = max(worst["per_u_sum"], ratio)
    return {"model": Path(model).stem, "passed": doc["passed"], "reductions": checked, **worst}


def measure_in_child(model: Path, timeout: float) -> dict:
    command = [sys.executable, __file__, "--one", str(model)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
        )
    except subprocess.TimeoutExpired:
        return {"model": model.stem, "error": f"timeout after {timeout:g} s"}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"model": model.stem, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}


def table(rows: list[dict]) -> str:
    done = [r for r in rows if "error" not in r and r["reductions"]]
    lines = [
        "| model | reductions | max Δ / (u·Σ|t|) | max Δ / (u·√K·Σ|t|) | at (K) |",
        "|---|---:|---:|---:|---|",
    ]
    for r in sorted(done, key=lambda r: -r["per_u_sqrt_k_sum"]):
        lines.append(
            f"| {r['model']} | {r['reductions']} | {r['per_u_sum']:.3g} | "
            f"{r['per_u_sqrt_k_sum']:.3g} | {r['tensor']} ({r['k']}) |"
        )
    if done:
        lines.append("")
        lines.append(
            f"{len(done)} models; worst Δ / (u·Σ|t|) {max(r['per_u_sum'] for r in done):.3g}, "
            f"worst Δ / (u·√K·Σ|t|) {max(r['per_u_sqrt_k_sum'] for r in done):.3g}"
        )
    failed = [r for r in rows if "error" in r]
    for r in failed:
        lines.append(f"- {r['model']}: {r['error']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--from-json", type=Path, help="print the table of saved rows")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return
    models = args.models or sorted((ROOT / "models").glob("*.onnx")) + sorted(SWEEP.glob("*.onnx"))
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda m: measure_in_child(m, args.timeout), models))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
