"""The depthwise kernels (onnx2bir.kernels.conv.depthwise) against onnxruntime.

Each case is a one-Conv model with group = C and seeded random weights (and bias) as
initializers, compiled with the default passes. The test asserts that TransformConvOp chose
the kernel (and which registry row), that the module holds the kernel's instructions (the 2-D
kernel's matmuls against its diagonal taps, none for the 1-D kernel), that the BIR verifies,
and that the machine's output matches onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import Opcode
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen.driver import CodegenError
from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.kernels.conv import depthwise as conv_depthwise
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.selection import CONV1D_DEPTHWISE, CONV2D_DEPTHWISE, TransformConvOp
from onnx2bir.patterns.passes import PassManager
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast

ATOL, RTOL = 1e-4, 1e-3
IR_VERSION = 10  # onnxruntime reads IR 10 (opsets up to 21)


def depthwise_model(x_shape, kernel, bias: bool, seed: int, **attrs) -> onnx.ModelProto:
    """y = Conv(x, w[, b]) with group = C; w [C, 1, *kernel] and b [C] seeded initializers."""
    rng = np.random.default_rng(seed)
    channels = x_shape[1]
    inits = {"w": rng.standard_normal((channels, 1, *kernel)).astype(np.float32)}
    if bias:
        inits["b"] = rng.standard_normal(channels).astype(np.float32)
    node = helper.make_node("Conv", ["x", *inits], ["y"], group=channels, **attrs)
    graph = helper.make_graph(
        [node],
        "depthwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(value, name) for name, value in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def finding(compilation) -> dict:
    (only,) = compilation.passes.result_of("TransformConvOp").findings
    return only


def check(model: onnx.ModelProto, kernel: str, entry: str, seed: int = 0) -> dict:
    """Compile, check the selection and the emitted BIR, run, compare; returns the finding."""
    compilation = compile_model(model, FP32)
    found = finding(compilation)
    assert (found["kernel"], found["registry_entry"]) == (kernel, entry), found["walk"]
    rule = f"kernel.{kernel}"
    emitted = [i for i in compilation.module.functions[0].instructions() if i.origin.rule == rule]
    assert emitted, f"no instruction with origin rule {rule}"
    matmuls = [i for i in emitted if i.opcode is Opcode.MATMULT]
    if kernel == CONV2D_DEPTHWISE:  # one matmul per tap, diag(w[:, tap]) stationary
        assert matmuls and {
            i.srcs["stationary"].loc.split("/")[-1].split("#")[0] for i in matmuls
        } == {"diag"}
    else:
        assert not matmuls, "the 1-D kernel used the PE array"
    problems = verify_module(compilation.module)
    assert not problems, "\n".join(problems[:10])
    feeds = synthesize_inputs(compilation.graph, seed)
    got = run_function(compilation.module, feeds)
    expected = run_onnxruntime(model, feeds)["y"]
    result = compare_output("y", got["y"], expected, ATOL, RTOL)
    assert result.passed, result.to_json()
    return found


# --- 2-D: conv2d_depthwise_f01b_o01i_bf01 (registry priority 5) --------------------------------

# (x shape [N, C, H, W], kernel, bias, attributes)
CASES_2D = {
    "c8_3x3_pad1_bias": ((1, 8, 9, 9), (3, 3), True, {"pads": [1, 1, 1, 1]}),
    "c32_5x5_s2_asym_b2": (
        (2, 32, 10, 11),
        (5, 5),
        False,
        {"strides": [2, 2], "pads": [2, 1, 1, 2]},
    ),
    "c130_3x3_d2": ((1, 130, 8, 8), (3, 3), True, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "c200_1x7_b2": ((2, 200, 7, 9), (1, 7), True, {"pads": [0, 3, 0, 3]}),
    "c8_3x3_s3_valid": ((1, 8, 13, 14), (3, 3), False, {"strides": [3, 3]}),
    "c32_5x5_s3_d2_asym": (
        (1, 32, 16, 15),
        (5, 5),
        True,
        {"strides": [3, 3], "dilations": [2, 2], "pads": [4, 3, 2, 1]},
    ),
    "c200_3x3_s2_d2_b2_unpadded": (
        (2, 200, 11, 10),
        (3, 3),
        False,
        {"strides": [2, 2], "dilations": [2, 2]},
    ),
    "c130_5x5_same_upper": (
        (1, 130, 7, 8),
        (5, 5),
        True,
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    ),
    "c8_3x3_same_lower_even": ((2, 8, 6, 7), (3, 3), False, {"auto_pad": "SAME_LOWER"}),
    "c32_3x5_mixed_stride_dilation": (
        (1, 32, 12, 13),
        (3, 5),
        True,
        {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 0, 3]},
    ),
    "c8_1x7_high_pad_only": ((1, 8, 6, 10), (1, 7), True, {"pads": [0, 0, 2, 5]}),
    # Output 3 x 1040: wider than one 512-column tile (two whole tiles and a remainder).
    "c8_3x3_wide": ((1, 8, 3, 1040), (3, 3), True, {"pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("case", list(CASES_2D))
def test_conv2d_depthwise_matches_onnxruntime(case: str) -> None:
    x_shape, kernel, bias, attrs = CASES_2D[case]
    seed = sorted(CASES_2D).index(case)
    check(
        depthwise_model(x_shape, kernel, bias, seed, **attrs),
        CONV2D_DEPTHWISE,
        "conv2d_depthwise",
        seed,
    )


def test_conv2d_depthwise_small_tiles_loop_over_every_axis(monkeypatch) -> None:
    """Tiny tiles (one row of 4 columns): BIR loops over channel tiles (260 = 2 x 128 + 4),
    batch, output rows and columns (10 = 4 + 4 + 2), each with a leftover tile after the
    loop."""
    monkeypatch.setattr(conv_depthwise, "MATMUL_MAX_MOVING_FREE", 4)
    model = depthwise_model((2, 260, 11, 10), (3, 3), True, 7, pads=[1, 2, 1, 0])
    check(model, CONV2D_DEPTHWISE, "conv2d_depthwise", seed=7)


def test_stride3_depthwise_takes_row_5_never_the_shadowed_row() -> None:
    """Row 6 (depthwise_forward_s3) accepts only stride [3, 3], which row 5 accepts first."""
    model = depthwise_model((1, 32, 12, 12), (3, 3), True, 3, strides=[3, 3], pads=[1, 1, 1, 1])
    found = check(model, CONV2D_DEPTHWISE, "conv2d_depthwise", seed=3)
    assert "depthwise_forward_s3" not in [step["entry"] for step in found["walk"]]


def test_filter_too_big_for_one_pixel_fails_with_reason() -> None:
    model = depthwise_model((1, 8, 130, 130), (130, 130), False, 0)
    with pytest.raises(CodegenError, match="does not fit the 49152-byte band for one output"):
        compile_model(model, FP32)


# --- 1-D: Conv1d_depthwise_bf01_oi01_bf01 (registry priority 3) --------------------------------

# (x shape [N, C, L], kernel, bias, attributes)
CASES_1D = {
    "c8_k3_pad1_bias": ((1, 8, 20), (3,), True, {"pads": [1, 1]}),
    "c32_k5_s2_d2_asym_b2": (
        (2, 32, 31),
        (5,),
        False,
        {"strides": [2], "dilations": [2], "pads": [3, 1]},
    ),
    "c130_k3_d2": ((1, 130, 17), (3,), True, {"dilations": [2], "pads": [2, 2]}),
    "c200_k5_s2_valid_b2": ((2, 200, 40), (5,), True, {"strides": [2]}),
    "c32_k5_same_upper": ((1, 32, 23), (5,), False, {"auto_pad": "SAME_UPPER", "strides": [2]}),
    # Output length 2100: longer than one 2048-position tile.
    "c8_k3_long": ((1, 8, 2100), (3,), True, {"pads": [1, 1]}),
    # Stride 20: a 2048-position band would not fit, so the tile shortens (2500 outputs).
    "c8_k3_s20_long": ((1, 8, 50000), (3,), False, {"strides": [20], "pads": [1, 1]}),
}


@pytest.mark.parametrize("case", list(CASES_1D))
def test_conv1d_depthwise_matches_onnxruntime(case: str) -> None:
    x_shape, kernel, bias, attrs = CASES_1D[case]
    seed = sorted(CASES_1D).index(case)
    found = check(
        depthwise_model(x_shape, kernel, bias, seed, **attrs),
        CONV1D_DEPTHWISE,
        "conv1d_depthwise",
        seed,
    )
    # Row 3 wins before the 2-D depthwise row (5) is ever tried.
    assert "conv2d_depthwise" not in [step["entry"] for step in found["walk"]]


def test_conv1d_depthwise_short_tiles_loop(monkeypatch) -> None:
    """Tiles of 7 positions: loops over channel tiles, batch and positions, plus leftovers."""
    monkeypatch.setattr(conv_depthwise, "MAX_TILE_LENGTH", 7)
    model = depthwise_model((2, 260, 33), (3,), True, 5, strides=[1], pads=[2, 1])
    check(model, CONV1D_DEPTHWISE, "conv1d_depthwise", seed=5)


def test_unit_height_2d_conv_takes_the_1d_row() -> None:
    """A 2-D depthwise conv with height 1 everywhere (no height padding) is 1-D to the
    selector, so row 3 takes it."""
    model = depthwise_model((2, 8, 1, 16), (1, 3), True, 2, pads=[0, 1, 0, 1])
    check(model, CONV1D_DEPTHWISE, "conv1d_depthwise", seed=2)


def test_unit_height_with_height_padding_takes_the_2d_row() -> None:
    model = depthwise_model((1, 8, 1, 16), (1, 3), True, 4, pads=[1, 1, 1, 1])
    found = check(model, CONV2D_DEPTHWISE, "conv2d_depthwise", seed=4)
    assert {"entry": "conv1d_depthwise", "refused": "not 1-D (height is not 1)"} in found["walk"]


def test_depth_multiplier_two_is_not_depthwise() -> None:
    """C_out = 2·C with group = C: neither depthwise row accepts it (selection only)."""
    rng = np.random.default_rng(0)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=4, pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "multiplier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])],
        [numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype(np.float32), "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    manager = PassManager([TransformConvOp()])
    manager.run(import_graph(model), CompileOptions())
    (found,) = manager.result_of("TransformConvOp").findings
    assert found["kernel"] not in (CONV1D_DEPTHWISE, CONV2D_DEPTHWISE)
    refused = {step["entry"] for step in found["walk"]}
    assert {"conv1d_depthwise", "conv2d_depthwise"} <= refused
