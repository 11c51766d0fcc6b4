"""A shipped U-Net converts with parallel (multi-buffered) loops, and it and ResNet-18 validate
race-free under a random schedule (docs/buffers.md). (ResNet-18's stem, at 64 x 64, has two
output-row tiles, and both reach into the padding: they are emitted on their own, not as a
loop; docs/memory_planner.md#framed-bands.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
RESNET18 = ROOT / "models" / "resnet18.onnx"
UNET = ROOT / "models" / "unet.onnx"


def _static_loops(block: dict) -> list[dict]:
    found = []
    for item in block["items"]:
        if "body" in item:
            if item.get("kind", "Loop") == "Loop":
                found.append(item)
            found += _static_loops(item["body"])
    return found


def test_unet_convert_has_a_parallel_loop(tmp_path, capsys):
    assert main(["convert", str(UNET), "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "unet.bir.json").read_text())
    loops = [
        loop
        for function in doc["functions"]
        for loop in _static_loops(function["entry"])
        if loop["stop"] - loop["start"] > loop["step"]
    ]
    parallel = [loop for loop in loops if loop["parallel"]]
    assert parallel, "no parallel loop in unet's BIR"
    # The transposed conv's output-row loop and the Relus' channel loops: each trip has its
    # own copy of its tiles. (A loop whose trips share only a read-only tile, a fill's, is
    # parallel without copies.)
    assert set(loop["axis"] for loop in parallel) & set(doc["metadata"]["buffered_loops"])


def test_unet_report_counts_parallel_and_multi_buffered_loops(capsys):
    assert main(["report", str(UNET), "--json"]) == 0
    loops = json.loads(capsys.readouterr().out)["loops"]
    assert loops["parallel"] >= 1 and loops["multi_buffered"] >= 1
    assert loops["static"] == loops["parallel"] + loops["sequential"]
    assert main(["report", str(UNET)]) == 0
    text = capsys.readouterr().out
    assert f"{loops['parallel']} parallel" in text and "multi-buffered" in text


@pytest.mark.parametrize("model", [UNET, RESNET18], ids=["unet", "resnet18"])
def test_validates_race_free_under_a_random_schedule(capsys, model):
    code = main(
        [
            "validate",
            str(model),
            "--check-races",
            "--schedule",
            "random:1",
            "--json",
            "--no-progress",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["passed"]
    assert doc["races"] == [] and doc["schedule"] == "random:1"
