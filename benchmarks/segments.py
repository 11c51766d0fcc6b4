"""`validate --segments N` against the whole-model validate: the same verdict, and how long each
takes (docs/validation.md#segments).

Usage:

    python benchmarks/segments.py                                   # BERT-12 and light resnet50
    python benchmarks/segments.py models/resnet18.onnx --segments 2 4 --repeat 3
    python benchmarks/segments.py --ray                             # also on a local Ray instance
    python benchmarks/segments.py --from-json benchmarks/segments.json

Each run is the command line a user types (`onnx2bir validate MODEL --json`), in its own
process, so the wall time includes starting Python and reading the model. The modes alternate
within each repeat, so a slow moment of the machine falls on both; the table gives the median.
BERT-12 is made by `models/bert_depth.py 12`, light resnet50 by `models/light.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "models" / ".cache"
DEFAULT_MODELS = [CACHE / "bert_h256_L12.onnx", CACHE / "light_resnet50_s0.onnx"]


def validate(model: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "onnx2bir", "validate", str(model), "--json", *extra]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        doc = {"error": done.stderr.strip().splitlines()[-1:] or ["no output"]}
    return {"wall_seconds": round(wall, 3), "exit": done.returncode, "doc": doc}


def measure(model: Path, counts: list[int], repeat: int, ray: bool) -> dict:
    modes = {"whole": []} | {f"segments {n}": ["--segments", str(n)] for n in counts}
    if ray:
        modes |= {f"segments {n} --ray": ["--segments", str(n), "--ray"] for n in counts}
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(repeat):
        for mode, extra in modes.items():
            runs[mode].append(validate(model, extra))
            last = runs[mode][-1]
            print(f"  {model.name} {mode}: exit {last['exit']}, {last['wall_seconds']:.2f} s")
    result = {"model": model.name, "modes": {}}
    for mode, done in runs.items():
        doc = done[-1]["doc"]
        entry = {
            "exit": [run["exit"] for run in done],
            "passed": doc.get("passed"),
            "wall_seconds": [run["wall_seconds"] for run in done],
            "median_seconds": statistics.median(run["wall_seconds"] for run in done),
        }
        if "segments" in doc:
            entry["segments"] = [
                {
                    "nodes": [piece["first_node"], piece["last_node"]],
                    "work_share": piece["work_share"],
                    "inputs": len(piece["inputs"]),
                    "passed": piece["passed"],
                    "wall_seconds": piece["wall_seconds"],
                }
                for piece in doc["segments"]
            ]
            entry["onnxruntime_seconds"] = doc["segmenting"]["onnxruntime_seconds"]
        result["modes"][mode] = entry
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| model | mode | verdict | median wall | runs | segment walls |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        whole = result["modes"]["whole"]["median_seconds"]
        for mode, entry in result["modes"].items():
            verdict = {True: "PASS", False: "FAIL", None: "error"}[entry["passed"]]
            speed = "" if mode == "whole" else f" ({whole / entry['median_seconds']:.2f}x)"
            walls = ", ".join(f"{s['wall_seconds']:.1f}" for s in entry.get("segments", []))
            runs = ", ".join(f"{w:.1f}" for w in entry["wall_seconds"])
            lines.append(
                f"| {result['model']} | {mode} | {verdict} | {entry['median_seconds']:.2f} s"
                f"{speed} | {runs} | {walls or '-'} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--segments", nargs="+", type=int, default=[4])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also run the segments as Ray tasks")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "segments.json")
    parser.add_argument("--from-json", type=Path, help="print the table of an earlier run")
    args = parser.parse_args()
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())["results"]))
        return 0
    missing = [str(m) for m in args.models if not m.exists()]
    if missing:
        print(f"missing: {', '.join(missing)} (see the usage above)", file=sys.stderr)
        return 2
    results = [measure(m, args.segments, args.repeat, args.ray) for m in args.models]
    args.json.write_text(json.dumps({"results": results}, indent=1) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
