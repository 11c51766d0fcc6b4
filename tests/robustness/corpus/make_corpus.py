"""Write the minimal bad models of the robustness corpus (run from anywhere; idempotent).

Each file reproduces one defect onnx2bir once had; `tests/robustness/corpus_cases.py` says
what each must now produce (exit status and message). The models are tiny: a node or two.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
F = TensorProto.FLOAT


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=18, extra_opsets=(), value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=value_info)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in extra_opsets]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


X = _vi("x", [1, 4, 8, 8])


def _conv(weight, **attrs):
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)
    return _model([node], [X], [_vi("y", None)], [_const("w", weight)])


def models() -> dict[str, onnx.ModelProto | bytes]:
    ones = np.ones
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    table = _const("table", ones((10, 4), np.float32))
    far = _const("idx", np.array([1, 1 << 62], np.int64))
    mlp = [
        helper.make_node("MatMul", ["a", "w1"], ["h"], name="mm1", domain="com.microsoft"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    rng = np.random.default_rng(0)
    ok = _model([relu], [X], [_vi("y", [1, 4, 8, 8])])
    bad_utf8 = ok.SerializeToString().replace(b"\n\x01x", b"\n\x01\xff")
    ext = _const("s", ones(8, np.float32))
    ext.ClearField("raw_data")
    ext.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "ext_negative_length.bin"), ("offset", "0"), ("length", "-4")):
        entry = ext.external_data.add()
        entry.key, entry.value = key, value
    add = helper.make_node("Add", ["v", "s"], ["y"], name="add")
    return {
        "ok": ok,
        "no_outputs": _model([relu], [X], []),
        "empty_graph": _model([], [X], []),
        "conv_group_exceeds_channels": _conv(ones((8, 1, 3, 3), np.float32), group=8),
        "conv_rank1_weight": _conv(ones(4, np.float32)),
        "conv_channels_disagree": _conv(ones((8, 3, 3, 3), np.float32)),
        "conv_bad_auto_pad": _conv(ones((8, 4, 3, 3), np.float32), auto_pad="BOGUS"),
        "conv_zero_stride": _conv(ones((8, 4, 3, 3), np.float32), strides=[0, 1]),
        "conv_negative_pad": _conv(ones((8, 4, 3, 3), np.float32), pads=[-1, 0, 0, 0]),
        "opset_99": _model([relu], [X], [_vi("y", [1, 4, 8, 8])], opset=99),
        "layernorm_axis_out_of_range": _model(
            [helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", axis=7)],
            [X],
            [_vi("y", None)],
            [_const("s", ones(8, np.float32))],
        ),
        "mlp_com_microsoft_matmul": _model(
            mlp,
            [_vi("a", [1, 12, 24])],
            [_vi("y", [1, 12, 16])],
            [
                _const("w1", rng.standard_normal((24, 40)).astype(np.float32)),
                _const("w2", rng.standard_normal((40, 16)).astype(np.float32)),
            ],
            extra_opsets=[("com.microsoft", 1)],
            value_info=[_vi("h", [1, 12, 40])],
        ),
        "gather_constant_index_out_of_range": _model(
            [helper.make_node("Gather", ["table", "idx"], ["y"], name="gather")],
            [],
            [_vi("y", [2, 4])],
            [table, far],
        ),
        "gather_runtime_table_constant_index": _model(
            [helper.make_node("Gather", ["t", "idx"], ["y"], name="gather")],
            [_vi("t", [10, 4])],
            [_vi("y", [2, 4])],
            [far],
        ),
        "gather_nd_index_out_of_range": _model(
            [helper.make_node("GatherND", ["t", "idx"], ["y"], name="gnd")],
            [_vi("t", [10, 4])],
            [_vi("y", [1])],
            [_const("idx", np.array([[3, 9]], np.int64))],
        ),
        "tensor_of_2_40_elements": _model(
            [helper.make_node("Relu", ["big"], ["y"], name="relu")],
            [_vi("big", [1 << 20, 1 << 20])],
            [_vi("y", [1 << 20, 1 << 20])],
        ),
        "dead_node": _model(
            [relu, helper.make_node("Sigmoid", ["x"], ["unused"], name="dead")],
            [X],
            [_vi("y", [1, 4, 8, 8])],
        ),
        "invalid_utf8_name": bad_utf8,
        "ext_negative_length": _model([add], [_vi("v", [8])], [_vi("y", [8])], [ext]),
    }


def main() -> None:
    for name, model in models().items():
        data = model if isinstance(model, bytes) else model.SerializeToString()
        (HERE / f"{name}.onnx").write_bytes(data)
    (HERE / "ext_negative_length.bin").write_bytes(bytes(64))


if __name__ == "__main__":
    main()
