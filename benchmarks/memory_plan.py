"""DMA traffic with and without the memory planner, per model (docs/memory_planner.md).

Usage: python benchmarks/memory_plan.py [--markdown OUT.md]

Models: the nine onnx light models with seeded random weights (`python models/light.py NAME`
writes them to models/.cache/) and the CNNs of models/. For each: the compulsory DMA bytes
(weights, constants, graph inputs and outputs, once each), all DMA bytes with the planner off
and on, their ratio to the compulsory bytes, the SBUF high-water mark per partition, and how
many intermediate tensors stay in DRAM. Figures come from the cost model's byte count
(runtime/timing/cost.py), which counts every DMA instance.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onnx2bir.api import commands as api  # noqa: E402
from onnx2bir.runtime.timing.cost import estimate  # noqa: E402

LIGHT = [
    "alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]
ZOO = ["small_cnn", "resnet18", "mobilenetv3", "unet", "speech_conv1d", "depthwise_upsample"]


def _paths() -> list[tuple[str, Path]]:
    found = [(f"light_{n}", ROOT / "models" / ".cache" / f"light_{n}_s0.onnx") for n in LIGHT]
    found += [(name, ROOT / "models" / f"{name}.onnx") for name in ZOO]
    return [(name, path) for name, path in found if path.is_file()]


def measure(path: Path) -> dict:
    off = estimate(api.compile(str(path), memory_plan=False).module)
    start = time.perf_counter()
    compiled = api.compile(str(path))
    seconds = time.perf_counter() - start
    on = estimate(compiled.module)
    plan = compiled.details.memory_plan
    counts = plan.counts()
    return {
        "compulsory": on.compulsory_dma_bytes,
        "off": off.dma_bytes,
        "on": on.dma_bytes,
        "time_off": off.total_seconds,
        "time_on": on.total_seconds,
        "sbuf": plan.sbuf_high_water,
        "resident": counts["resident"],
        "dram": counts["dram"],
        "convert_s": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args()
    lines = [
        "| model | compulsory MB | DMA MB, plan off | DMA MB, plan on | on / compulsory "
        "| device time off → on (µs) | SBUF high-water (B/partition) | tensors in SBUF / DRAM |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, path in _paths():
        f = measure(path)
        lines.append(
            f"| {name} | {f['compulsory'] / 1e6:.1f} | {f['off'] / 1e6:.1f} | "
            f"{f['on'] / 1e6:.1f} | {f['on'] / max(1, f['compulsory']):.2f}x | "
            f"{f['time_off'] * 1e6:.0f} → {f['time_on'] * 1e6:.0f} | {f['sbuf']} | "
            f"{f['resident']} / {f['dram']} |"
        )
        print(lines[-1], flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
