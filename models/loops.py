"""Write the two ONNX `Loop` models of the zoo, built with onnx's helper (no torch needed).

Out, next to this script (opset 18, static shapes, no external data):

- ``loop_cumsum.onnx``: input ``x`` f32[8] and the trip count ``M`` i64 scalar; output ``y`` =
  Σ_{i<M} (x + i), a loop-carried accumulator and the iteration number read by the body. The
  trip count is known only at run time, so it lowers to a DynamicFor loop.
- ``loop_while.onnx``: input ``x`` f32[8]; output ``y`` = x grown by |x| + 1 per trip while
  sum(y) < 64 (tested before the first trip). The trip count depends on the data, so it lowers
  to a test-before DoWhile.

Run: ``python models/loops.py``. It checks both models with onnx's checker and prints what
onnxruntime computes for a sample input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
N = 8
OPSET = 18
IR_VERSION = 10


def _scalar(name: str, elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, [])


def _vector(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [N])


def _body(name: str, nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
    return helper.make_graph(
        nodes,
        name,
        [_scalar("i", TensorProto.INT64), _scalar("cond", TensorProto.BOOL), _vector("acc")],
        [_scalar("cond_out", TensorProto.BOOL), _vector("acc_out")],
    )


def _model(name: str, nodes, inputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, [_vector("y")], initializer=initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def cumsum_model() -> onnx.ModelProto:
    body = _body(
        "cumsum_body",
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["acc", "x"], ["t"]),
            helper.make_node("Add", ["t", "i_f"], ["acc_out"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
    )
    loop = helper.make_node("Loop", ["M", "keep_going", "zero"], ["y"], body=body)
    return _model(
        "loop_cumsum",
        [loop],
        [_vector("x"), _scalar("M", TensorProto.INT64)],
        [
            numpy_helper.from_array(np.array(True), "keep_going"),
            numpy_helper.from_array(np.zeros(N, np.float32), "zero"),
        ],
    )


def while_model() -> onnx.ModelProto:
    body = _body(
        "grow_body",
        [
            helper.make_node("Abs", ["x"], ["ax"]),
            helper.make_node("Add", ["acc", "ax"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
        ],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["start_total"], keepdims=0),
        helper.make_node("Less", ["start_total", "limit"], ["go"]),
        helper.make_node("Loop", ["", "go", "x"], ["y"], body=body),
    ]
    return _model(
        "loop_while",
        nodes,
        [_vector("x")],
        [
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(64.0, np.float32), "limit"),
        ],
    )


def main() -> None:
    import onnxruntime as ort

    x = np.linspace(-1, 1, N, dtype=np.float32)
    for model, feeds in (
        (cumsum_model(), {"x": x, "M": np.array(5, np.int64)}),
        (while_model(), {"x": x}),
    ):
        path = HERE / f"{model.graph.name}.onnx"
        onnx.save(model, path)
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        print(f"{path.name}: {path.stat().st_size} bytes, y = {session.run(None, feeds)[0]}")


if __name__ == "__main__":
    main()
