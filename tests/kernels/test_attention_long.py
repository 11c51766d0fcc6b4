"""The flash-style attention kernel at long sequences, raised from an opset-23 Attention node
with both flags: validation against onnxruntime (slow), SBUF independent of the length,
causal tile skipping in the PE time, and tile shapes taken from the backend_config.

The bf16 bound is the kernel tests' (tests/kernels/test_attention_kernel.py): q, kᵀ, v and P
rounded to bf16 (u = 2^-8), fp32 accumulation and statistics; with s = 1/√D the output moves
by about (1 + √D·s)·u·max|v| = 2u·max|v| absolute, 2u relative.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.bir.enums import Engine, Opcode
from onnx2bir.compiler import compile_graph, compile_model
from onnx2bir.frontend.importer import import_model
from onnx2bir.patterns.attention.raising import LowerToCustomNativeKernel
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs
from onnx2bir.runtime.timing import cost

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_attention import RAISE, attention_model, sb_high_water  # noqa: E402

U = 2.0**-8


def compiled(seq: int, causal: bool):
    compilation = compile_model(attention_model(seq, causal), RAISE)
    (entry,) = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    assert entry["status"] == "raised", entry["reason"]
    return compilation


def pe_busy(compilation) -> float:
    return cost.estimate(compilation.module).busy_seconds[Engine.PE]


def test_causal_block_skips_the_tiles_above_the_diagonal():
    """At 4096 tokens the causal block's PE time is at most 55% of the full block's."""
    full, causal = compiled(4096, False), compiled(4096, True)
    assert causal.passes.result_of("LowerToCustomNativeKernel").findings[0]["target"] == (
        "CausalAttentionMMSoftmaxMMWithoutSwap"
    )
    assert pe_busy(causal) <= 0.55 * pe_busy(full)


@pytest.mark.slow
def test_sbuf_high_water_does_not_grow_with_the_length():
    """32768 keys compile and reserve exactly the SBUF of 16384: K and V are held one
    8192-key section at a time; 4096 keys (one shorter section) take less. (Without the memory
    planner, whose arenas sit at the top of SBUF, the highest byte is the kernel's own.)"""
    no_plan = dataclasses.replace(RAISE, memory_plan=False)
    for causal in (False, True):
        highs = [
            sb_high_water(compile_model(attention_model(n, causal), no_plan).module)
            for n in (4096, 16384, 32768)
        ]
        assert highs[0] < highs[1] == highs[2] < 64 * 1024


def _validate(seq: int, causal: bool) -> None:
    model = attention_model(seq, causal)
    compilation = compile_model(model, RAISE)
    feeds = synthesize_inputs(compilation.graph, 0)
    got = run_function(compilation.module, feeds)
    got = got["y"] if "y" in got else got["y:output"]
    expected = run_onnxruntime(model, feeds)["y"]
    result = compare_output("y", got, expected, 2 * U * np.abs(feeds["v"]).max(), 2 * U)
    assert result.passed, result.to_json()
    assert result.cosine > 0.9999


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_4096_tokens_validate_within_the_bf16_bound(causal):
    _validate(4096, causal)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_16384_tokens_validate_within_the_bf16_bound(causal):
    _validate(16384, causal)


def test_sb_shape_in_the_backend_config_drives_the_tiles():
    """Smaller query groups and key tiles: a different instruction stream, the same numbers."""
    model = attention_model(1040, True, head_dim=32)
    feeds = synthesize_inputs(import_model(model), 0)
    expected = run_onnxruntime(model, feeds)["y"]
    streams = []
    for sb_shape in (None, [64, 128, 0]):
        graph = import_model(model)
        LowerToCustomNativeKernel().run(graph, RAISE)
        (call,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
        if sb_shape:
            config = json.loads(call["attrs"]["backend_config"])
            call["attrs"]["backend_config"] = json.dumps({**config, "sb_shape": sb_shape})
        compilation = compile_graph(graph, RAISE, passes=[])
        got = run_function(compilation.module, feeds)
        got = got["y"] if "y" in got else got["y:output"]
        result = compare_output("y", got, expected, 2 * U * np.abs(feeds["v"]).max(), 2 * U)
        assert result.passed, (sb_shape, result.to_json())
        matmuls = [
            i.srcs["moving"].shape
            for i in compilation.module.functions[0].instructions()
            if i.opcode is Opcode.MATMULT and "kernel" in i.origin.rule
        ]
        streams.append(matmuls)
    default, small = streams
    assert default != small
    assert max(shape[-1] for shape in small) == 128 < max(shape[-1] for shape in default)
