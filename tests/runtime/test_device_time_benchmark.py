"""The pure parts of benchmarks/device_time.py: the FLOPs a model asks for, the critical path's
split, the depth extrapolation and the Inf2 rows' export names (no export needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "bench_device_time", ROOT / "benchmarks" / "device_time.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _model(nodes, inputs, output, initializers):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_model_flops_counts_conv_matmul_and_gemm():
    nodes = [
        # grouped 3x3 conv, 8 -> 16 channels in 2 groups, 10x10 -> 5x5 (stride 2, pad 1)
        helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1], group=2),
        helper.make_node("Flatten", ["c"], ["f"]),  # [2, 400]
        helper.make_node("Gemm", ["f", "g"], ["y"], transB=1),  # [2, 400] x [400, 7]
        helper.make_node("MatMul", ["a", "b"], ["m"]),  # [3, 4, 5] x [5, 6]
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    model = _model(
        nodes,
        {"x": [2, 8, 10, 10], "a": [3, 4, 5]},
        "out",
        {"w": [16, 4, 3, 3], "g": [7, 400], "b": [5, 6]},
    )
    conv = 2 * (2 * 16 * 5 * 5) * (4 * 3 * 3)
    gemm = 2 * (2 * 7) * 400
    matmul = 2 * (3 * 4 * 6) * 5
    assert bench.model_flops(model) == conv + gemm + matmul


def test_gemm_flops_read_the_contraction_from_trans_a():
    nodes = [helper.make_node("Gemm", ["a", "b"], ["y"], transA=1)]  # [5, 2]ᵀ x [5, 3]
    model = _model(nodes, {"a": [5, 2]}, "y", {"b": [5, 3]})
    assert bench.model_flops(model) == 2 * (2 * 3) * 5


def _slice(stream, start, end, cause, node="n", rule="generic.X", opcode="Matmult"):
    ins = SimpleNamespace(
        origin=SimpleNamespace(node=node, rule=rule), opcode=SimpleNamespace(value=opcode)
    )
    return SimpleNamespace(ins=ins, stream=stream, start=start, end=end, cause=cause)


def test_critical_path_split_adds_up_to_the_last_end():
    slices = [
        _slice("DMA q0", 0.0, 2.0, -1, rule="kernel.K", opcode="DmaCopy"),
        _slice("PE", 2.0, 3.0, 0),
        _slice("ACT", 0.0, 0.5, -1),  # not on the path
        # a loop's last trip, shifted: it starts after the slice it waited for had ended
        _slice("DVE", 6.0, 7.0, 1, opcode="TensorCopy"),
        _slice("DMA q3", 7.0, 7.5, 3, rule="kernel.K", opcode="DmaCopy"),
    ]
    split = bench.critical_path_split(slices)
    for counter in split.values():
        assert sum(counter.values()) == pytest.approx(7.5)
    assert split["stream"] == {"DMA": 2.5, "PE": 1.0, "DVE": 4.0}
    assert split["rule"] == {"kernel.K": 2.5, "generic.X": 5.0}
    assert split["opcode"]["DVE TensorCopy"] == 4.0
    assert bench.critical_path_split([]) == {"stream": {}, "rule": {}, "opcode": {}}


def test_extrapolation_is_linear_in_depth():
    assert bench.extrapolate(3.0, 5.0, 12) == 25.0
    assert bench.extrapolate(3.0, 5.0, 1) == 3.0


def test_inf2_rows_name_their_exports():
    rows = bench.inf2_table.ROWS
    assert {r.batch for r in rows.values()} == {1, 8}
    assert [p.name for p in bench.inf2_table.exports_of("vgg16_b1", full=True)] == [
        "inf2_vgg16_b1.onnx"
    ]
    assert [p.name for p in bench.inf2_table.exports_of("vit_base_b1", full=True)] == [
        "inf2_vit_base_b1_L1.onnx",
        "inf2_vit_base_b1_L2.onnx",
        "inf2_vit_base_b1_L12.onnx",
    ]
    assert len(bench.inf2_table.exports_of("bert_base_b1")) == 2
