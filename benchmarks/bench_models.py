"""Convert and simulate side by side with onnxruntime and onnxscript's fusion pass, per model.

Usage:
    python benchmarks/bench_models.py                  # the speed set (below)
    python benchmarks/bench_models.py --races          # also time the run under --check-races
    python benchmarks/bench_models.py --zoo            # also the committed models/*.onnx
    python benchmarks/bench_models.py --models models/small_cnn.onnx light:resnet50 bert:12
    python benchmarks/bench_models.py --markdown benchmarks/results.md --json out.json

The speed set: light resnet50, vgg19, densenet121 and inception_v1 (seeded random weights,
`models/light.py`) and BERT with hidden 256, sequence 128 and 2, 12 and 24 layers
(`models/bert_depth.py`, exported with the export venv; a missing export is reported, not
made). Each model runs in its own process so its peak resident memory is its own. There:

- convert = import + passes + code generation (its dependency analysis, `codegen/deps.py`,
  timed apart) + verification; JSON writing (`bir/json_io.write_module`) is timed apart too,
  and "with JSON" adds it (what `onnx2bir convert` does end to end);
- simulate = the machine running the BIR (`run_function`) under the default options
  (autocast of matmul operands to bf16, the default memory plan);
- onnxruntime: session creation (default graph optimisations, 2 intra-op threads), then the
  best of 3 runs after a warm-up, on the same inputs;
- fusion = onnxscript's `optimize_for_ort` on the same file, timed in a subprocess of the
  export venv (`/work/venv-export` or $ONNX2BIR_EXPORT_PYTHON), import and load excluded;
- races (--races) = the same run in program order with the race detector on;
- GEMM floor = the float64 tile products of the program's Matmults alone, timed as bare GEMMs
  on one BLAS thread (`gemm_floor.py`): the part of simulate no dispatch or data-movement
  work can remove while each PE tile is summed in float64.

Ratios, not absolute times, are the result: on a shared 2-core machine every absolute time
moves with the load, both sides of a ratio move together. Speed is measured here and only
here; the tests never assert it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's onnx2bir, not an installed one
sys.path.insert(0, str(ROOT / "models"))
sys.path.insert(0, str(ROOT / "benchmarks"))

SPEED_SET = [
    "light:resnet50",
    "light:vgg19",
    "light:densenet121",
    "light:inception_v1",
    "bert:2",
    "bert:12",
    "bert:24",
]
EXPORT_PYTHON = os.environ.get("ONNX2BIR_EXPORT_PYTHON", "/work/venv-export/bin/python")
ORT_RUNS = 3

_FUSION_SCRIPT = """
import sys, time, onnx, onnxscript
from onnxscript.rewriter.ort_fusions import optimize_for_ort
model = onnxscript.ir.serde.deserialize_model(onnx.load(sys.argv[1]))
start = time.perf_counter()
optimize_for_ort(model)
print(time.perf_counter() - start)
"""


def _resolve(name: str) -> Path:
    if name.startswith("light:"):
        from light import light_model_path

        return light_model_path(name.removeprefix("light:"))
    if name.startswith("bert:"):
        from bert_depth import path_of

        path = path_of(int(name.removeprefix("bert:")))
        if not path.exists():
            raise FileNotFoundError(
                f"{path.name} not exported: run {EXPORT_PYTHON} models/bert_depth.py"
            )
        return path
    return Path(name)


def timed_dependencies():
    """Wrap the dependency tracker's entry points to add up their time (this process only)."""
    from onnx2bir.codegen import deps

    spent = [0.0]

    def timed(method):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        return run

    for name in ("add", "open_loop", "close_loop", "define_axis"):
        setattr(deps.DependencyTracker, name, timed(getattr(deps.DependencyTracker, name)))
    return spent


def _measure(name: str, races: bool, queue) -> None:
    import onnxruntime as ort

    from onnx2bir.bir.json_io import write_module
    from onnx2bir.compiler import compile_model
    from onnx2bir.options import CompileOptions
    from onnx2bir.runtime.machine.interpreter import run_function
    from onnx2bir.runtime.machine.schedule import Schedule, run_scheduled
    from onnx2bir.runtime.oracle.ort import synthesize_inputs

    try:
        path = _resolve(name)
        deps_time = timed_dependencies()
        start = time.perf_counter()
        compilation = compile_model(path, CompileOptions())
        convert = time.perf_counter() - start
        phases = dict(compilation.timings)
        phases["deps"] = deps_time[0]
        phases["codegen"] -= deps_time[0]
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            write_module(compilation.module, out, "model")
            phases["json"] = time.perf_counter() - start
        feeds = synthesize_inputs(compilation.graph, 0)
        start = time.perf_counter()
        run_function(compilation.module, feeds)
        simulate = time.perf_counter() - start
        row = {"model": name, "convert": convert, "phases": phases, "simulate": simulate}
        from gemm_floor import floor_seconds, pe_products

        row["floor"], row["gflop"] = floor_seconds(pe_products(compilation.module.functions[0]))
        if races:
            start = time.perf_counter()
            checked = run_scheduled(compilation.module, feeds, Schedule("program"), True)
            row["races"] = time.perf_counter() - start
            row["race_count"] = checked.race_count
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        start = time.perf_counter()
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        row["ort_session"] = time.perf_counter() - start
        session.run(None, feeds)  # warm-up
        runs = []
        for _ in range(ORT_RUNS):
            start = time.perf_counter()
            session.run(None, feeds)
            runs.append(time.perf_counter() - start)
        row["ort_run"] = min(runs)
        row["passed"] = _validates(path)
        row["instructions"] = sum(1 for _ in compilation.module.functions[0].instructions())
        row["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        queue.put(row)
    except Exception as exc:  # report and keep going with the next model
        queue.put({"model": name, "error": f"{type(exc).__name__}: {exc}"[:200]})


def _validates(path: Path) -> bool:
    """Whether `onnx2bir validate` passes the model (a run of its own, outside the timings:
    the verdict reads the machine's rounded intermediates, docs/validation.md#verdict)."""
    from onnx2bir.options import CompileOptions
    from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
    from onnx2bir.validation.run import run_validate

    doc, _, _ = run_validate(str(path), CompileOptions(), TolerancePolicy())
    return bool(doc["passed"])


def fusion_time(path: Path) -> float | None:
    """Seconds onnxscript's optimize_for_ort takes on `path` (None: no export venv)."""
    if not Path(EXPORT_PYTHON).exists():
        return None
    done = subprocess.run(
        [EXPORT_PYTHON, "-c", _FUSION_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return None
    return float(done.stdout.strip().splitlines()[-1])


def measure(name: str, races: bool = False, fusion: bool = True) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(name, races, queue))
    process.start()
    process.join()
    row = queue.get() if not queue.empty() else {"model": name, "error": "process died"}
    if fusion and "error" not in row:
        row["fusion"] = fusion_time(_resolve(name))
    return row


def _ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    return "–" if a is None or not b else f"{a / b:.{digits}f}x"


def table(rows: list[dict]) -> str:
    races = any("races" in row for row in rows)
    head = (
        "| model | simulate s | ORT run s | **simulate / ORT run** | PE GFLOP "
        "| GEMM floor s | floor / ORT run | convert s | fusion s "
        "| **convert / fusion** | with JSON / fusion | ORT session s | peak MiB "
        "| BIR instructions | validates |"
    )
    lines = [head + (" races s | races / simulate |" if races else "")]
    lines.append("|---|" + "---:|" * 13 + "---|" + "---:|---:|" * races)
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | error: {row['error']} |" + "|" * (13 + 2 * races))
            continue
        fusion = row.get("fusion")
        line = (
            f"| {row['model']} | {row['simulate']:.2f} | {row['ort_run']:.3f} | "
            f"**{_ratio(row['simulate'], row['ort_run'])}** | {row['gflop']:.2f} | "
            f"{row['floor']:.3f} | {_ratio(row['floor'], row['ort_run'])} | {row['convert']:.2f} | "
            f"{'–' if fusion is None else f'{fusion:.2f}'} | "
            f"**{_ratio(row['convert'], fusion, 2)}** | "
            f"{_ratio(row['convert'] + row['phases']['json'], fusion, 2)} | "
            f"{row['ort_session']:.2f} | "
            f"{row['peak_mib']:.0f} | {row['instructions']} | "
            f"{'yes' if row['passed'] else 'NO'} |"
        )
        if races:
            line += f" {row['races']:.2f} | {_ratio(row['races'], row['simulate'])} |"
        lines.append(line)
    return "\n".join(lines)


PHASES = ("import", "passes", "codegen", "deps", "verify", "json")


def phase_table(rows: list[dict]) -> str:
    """Convert time per phase; for BERT, growth from the smallest to the largest depth."""
    lines = [
        "| model | " + " | ".join(f"{p} s" for p in PHASES) + " | convert s |",
        "|---|" + "---:|" * (len(PHASES) + 1),
    ]
    good = [row for row in rows if "error" not in row]
    for row in good:
        cells = " | ".join(f"{row['phases'].get(p, 0.0):.3f}" for p in PHASES)
        lines.append(f"| {row['model']} | {cells} | {row['convert']:.2f} |")
    berts = sorted(
        (int(row["model"].removeprefix("bert:")), row)
        for row in good
        if row["model"].startswith("bert:")
    )
    if len(berts) >= 2:
        (low, small), (high, large) = berts[0], berts[-1]
        cells = " | ".join(_ratio(large["phases"].get(p), small["phases"].get(p)) for p in PHASES)
        lines.append(
            f"| growth bert:{low} → bert:{high} ({high / low:.0f}x layers) | {cells} | "
            f"{_ratio(large['convert'], small['convert'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="paths, light:<name> or bert:<layers>")
    parser.add_argument("--zoo", action="store_true", help="also the committed models/*.onnx")
    parser.add_argument("--races", action="store_true", help="also time --check-races runs")
    parser.add_argument("--no-fusion", action="store_true", help="skip onnxscript's fusion")
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    parser.add_argument("--json", type=Path, help="also write the raw figures as JSON")
    args = parser.parse_args()
    names = args.models or list(SPEED_SET)
    if args.zoo:
        names += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "models").glob("*.onnx"))]
    rows = []
    for name in names:
        row = measure(name, races=args.races, fusion=not args.no_fusion)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    header = (
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`python benchmarks/bench_models.py{' --races' if args.races else ''}` on "
        f"{os.cpu_count()} cores (load average {load} at the end: the cores are shared, "
        "so read the ratios, not the seconds).\n\n"
    )
    text = header + table(rows) + "\n\nConvert by phase (seconds):\n\n" + phase_table(rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
