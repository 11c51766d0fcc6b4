"""Write ``depthwise_upsample.onnx``: two depthwise ConvTranspose upsamplers (no torch needed).

Out, next to this script (opset 18, static shapes, no external data): input ``x`` f32
1x8x6x6, output ``y`` f32 1x8x24x25.

1. ``up_fixed``: ConvTranspose 4x4, stride 2, pads 1, group 8, learned (constant) weights
   [8, 1, 4, 4] stored as ONNX stores them (io01), bias; then Relu.
2. ``up_predicted``: ConvTranspose 2x3, stride 2, group 8, whose filter is predicted from the
   input (kernel prediction): GlobalAveragePool → MatMul → Reshape to [8, 1, 3, 2] → Transpose
   (0, 1, 3, 2) → [8, 1, 2, 3]. The filter is computed, so the Transpose stays in the graph.

TransformConvOp sends the first to conv2d_column_packing_1 and the second, read through its
Transpose (kernel layout io10), to conv2d_column_packing_io10 (docs/conv_backward.md).

Run: ``python models/depthwise_upsample.py``; it checks the model and prints onnxruntime's
output range for a sample input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT_PATH = Path(__file__).resolve().parent / "depthwise_upsample.onnx"
C = 8


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {
        "w_fixed": (rng.standard_normal((C, 1, 4, 4)) / 4).astype(np.float32),
        "b_fixed": (rng.standard_normal(C) / 10).astype(np.float32),
        "predictor": (rng.standard_normal((1, 6)) / 2).astype(np.float32),
        "vector_shape": np.array([C, 1], np.int64),
        "filter_shape": np.array([C, 1, 3, 2], np.int64),
    }
    nodes = [
        helper.make_node(
            "ConvTranspose",
            ["x", "w_fixed", "b_fixed"],
            ["u"],
            name="up_fixed",
            group=C,
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["u"], ["r"]),
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
        helper.make_node("Reshape", ["pooled", "vector_shape"], ["v"]),
        helper.make_node("MatMul", ["v", "predictor"], ["taps"]),
        helper.make_node("Reshape", ["taps", "filter_shape"], ["f"]),
        helper.make_node("Transpose", ["f"], ["w_predicted"], perm=[0, 1, 3, 2]),
        helper.make_node(
            "ConvTranspose",
            ["r", "w_predicted"],
            ["y"],
            name="up_predicted",
            group=C,
            strides=[2, 2],
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "depthwise_upsample",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 24, 25])],
        [numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    import onnxruntime as ort

    onnx.save(build(), OUT_PATH)
    session = ort.InferenceSession(OUT_PATH, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, C, 6, 6)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    size = OUT_PATH.stat().st_size
    print(f"{OUT_PATH.name}: {size} bytes, y {y.shape} in [{y.min()}, {y.max()}]")


if __name__ == "__main__":
    main()
