"""Peak memory and wall time of `validate` on language models at the sizes people deploy, against
their fp32 weight bytes (docs/input_contracts.md#peak-estimate).

Usage:

    python benchmarks/llm_memory.py                        # the Qwen2-0.5B prefill at 128 tokens
    python benchmarks/llm_memory.py MODEL.onnx ... --repeat 3 --out benchmarks/llm_memory.json

The models come from `models/llm_sizes.py` (models/.cache/llm/). Each run is the command a user
types, `onnx2bir validate MODEL --json`, in its own process under `/usr/bin/time -v`, so the
peak is the process's maximum resident set and the wall includes starting Python and reading
the model. The ratio is to the initializer bytes the model file declares. Run nothing else big
at the same time: the machine has no swap.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "models" / ".cache" / "llm"
DEFAULT_MODELS = [LLM / "qwen2-0.5b_prefill128.onnx"]


def timed_validate(model: Path, extra: list[str]) -> tuple[dict, float, int | None, int]:
    """`onnx2bir validate MODEL --json EXTRA` in its own process under /usr/bin/time -v:
    (the document, or {"error": the last lines of stderr}; wall seconds; peak RSS bytes;
    exit status)."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "onnx2bir", "validate", str(model)]
    command += ["--json", *extra]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        doc = {"error": done.stderr.strip().splitlines()[-5:]}
    return doc, wall, int(peak.group(1)) * 1024 if peak else None, done.returncode


def validate(model: Path, extra: list[str]) -> dict:
    """One validate: wall, peak RSS, verdict and the stage timings."""
    doc, wall, peak, _ = timed_validate(model, extra)
    return {
        "wall_s": round(wall, 2),
        "peak_bytes": peak,
        "passed": doc.get("passed"),
        "checkpoints": len(doc.get("checkpoints", [])),
        "timings": doc.get("timings", {}),
        "error": doc.get("error"),
    }


def weight_bytes(model: Path) -> int:
    from onnx2bir.frontend.memory_contracts import initializer_bytes

    return initializer_bytes(model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, default=DEFAULT_MODELS)
    parser.add_argument("--repeat", type=int, default=3, help="runs per model (median)")
    parser.add_argument("--out", type=Path, help="write the runs as JSON")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: validate flags")
    args = parser.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    rows = []
    for model in args.models:
        if not model.exists():
            print(f"{model}: not made (python models/llm_sizes.py --help)", file=sys.stderr)
            return 2
        runs = [validate(model, extra) for _ in range(args.repeat)]
        weights = weight_bytes(model)
        peaks = [r["peak_bytes"] for r in runs if r["peak_bytes"]]
        row = {
            "model": model.name,
            "weights_bytes": weights,
            "runs": runs,
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_peak_bytes": statistics.median(peaks) if peaks else None,
        }
        rows.append(row)
        ratio = row["median_peak_bytes"] / weights if peaks and weights else float("nan")
        print(
            f"{model.name}: weights {weights / 1e9:.2f} GB, peak {ratio:.2f}x "
            f"({(row['median_peak_bytes'] or 0) / 1e9:.2f} GB), wall {row['median_wall_s']:.1f} s, "
            f"passed {[r['passed'] for r in runs]}"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
