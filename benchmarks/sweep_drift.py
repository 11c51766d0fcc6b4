"""Drift per autocast type over the sweep's architectures: what bf16, fp16 and fp8 operands cost.

Usage (after the exports, `/work/venv-export/bin/python models/sweep.py --export-only`):

    python benchmarks/sweep_drift.py                         # every model of models/.cache/sweep
    python benchmarks/sweep_drift.py --types bf16 fp8_e4m3 --jobs 2 --json drift.json
    python benchmarks/sweep_drift.py --from-json drift.json  # the table again, no validation

Each model is validated (`onnx2bir validate --json`, seed-0 random inputs, its own process with
a timeout) under `--auto-cast matmult` with each `--auto-cast-type`. Per type the table gives
how many models validate against the emulating oracle (docs/validation.md#verdict) and, over
their float outputs, the median and worst drift from plain fp32 onnxruntime: R (the machine's
distance from fp32 over the emulation's), cosine and SNR. Models that fail are listed with
their reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "models" / ".cache" / "sweep"
TYPES = ("bf16", "fp16", "fp8_e4m3")


def validate(model: Path, cast_type: str, timeout: float) -> dict:
    command = [
        sys.executable,
        "-m",
        "onnx2bir",
        "validate",
        str(model),
        "--json",
        "--auto-cast-type",
        cast_type,
    ]
    row = {"model": model.stem, "type": cast_type}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False
        )
    except subprocess.TimeoutExpired:
        return row | {"error": f"timeout after {timeout:g} s"}
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        return row | {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    if "error" in doc:
        return row | {"error": doc["error"]["message"][:200]}
    drifts = [o["drift"] for o in doc["outputs"] if o.get("drift")]
    return row | {
        "passed": doc["passed"],
        "r": [d["r"] for d in drifts if d["r"] is not None],
        "cosine": [d["cosine"] for d in drifts if d["cosine"] is not None],
        "snr_db": [d["snr_db"] for d in drifts if d["snr_db"] is not None],
        "failing": [o["name"] for o in doc["outputs"] if not o["passed"]]
        + [c["name"] for c in doc.get("checkpoints", []) if not c["passed"]],
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| type | models | validate | median R | worst R | median cosine | worst cosine "
        "| median SNR dB | worst SNR dB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cast_type in dict.fromkeys(r["type"] for r in rows):
        ran = [r for r in rows if r["type"] == cast_type and "error" not in r]
        ratios = [x for r in ran for x in r["r"]]
        cosines = [x for r in ran for x in r["cosine"]]
        snrs = [x for r in ran for x in r["snr_db"] if x == x and abs(x) != float("inf")]
        stats = []
        for values, best in ((ratios, max), (cosines, min), (snrs, min)):
            stats += (
                [f"{statistics.median(values):.4g}", f"{best(values):.4g}"] if values else ["-"] * 2
            )
        passed = sum(1 for r in ran if r["passed"])
        total = sum(1 for r in rows if r["type"] == cast_type)
        lines.append(f"| {cast_type} | {total} | {passed} | " + " | ".join(stats) + " |")
    failures = [r for r in rows if "error" in r or not r.get("passed")]
    if failures:
        lines += ["", "| model | type | why |", "|---|---|---|"]
        for r in failures:
            why = r.get("error") or "fails: " + ", ".join(r.get("failing", [])[:3])
            lines.append(f"| {r['model']} | {r['type']} | {why} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path, help=f"default: {CACHE}/*.onnx")
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, help="write every row")
    parser.add_argument("--from-json", type=Path, help="the table of rows saved by --json")
    args = parser.parse_args(argv)
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return 0
    models = args.models or sorted(CACHE.glob("*.onnx"))
    jobs = [(m, t) for t in args.types for m in models]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda job: validate(*job, args.timeout), jobs))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
