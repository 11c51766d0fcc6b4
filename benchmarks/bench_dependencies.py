"""Dependency edges, convert time and the race detector's cost, per model.

Usage: python benchmarks/bench_dependencies.py OUT.json [--no-races] [MODEL ...]
MODEL is a stem in models/, light:<name>, bert:<layers> (models/bert_depth.py's export in
models/.cache) or a path to an .onnx file; default: every model in models/ and the nine
light models. Run it from a checkout's root (it imports that checkout's onnx2bir). For each
model it records the instructions, the dependency edges by kind (and loop-carried ones),
`compile_model`, code-generation and dependency-analysis seconds (best of 3; the analysis'
own time is what `DependencyTracker` spends, inside code generation), and, where the
checkout has the race detector and --no-races is not given, the seconds to run the program
in program order without and with `check_races` (best of 2). A checkout without the
detector gives only the first part, which is how the "before" column of
benchmarks/dependencies.md was measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(0, "models")

import light  # noqa: E402
from bench_models import timed_dependencies  # noqa: E402

from onnx2bir.compiler import compile_model  # noqa: E402
from onnx2bir.runtime.oracle.ort import synthesize_inputs  # noqa: E402

LIGHT = sorted(light.LIGHT_MODELS.values())


def _path(name: str) -> Path:
    if name.startswith("light:"):
        return light.light_model_path(name.removeprefix("light:"), 0)
    if name.startswith("bert:"):
        return Path("models") / ".cache" / f"bert_h256_L{int(name.removeprefix('bert:'))}.onnx"
    if name.endswith(".onnx"):
        return Path(name)
    return Path("models") / f"{name}.onnx"


SPENT = timed_dependencies()


def _best(function, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def measure(name: str, races: bool = True) -> dict:
    path = _path(name)
    best_deps = float("inf")

    def compile_once():
        nonlocal best_deps
        SPENT[0] = 0.0
        compilation = compile_model(path)
        best_deps = min(best_deps, SPENT[0])
        return compilation

    convert, compilation = _best(compile_once, 3)
    codegen = compilation.timings["codegen"]
    function = compilation.module.functions[0]
    kinds: Counter = Counter()
    carried = instructions = 0
    for inst in function.instructions():
        instructions += 1
        for dep in inst.deps:
            kinds[str(dep.kind)] += 1
            carried += getattr(dep, "carried_by", None) is not None
    row = {
        "instructions": instructions,
        "edges": sum(kinds.values()),
        "kinds": dict(sorted(kinds.items())),
        "loop_carried": carried,
        "convert_s": round(convert, 3),
        "codegen_s": round(codegen, 3),
    }
    row["deps_s"] = round(best_deps, 3)
    if not races:
        return row
    try:
        from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
    except ImportError:
        return row
    feeds = synthesize_inputs(compilation.graph, 0)
    program = parse_schedule("program")
    plain, _ = _best(lambda: run_scheduled(compilation.module, feeds, program, False), 2)
    checked, run = _best(lambda: run_scheduled(compilation.module, feeds, program, True), 2)
    row.update(
        instances=run.instances,
        simulate_s=round(plain, 3),
        simulate_races_s=round(checked, 3),
        races=len(run.races),
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, metavar="OUT.json", help="where the rows go")
    parser.add_argument(
        "models", nargs="*", metavar="MODEL", help="stem, light:<name>, bert:<layers> or a path"
    )
    parser.add_argument("--no-races", action="store_true", help="skip the simulate columns")
    args = parser.parse_intermixed_args()
    out = args.out
    names = args.models or (
        sorted(p.stem for p in Path("models").glob("*.onnx")) + [f"light:{n}" for n in LIGHT]
    )
    rows = {}
    for name in names:
        rows[name] = measure(name, not args.no_races)
        print(name, rows[name], flush=True)
        out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
