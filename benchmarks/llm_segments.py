"""A language model larger than one machine's memory validated in segments: each segment's wall
time, resident peak and the weights it read, against the plan (docs/validation.md#segments).

Usage:

    python benchmarks/llm_segments.py MODEL.onnx --segment-memory 6GiB --ray --jobs 1 \\
        --out benchmarks/llm_segments.json --md benchmarks/llm_segments.md

It runs the command a user types, `onnx2bir validate MODEL --segment-memory SIZE [--ray]
[--jobs N] --json`, in its own process under `/usr/bin/time -v` (the parent's peak), and
tabulates the document's `segments`: nodes, planned peak, the worker's peak (VmHWM since the
segment started), the external-data bytes it read and its wall. The models come from
`models/llm_sizes.py` (models/.cache/llm/; the 7B file is stitched, 29 GB of fp32 weights).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_memory import timed_validate, weight_bytes  # noqa: E402

GIB = 1 << 30


def run(model: Path, extra: list[str]) -> dict:
    doc, wall, peak, status = timed_validate(model, extra)
    return {
        "command": " ".join(["onnx2bir", "validate", model.name, *extra]),
        "exit": status,
        "wall_s": round(wall, 1),
        "parent_peak_bytes": peak,
        "passed": doc.get("passed"),
        "error": doc.get("error"),
        "segmenting": doc.get("segmenting"),
        "segments": [
            {
                key: piece.get(key)
                for key in (
                    "index",
                    "first_node",
                    "last_node",
                    "first_name",
                    "last_name",
                    "passed",
                    "planned_peak_bytes",
                    "peak_bytes",
                    "weight_bytes",
                    "wall_seconds",
                )
            }
            | {"checkpoints": len(piece.get("checkpoints") or []), "error": piece.get("error")}
            for piece in doc.get("segments", [])
        ],
    }


def markdown(result: dict, weights: int) -> str:
    def gib(size):
        return "-" if size is None else f"{size / GIB:.2f}"

    lines = [
        f"`{result['command']}`: exit {result['exit']}, "
        f"{'PASS' if result['passed'] else 'not PASS'}, wall {result['wall_s']} s, "
        f"parent's peak {gib(result['parent_peak_bytes'])} GiB; fp32 weights {gib(weights)} GiB.",
        "",
        "| segment | nodes | first - last node | checkpoints | verdict | planned GiB "
        "| peak GiB | weights read GiB | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for piece in result["segments"]:
        verdict = "ok" if piece["passed"] else ("error" if piece["error"] else "FAIL")
        lines.append(
            f"| {piece['index']} | {piece['first_node']}-{piece['last_node']} "
            f"| {piece['first_name']} - {piece['last_name']} | {piece['checkpoints']} "
            f"| {verdict} | {gib(piece['planned_peak_bytes'])} | {gib(piece['peak_bytes'])} "
            f"| {gib(piece['weight_bytes'])} | {piece['wall_seconds']} |"
        )
    peaks = [p["peak_bytes"] for p in result["segments"] if p["peak_bytes"]]
    if peaks:
        lines += ["", f"Largest segment peak {gib(max(peaks))} GiB."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--segment-memory", default="6GiB")
    parser.add_argument("--ray", action="store_true", help="a local Ray instance")
    parser.add_argument("--jobs", type=int, help="segments at a time")
    parser.add_argument("--out", type=Path, help="the JSON figures")
    parser.add_argument("--md", type=Path, help="the Markdown table")
    args = parser.parse_args(argv)
    extra = ["--segment-memory", args.segment_memory]
    if args.ray:
        extra.append("--ray")
    if args.jobs:
        extra += ["--jobs", str(args.jobs)]
    result = run(args.model, extra)
    result["weights_bytes"] = weight_bytes(args.model)
    text = markdown(result, result["weights_bytes"])
    print(text)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        args.md.write_text(text)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
