"""Time convert, simulate and onnxruntime on the same inputs, per model, and report peak memory.

Usage:
    python benchmarks/bench_models.py                 # committed zoo models + light models
    python benchmarks/bench_models.py --large         # also models/.cache/*_large.onnx
    python benchmarks/bench_models.py --models models/small_cnn.onnx light:resnet50
    python benchmarks/bench_models.py --markdown benchmarks/results.md

Each model runs in its own process so its peak resident memory is its own. In that process:
convert = import + passes + BIR code generation; simulate = the machine running the BIR;
onnxruntime session = creating the session (graph optimisations on, the default); onnxruntime
run = one run on the same inputs. Ratios: convert / session creation, simulate / run.
Speed is measured here and only here; the tests never assert it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
from light import LIGHT_MODELS  # noqa: E402

LIGHT = sorted(LIGHT_MODELS.values())


def _resolve(name: str) -> Path:
    if name.startswith("light:"):
        sys.path.insert(0, str(ROOT / "models"))
        from light import light_model_path

        return light_model_path(name.removeprefix("light:"))
    return Path(name)


def _measure(name: str, queue) -> None:
    import onnxruntime as ort

    from onnx2bir.compiler import compile_model
    from onnx2bir.options import CompileOptions
    from onnx2bir.runtime.compare import compare_output
    from onnx2bir.runtime.interpreter import run_function
    from onnx2bir.runtime.oracle import synthesize_inputs

    try:
        path = _resolve(name)
        start = time.perf_counter()
        # The timings and the fp32 check of results.md: no autocast (docs/autocast.md has the
        # accuracy under each autocast choice).
        compilation = compile_model(path, CompileOptions(auto_cast="none"))
        convert = time.perf_counter() - start
        feeds = synthesize_inputs(compilation.graph, 0)
        start = time.perf_counter()
        actual = run_function(compilation.module, feeds)
        simulate = time.perf_counter() - start
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        start = time.perf_counter()
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        session_time = time.perf_counter() - start
        session.run(None, feeds)  # warm-up
        start = time.perf_counter()
        expected = session.run(None, feeds)
        run_time = time.perf_counter() - start
        names = [out.name for out in session.get_outputs()]
        passed = all(
            compare_output(n, actual[n], e).passed for n, e in zip(names, expected, strict=True)
        )
        instructions = sum(1 for _ in compilation.module.functions[0].instructions())
        queue.put(
            {
                "model": name,
                "convert": convert,
                "simulate": simulate,
                "ort_session": session_time,
                "ort_run": run_time,
                "passed": passed,
                "instructions": instructions,
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    except Exception as exc:  # report and keep going with the next model
        queue.put({"model": name, "error": f"{type(exc).__name__}: {exc}"[:200]})


def measure(name: str) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(name, queue))
    process.start()
    process.join()
    return queue.get() if not queue.empty() else {"model": name, "error": "process died"}


def table(rows: list[dict]) -> str:
    lines = [
        "| model | convert s | ORT session s | convert/session | simulate s | ORT run s "
        "| simulate/run | peak MiB | BIR instructions | validates |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | error: {row['error']} |||||||||")
            continue
        lines.append(
            f"| {row['model']} | {row['convert']:.2f} | {row['ort_session']:.2f} | "
            f"{row['convert'] / row['ort_session']:.2f} | {row['simulate']:.2f} | "
            f"{row['ort_run']:.3f} | {row['simulate'] / row['ort_run']:.0f}x | "
            f"{row['peak_mib']:.0f} | {row['instructions']} | "
            f"{'yes' if row['passed'] else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="model paths or light:<name>")
    parser.add_argument("--large", action="store_true", help="include models/.cache/*_large")
    parser.add_argument("--no-light", action="store_true", help="skip the onnx light models")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--json", type=Path, help="also write the raw figures as JSON")
    args = parser.parse_args()
    names = args.models or [
        str(p.relative_to(ROOT)) for p in sorted((ROOT / "models").glob("*.onnx"))
    ]
    if not args.models and not args.no_light:
        names += [f"light:{name}" for name in LIGHT]
    if args.large:
        large = [
            str(p.relative_to(ROOT))
            for p in sorted((ROOT / "models" / ".cache").glob("*_large.onnx"))
        ]
        names += [name for name in large if name not in names]
    rows = []
    for name in names:
        row = measure(name)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
