"""`onnx2bir profile`: a Chrome trace-event file (schema, tracks, dependency order) and an SVG."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from onnx2bir.cli.commands import main
from onnx2bir.reporting import profile as profiler

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"

# The Chrome trace-event format (JSON Object Format) as this writer uses it: metadata events
# ("M") name the process and each thread; complete events ("X") carry ts and dur in us.
TRACE_SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "traceEvents": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["ph", "pid", "name"],
                "properties": {
                    "ph": {"enum": ["X", "M"]},
                    "pid": {"type": "integer"},
                    "tid": {"type": "integer"},
                    "name": {"type": "string"},
                    "args": {"type": "object"},
                },
                "allOf": [
                    {
                        "if": {"properties": {"ph": {"const": "X"}}},
                        "then": {
                            "required": ["tid", "ts", "dur", "args"],
                            "properties": {
                                "ts": {"type": "number", "minimum": 0},
                                "dur": {"type": "number", "minimum": 0},
                                "args": {
                                    "required": ["node", "rule", "bytes", "id", "deps", "waits_for"]
                                },
                            },
                        },
                    },
                    {
                        "if": {"properties": {"ph": {"const": "M"}}},
                        "then": {
                            "properties": {
                                "name": {
                                    "enum": ["process_name", "thread_name", "thread_sort_index"]
                                }
                            }
                        },
                    },
                ],
            },
        },
    },
}


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def check_trace(doc: dict) -> None:
    jsonschema.validate(doc, TRACE_SCHEMA)
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and {e["tid"] for e in slices} <= set(names)
    eps = 1e-6  # us
    # Each track runs one instruction at a time.
    by_track: dict[int, list[dict]] = {}
    for e in slices:
        by_track.setdefault(e["tid"], []).append(e)
    for track in by_track.values():
        track.sort(key=lambda e: e["ts"])
        for a, b in zip(track, track[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + eps, (names[a["tid"]], a, b)
    # No slice starts before the slices it depends on end. Each slice names the instances
    # (`waits_for`) of its dependencies (`deps`, instruction ids) it waited for.
    by_instance = {e["args"]["instance"]: e for e in slices}
    checked = 0
    for e in slices:
        sources = [by_instance[n] for n in e["args"]["waits_for"]]
        assert {s["args"]["id"] for s in sources} <= set(e["args"]["deps"])
        for source in sources:
            assert source["ts"] + source["dur"] <= e["ts"] + eps, (e, source)
            checked += 1
    assert checked, "no dependency edge was checked"


def test_profile_resnet18_writes_a_trace_and_a_picture(tmp_path, capsys):
    trace, svg = tmp_path / "t.json", tmp_path / "t.svg"
    code, out, _ = run(
        ["profile", MODELS / "resnet18.onnx", "--trace", trace, "--svg", svg], capsys
    )
    assert code == 0 and "estimated device time" in out
    doc = json.loads(trace.read_text())
    check_trace(doc)
    tracks = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"PE", "ACT", "DVE", "POOL"} <= tracks and {f"DMA q{q}" for q in range(16)} <= tracks
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in slices} >= {"Matmult", "DmaCopy", "Activation"}
    matmul = next(e for e in slices if e["name"] == "Matmult")
    assert matmul["args"]["node"] and matmul["args"]["rule"]
    assert any(e["args"]["bytes"] > 0 for e in slices if e["name"] == "DmaCopy")
    # The trace's end is the estimate `report` gives (every resnet18 loop fits the exact mode).
    end = max(e["ts"] + e["dur"] for e in slices)
    assert end == pytest.approx(doc["otherData"]["estimated_seconds"] * 1e6)
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")
    assert sum(1 for el in root.iter() if el.tag.endswith("rect")) > 20


@pytest.mark.parametrize("model", ["loop_cumsum", "long_attention", "mha"])
def test_steady_state_copies_keep_tracks_and_dependency_order(model, monkeypatch, tmp_path):
    """With the exact mode off, loops run in steady state and later trips are drawn as copies."""
    from onnx2bir.api import commands as api

    monkeypatch.setattr(profiler, "EXACT_LIMIT", 0)
    module = api.compile(str(MODELS / f"{model}.onnx")).module
    profile = profiler.build_profile(model, module)
    assert not profile.exact
    check_trace(profiler.trace_document(profile))


def test_profile_json_and_bad_outputs(tmp_path, capsys):
    trace = tmp_path / "t.json"
    code, out, _ = run(["profile", MODELS / "small_cnn.onnx", "--trace", trace, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["written"] == [str(trace)] and doc["slices"] > 0 and "PE" in doc["tracks"]
    folder = tmp_path / "a_folder"
    folder.mkdir()
    code, _, err = run(["profile", MODELS / "small_cnn.onnx", "--trace", folder], capsys)
    assert code == 2 and err.count("\n") == 1 and "is a folder" in err
    # An existing folder where the SVG should go: refused before either file is written.
    fresh = tmp_path / "fresh.json"
    code, _, err = run(
        ["profile", MODELS / "small_cnn.onnx", "--trace", fresh, "--svg", folder], capsys
    )
    assert code == 2 and "--svg" in err and not fresh.exists()
    # A new folder for the SVG is created (a creatable folder is a valid place for an output).
    svg_new = tmp_path / "new" / "t.svg"
    code, _, _ = run(
        ["profile", MODELS / "small_cnn.onnx", "--trace", fresh, "--svg", svg_new], capsys
    )
    assert code == 0 and svg_new.read_text(encoding="utf-8").startswith("<svg")
