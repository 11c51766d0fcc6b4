"""Device-time bounds on every model in models/: busiest stream <= estimate <= all busy time."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from onnx2bir.api import commands as api
from onnx2bir.runtime.timing.cost import DEFAULT_TABLE, estimate

MODELS = sorted((Path(__file__).resolve().parents[2] / "models").glob("*.onnx"))


def test_there_are_models():
    assert len(MODELS) >= 10


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_estimate_lies_between_the_busiest_stream_and_all_busy_time(path):
    compilation = api.compile(str(path))
    assert compilation.module is not None, compilation.codegen_error
    report = estimate(compilation.module)
    busy = report.stream_busy_seconds
    slack = 1e-9 * report.total_seconds
    assert max(busy.values()) <= report.total_seconds + slack
    assert report.total_seconds <= sum(busy.values()) + slack
    # Per-kind busy time is the per-stream busy time grouped by engine.
    assert sum(report.busy_seconds.values()) == pytest.approx(sum(busy.values()))
    function = compilation.module.functions[0]
    graph_io = sum(
        math.prod(function.memory_locations[name].shape)
        * function.memory_locations[name].dtype.itemsize
        for name in [*function.inputs, *function.outputs]
    )
    assert graph_io <= report.compulsory_dma_bytes <= report.dma_bytes
    # The steady-state loops agree with simulating every trip one by one. Not exactly: a
    # transfer takes the first gap of the shared DMA bandwidth, so trips that meet other
    # transfers differently stall differently (docs/device_time.md#loops).
    every_trip = dataclasses.replace(DEFAULT_TABLE, loop_warmup=10**9)
    exact = estimate(compilation.module, table=every_trip)
    assert report.total_seconds == pytest.approx(exact.total_seconds, rel=0.03)
    assert report.busy_seconds == pytest.approx(exact.busy_seconds, rel=0.06)


def test_report_json_carries_the_device_time_breakdown():
    doc = api.report(str(MODELS[0].parent / "small_cnn.onnx")).to_json()["cost"]
    for key in ("estimated_seconds", "busy_seconds", "dma_bytes", "model"):  # the old keys
        assert key in doc
    assert doc["busiest_stream_seconds"] <= doc["estimated_seconds"] <= doc["total_busy_seconds"]
    assert set(doc["stream_busy_seconds"]) >= {"PE", "ACT", "DMA q0"}
    assert doc["dma_bytes_compulsory"] + doc["dma_bytes_other"] == doc["dma_bytes"]
    assert 0 < len(doc["top_nodes"]) <= 10 and doc["critical_path"]
    assert 0 < doc["pe_peak_fraction"] < 1
