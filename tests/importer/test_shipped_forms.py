"""What exporters other than torch's write, each as a small hand-built model: it compiles and
its numbers match onnxruntime's, or it is refused as not compiling with every reason.

One model per cause found on trained models shipped in packages (docs/input_contracts.md):
an If steered by an input (`--input-value`), an initializer only a branch reads, an opset-12
Unsqueeze in a shape chain, paddle2onnx's "?" and -1 dims, a declared output shape onnx
infers otherwise, an IR-3 initializer that is not an input, ops of other domains.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2bir
from onnx2bir.errors import CompileError, UserError
from onnx2bir.frontend.importer import import_model, import_parts
from onnx2bir.runtime.oracle.ort import run_onnxruntime

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _rate_model(with_foldable: bool = False) -> onnx.ModelProto:
    """y = relu(x) when sr == 16000, else x * W; W is read only inside the else branch."""
    weight = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "W")
    then_branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["then_y"])],
        "then",
        [],
        [helper.make_tensor_value_info("then_y", F, None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "W"], ["else_y"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_y", F, None)],
    )
    nodes = [
        helper.make_node("Equal", ["sr", "rate"], ["is_16k"]),
        helper.make_node("If", ["is_16k"], ["y"], then_branch=then_branch, else_branch=else_branch),
    ]
    inits = [numpy_helper.from_array(np.array(16000, np.int64), "rate"), weight]
    outputs = [helper.make_tensor_value_info("y", F, [2, 3])]
    if with_foldable:  # a node that folds in the first round, while the If stays
        nodes.append(helper.make_node("Add", ["one", "one"], ["two"]))
        nodes.append(helper.make_node("Mul", ["x", "two"], ["z"]))
        inits.append(numpy_helper.from_array(np.ones((1,), np.float32), "one"))
        outputs.append(helper.make_tensor_value_info("z", F, [2, 3]))
    graph = helper.make_graph(
        nodes,
        "rate",
        [
            helper.make_tensor_value_info("x", F, [2, 3]),
            helper.make_tensor_value_info("sr", I64, []),
        ],
        outputs,
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


def _matches_onnxruntime(model, result, extra_feeds=()) -> None:
    """The machine's outputs against onnxruntime on the original model, independently of the
    verdict (fp32 program: exact up to summation order)."""
    expected = run_onnxruntime(model, {**result.inputs, **dict(extra_feeds)})
    for name, value in result.outputs.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rate", [16000, 8000])
def test_if_branch_chosen_by_input_value(rate):
    model = _rate_model()
    result = onnx2bir.validate(model, input_values={"sr": [rate]}, auto_cast="none")
    assert result.passed
    assert "sr" not in result.inputs  # a constant of the program now
    _matches_onnxruntime(model, result, {"sr": np.array(rate, np.int64)})
    x = result.inputs["x"]
    want = np.maximum(x, 0) if rate == 16000 else x * np.linspace(-1, 1, 6).reshape(2, 3)
    np.testing.assert_allclose(result.outputs["y"], want, rtol=1e-6)


def test_if_on_a_runtime_input_is_refused_with_the_flag_that_fixes_it():
    with pytest.raises(CompileError) as caught:
        onnx2bir.compile(_rate_model())
    message = str(caught.value)
    assert message.startswith("unsupported ops in") and "If x1" in message
    assert "--input-value sr=V" in message


def test_initializer_read_only_by_a_branch_survives_folding():
    # Before: the first fold round dropped W (no top-level node reads it); in a branch that
    # onnx infers (silero-vad's) the second shape inference then failed with "Input 0 expected
    # to have type but instead is null".
    imported = import_parts(_rate_model(with_foldable=True))
    assert "z" not in {n.output[0] for n in imported.folded.graph.node if n.op_type == "Add"}
    assert "W" in {init.name for init in imported.folded.graph.initializer}
    with pytest.raises(CompileError, match="--input-value sr=V"):
        onnx2bir.compile(_rate_model(with_foldable=True))
    result = onnx2bir.validate(
        _rate_model(with_foldable=True), input_values={"sr": [8000]}, auto_cast="none"
    )
    assert result.passed


def test_input_value_errors_name_the_input():
    model = _rate_model()
    for values, words in (
        ({"sr": [8000.5]}, "give integers"),
        ({"sr": [1, 2]}, "do not fill"),
        ({"rate_hz": [1]}, "the model's inputs are: x, sr"),
    ):
        with pytest.raises(UserError, match=words):
            onnx2bir.compile(model, input_values=values)
    with pytest.raises(UserError, match="another value"):
        onnx2bir.validate(
            model,
            {"x": np.zeros((2, 3), np.float32), "sr": np.array(8000)},
            input_values={"sr": [16000]},
        )


def test_opset12_unsqueeze_shape_chain_folds():
    # Shape -> Gather -> Unsqueeze(axes attribute, opset 12) -> Concat -> Reshape: the
    # reference evaluator must run Unsqueeze-11, not Unsqueeze-13 (axes as an input).
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch"], ["batch_1d"], axes=[0]),
        helper.make_node("Concat", ["batch_1d", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "unsqueeze12",
        [helper.make_tensor_value_info("x", F, ["n", 2, 3])],
        [helper.make_tensor_value_info("y", F, None)],
        [
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)
    result = onnx2bir.validate(model, dims={"n": 4}, auto_cast="none")
    assert result.passed
    assert result.outputs["y"].shape == (4, 6)
    _matches_onnxruntime(model, result)


def _paddle_style_model() -> onnx.ModelProto:
    """paddle2onnx's conventions: "?" for every unknown input dim, -1 in the output's."""
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("ReduceMean", ["r"], ["y"], axes=[3]),
        ],
        "paddle",
        [helper.make_tensor_value_info("x", F, [1, 3, "?", "?"])],
        [helper.make_tensor_value_info("y", F, [-1, 3, -1, 1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


def test_question_mark_dims_are_distinct_unknowns():
    model = _paddle_style_model()
    result = onnx2bir.validate(model, input_shapes={"x": (1, 3, 48, 192)}, auto_cast="none")
    assert result.passed
    assert result.outputs["y"].shape == (1, 3, 48, 1)
    _matches_onnxruntime(model, result)
    # the same sizes from the arrays given as inputs
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 20)).astype(np.float32)
    assert onnx2bir.validate(model, {"x": x}, auto_cast="none").passed
    # -1 in the declared output is "unknown", not a contradiction: no note
    assert not [n for n in result.document["notes"] if n["flag"] == "model"]


def test_unset_question_mark_dims_are_listed_each():
    with pytest.raises(UserError) as caught:
        onnx2bir.compile(_paddle_style_model())
    message = str(caught.value)
    assert "input 'x' dim 2" in message and "input 'x' dim 3" in message
    assert "--dim ?=" not in message


def test_declared_output_shape_that_contradicts_inference_is_overridden_with_a_note():
    # ReduceSum without axes, keepdims=0: a scalar; the file declares 2x1 (onnxruntime warns
    # and runs it).
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)],
        "declared",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    result = onnx2bir.validate(model, auto_cast="none")
    assert result.passed
    assert result.outputs["y"].shape == ()
    _matches_onnxruntime(model, result)
    notes = [n["message"] for n in result.document["notes"] if n["flag"] == "model"]
    assert notes == [
        "graph output 'y' is declared 2x1 but computed as a scalar; the computed "
        "shape is used, as onnxruntime does"
    ]


def test_ir3_initializer_that_is_not_an_input():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        "ir3",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
        [numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    model.ir_version = 3
    result = onnx2bir.validate(model, auto_cast="none")
    assert result.passed
    np.testing.assert_allclose(result.outputs["y"], result.inputs["x"] + 0.5, rtol=1e-6)


def test_ops_of_other_domains_are_all_listed_as_unsupported():
    nodes = [
        helper.make_node("Normalizer", ["x"], ["n"], domain="ai.onnx.ml", norm="L2"),
        helper.make_node(
            "LinearClassifier",
            ["n"],
            ["label", "scores"],
            domain="ai.onnx.ml",
            coefficients=[1.0, 2, 3, 4, 5, 6],
            intercepts=[0.1, 0.2],
            classlabels_ints=[0, 1],
        ),
        helper.make_node("Relu", ["scores"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ml",
        [helper.make_tensor_value_info("x", F, [1, 3])],
        [
            helper.make_tensor_value_info("y", F, None),
            helper.make_tensor_value_info("label", I64, None),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 2)]
    )
    run_onnxruntime(model, {"x": np.ones((1, 3), np.float32)})  # a valid model
    with pytest.raises(CompileError) as caught:
        onnx2bir.compile(model)
    message = str(caught.value)
    assert message.startswith("unsupported ops in")
    assert "ai.onnx.ml.LinearClassifier x1" in message and "ai.onnx.ml.Normalizer x1" in message


def test_unnamed_nodes_are_named_by_their_index_in_the_file():
    # Three unnamed nodes; the first folds (constants), so the folded graph's nodes are the
    # file's second and third: Mul_1 and Relu_2, as the file numbers them, not Mul_0, Relu_1.
    nodes = [
        helper.make_node("Add", ["one", "one"], ["two"]),
        helper.make_node("Mul", ["x", "two"], ["x2"]),
        helper.make_node("Relu", ["x2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "unnamed",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
        [numpy_helper.from_array(np.ones((1,), np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert list(import_model(model).nx) == ["Mul_1", "Relu_2"]
