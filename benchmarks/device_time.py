"""Estimated device time of BERT-base, DistilBERT-base and BERT-large beside published latencies.

Usage (after `nice -n 10 /work/venv-export/bin/python models/calibration.py`):
    python benchmarks/device_time.py                  # prints a markdown table
    python benchmarks/device_time.py --markdown benchmarks/device_time_table.md

Each model is compiled with its 1-layer and 2-layer exports (models/calibration.py: sequence
128, batch 4, random weights) under the default options (matmul operands autocast to bf16, the
memory plan on) and estimated with the device-time model (docs/device_time.md); the table's
`CostTable(pe_dtype=Dtype.BF16)` changes nothing for those and costs any fp32 operand left (an
export compiled with `--auto-cast none`) at the bf16 rate. The full depth is
extrapolated linearly: t(L) = t(1) + (L - 1) x (t(2) - t(1)); when the full depth was exported
too (`models/calibration.py --full`), it is compiled and estimated as a check. Published:
Inf2 per-batch P50 latency on one NeuronCore-v2 (batch 4, sequence 128, matmul autocast to
bf16).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.calibration import MODELS, VOCAB, path_of  # noqa: E402
from onnx2bir.api import commands as api  # noqa: E402
from onnx2bir.bir.enums import Dtype, Engine  # noqa: E402
from onnx2bir.runtime.timing.cost import CostTable, estimate  # noqa: E402

PUBLISHED_MS = {"bert_base": 2.95, "distilbert_base": 1.67, "bert_large": 8.73}
TABLE = CostTable(pe_dtype=Dtype.BF16)


def _layer_figures(name: str, layers: int, vocab: int = VOCAB) -> dict:
    module = api.compile(str(path_of(name, layers, vocab))).module
    report = estimate(module, table=TABLE)
    return {
        "seconds": report.total_seconds,
        "pe": report.busy_seconds.get(Engine.PE, 0.0),
        "busiest": max(report.stream_busy_seconds.values()),
        "dma_bytes": report.dma_bytes,
        "compulsory": report.compulsory_dma_bytes,
        "flops": report.flops,
    }


def extrapolate(one: float, two: float, depth: int) -> float:
    return one + (depth - 1) * (two - one)


def rows(names=MODELS, vocab: int = VOCAB) -> list[dict]:
    out = []
    for name in names:
        depth = MODELS[name][4]
        one, two = _layer_figures(name, 1, vocab), _layer_figures(name, 2, vocab)
        row = {key: extrapolate(one[key], two[key], depth) for key in one}
        row.update(name=name, depth=depth, published_ms=PUBLISHED_MS[name], vocab=vocab)
        # What the same program would take if it moved only its compulsory bytes and the PE
        # ran flat out: the larger of the PE busy time and those bytes at the core's DMA rate.
        row["bound"] = max(row["pe"], row["compulsory"] / TABLE.dma_core_bytes_per_s)
        # The full depth itself, when it was exported (`models/calibration.py --full`): a
        # check of the extrapolation.
        full = path_of(name, depth, vocab)
        row["full"] = _layer_figures(name, depth, vocab)["seconds"] if full.exists() else None
        out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    lines = [
        "| model | layers | vocabulary | published (ms) | estimate (ms) | estimate / published "
        "| PE busy (ms) "
        "| full depth compiled (ms) | DMA GB (compulsory) | matmul GFLOP "
        "| PE-and-compulsory-DMA bound (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        full = "not exported" if r["full"] is None else f"{r['full'] * 1e3:.2f}"
        lines.append(
            f"| {r['name']} | {r['depth']} | {r['vocab']:,} | {r['published_ms']:.2f} "
            f"| {r['seconds'] * 1e3:.2f} "
            f"| {r['seconds'] * 1e3 / r['published_ms']:.2f}x | {r['pe'] * 1e3:.2f} | {full} "
            f"| {r['dma_bytes'] / 1e9:.2f} ({r['compulsory'] / 1e9:.2f}) "
            f"| {r['flops'] / 1e9:.0f} | {r['bound'] * 1e3:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", metavar="OUT.md", help="also write the table here")
    parser.add_argument(
        "--vocab", type=int, default=VOCAB, help="the exports' vocabulary (default %(default)s)"
    )
    parser.add_argument("names", nargs="*", default=list(MODELS), help="models (default all)")
    args = parser.parse_args(argv)
    missing = [
        str(path_of(n, k, args.vocab))
        for n in args.names
        for k in (1, 2)
        if not path_of(n, k, args.vocab).exists()
    ]
    if missing:
        print(f"missing exports (run models/calibration.py): {', '.join(missing)}")
        return 2
    text = markdown(rows(args.names, args.vocab))
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
