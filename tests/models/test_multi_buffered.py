"""ResNet-18 converts with a parallel (multi-buffered) loop and validates race-free under a
random schedule (docs/buffers.md)."""

from __future__ import annotations

import json
from pathlib import Path

from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
RESNET18 = ROOT / "models" / "resnet18.onnx"


def _static_loops(block: dict) -> list[dict]:
    found = []
    for item in block["items"]:
        if "body" in item:
            if item.get("kind", "Loop") == "Loop":
                found.append(item)
            found += _static_loops(item["body"])
    return found


def test_resnet18_convert_has_a_parallel_loop(tmp_path, capsys):
    assert main(["convert", str(RESNET18), "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "resnet18.bir.json").read_text())
    loops = [
        loop
        for function in doc["functions"]
        for loop in _static_loops(function["entry"])
        if loop["stop"] - loop["start"] > loop["step"]
    ]
    parallel = [loop for loop in loops if loop["parallel"]]
    assert parallel, "no parallel loop in resnet18's BIR"
    # The stem conv's output-row loop: each trip has its own copy of band, out and acc. (A
    # loop whose trips share only a read-only tile, a fill's, is parallel without copies.)
    assert set(loop["axis"] for loop in parallel) & set(doc["metadata"]["buffered_loops"])


def test_resnet18_report_counts_parallel_and_multi_buffered_loops(capsys):
    assert main(["report", str(RESNET18), "--json"]) == 0
    loops = json.loads(capsys.readouterr().out)["loops"]
    assert loops["parallel"] >= 1 and loops["multi_buffered"] >= 1
    assert loops["static"] == loops["parallel"] + loops["sequential"]
    assert main(["report", str(RESNET18)]) == 0
    text = capsys.readouterr().out
    assert f"{loops['parallel']} parallel" in text and "multi-buffered" in text


def test_resnet18_validates_race_free_under_a_random_schedule(capsys):
    code = main(
        [
            "validate",
            str(RESNET18),
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
