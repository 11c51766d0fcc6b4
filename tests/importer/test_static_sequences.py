"""Sequence and optional values known at compile time become plain tensors
(onnx2bir/frontend/sequences.py). The verdict's emulating oracle runs the rewritten model;
the validation also checks the rewrite against onnxruntime's run of the model as given
(`import_rewrite_check`), so a wrong rewrite fails validation by itself; each case also
compares the machine's outputs with onnxruntime's. A position known only at run time keeps
the model refused, with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2bir
from onnx2bir.errors import CompileError
from onnx2bir.frontend import sequences
from onnx2bir.frontend.importer import import_model


def _model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _int(name, value):
    return helper.make_tensor(name, TensorProto.INT64, [], [value])


def _passes(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> bool:
    """The validation passes and the outputs equal onnxruntime's on the original model."""
    import onnxruntime

    result = onnx2bir.validate(model, feeds)
    session = onnxruntime.InferenceSession(model.SerializeToString())
    names = [o.name for o in model.graph.output]
    expected = dict(zip(names, session.run(names, feeds), strict=True))
    same = all(np.allclose(result.outputs[n], expected[n], atol=1e-6) for n in names)
    return result.passed and same


def _rng_feeds(**shapes):
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _insert_at_model(pos_input: bool = False) -> onnx.ModelProto:
    """[a, b] -> insert c at 1 -> [a, c, b]; element `pos` (-1: b) plus x."""
    nodes = [
        helper.make_node("SequenceConstruct", ["a", "b"], ["s1"]),
        helper.make_node("SequenceInsert", ["s1", "c", "one"], ["s2"]),
        helper.make_node("SequenceAt", ["s2", "pos"], ["picked"]),
        helper.make_node("Add", ["picked", "x"], ["y"]),
    ]
    inputs = [_float(n, [2, 3]) for n in "abcx"]
    inits = [_int("one", 1)]
    if pos_input:
        inputs.append(helper.make_tensor_value_info("pos", TensorProto.INT64, []))
    else:
        inits.append(_int("pos", 1))
    return _model(nodes, inputs, [_float("y", [2, 3])], inits)


def test_construct_insert_at_add_passes():
    model = _insert_at_model()
    assert _passes(model, _rng_feeds(a=(2, 3), b=(2, 3), c=(2, 3), x=(2, 3)))
    notes = import_model(model).import_notes
    assert any("sequence values s1, s2 replaced by their 3 tensors" in n for n in notes)


def test_split_to_sequence_then_concat_from_sequence_passes():
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["parts"], axis=1, keepdims=0),
        helper.make_node("ConcatFromSequence", ["parts"], ["stacked"], axis=0, new_axis=1),
        helper.make_node("SplitToSequence", ["x", "sizes"], ["pieces"], axis=1),
        helper.make_node("ConcatFromSequence", ["pieces"], ["joined"], axis=0),
    ]
    sizes = helper.make_tensor("sizes", TensorProto.INT64, [2], [2, 2])
    outputs = [_float("stacked", [4, 2]), _float("joined", [4, 2])]
    model = _model(nodes, [_float("x", [2, 4])], outputs, [sizes])
    assert _passes(model, _rng_feeds(x=(2, 4)))


def test_sequence_length_in_arithmetic_passes():
    nodes = [
        helper.make_node("SplitToSequence", ["x", "two"], ["parts"], axis=1),
        helper.make_node("SequenceLength", ["parts"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "nf"], ["y"]),
    ]
    model = _model(nodes, [_float("x", [2, 5])], [_float("y", [2, 5])], [_int("two", 2)])
    assert _passes(model, _rng_feeds(x=(2, 5)))  # 5 = 2 + 2 + 1: 3 parts


def test_optional_get_element_and_has_element_pass():
    opt_type = helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [3])
    )
    nodes = [
        helper.make_node("Optional", ["x"], ["o"]),
        helper.make_node("OptionalGetElement", ["o"], ["got"]),
        helper.make_node("Optional", [], ["none"], type=opt_type.optional_type.elem_type),
        helper.make_node("OptionalHasElement", ["none"], ["absent"]),
        helper.make_node("OptionalHasElement", ["o"], ["present"]),
        helper.make_node("Relu", ["got"], ["y"]),
    ]
    model = _model(
        nodes, [_float("x", [3])],
        [_float("y", [3]), helper.make_tensor_value_info("absent", TensorProto.BOOL, []),
         helper.make_tensor_value_info("present", TensorProto.BOOL, [])],
    )  # fmt: skip
    assert _passes(model, _rng_feeds(x=(3,)))


def test_sequence_map_body_is_inlined_per_element():
    body = helper.make_graph(
        [helper.make_node("Mul", ["e", "k"], ["out"])],
        "body",
        [_float("e", [2]), _float("k", [2])],
        [_float("out", [2])],
    )
    nodes = [
        helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
        helper.make_node("SequenceMap", ["s", "k"], ["m"], body=body),
        helper.make_node("ConcatFromSequence", ["m"], ["y"], axis=0),
    ]
    model = _model(
        nodes, [_float("a", [2]), _float("b", [2]), _float("k", [2])], [_float("y", [4])]
    )
    assert _passes(model, _rng_feeds(a=(2,), b=(2,), k=(2,)))


def test_runtime_position_is_refused_with_the_reason():
    model = _insert_at_model(pos_input=True)
    feeds = _rng_feeds(a=(2, 3), b=(2, 3), c=(2, 3), x=(2, 3))
    feeds["pos"] = np.array(1, np.int64)
    with pytest.raises(CompileError, match=r"sequence values .*position 'pos' is not known until"):
        onnx2bir.validate(model, feeds)


def test_sequence_graph_output_is_refused_with_the_reason():
    seq = helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)
    model = _model(
        [helper.make_node("SplitToSequence", ["x"], ["parts"])], [_float("x", [2])], [seq]
    )
    with pytest.raises(CompileError, match=r"sequence graph output 'parts'"):
        import_model(model)


def test_a_wrong_position_in_the_rewrite_fails_validation(monkeypatch):
    model = _insert_at_model()
    feeds = _rng_feeds(a=(2, 3), b=(2, 3), c=(2, 3), x=(2, 3))
    right = onnx2bir.validate(model, feeds)
    assert right.passed
    assert [c["passed"] for c in right.document["import_rewrite_check"]] == [True]
    monkeypatch.setattr(
        sequences, "pick", lambda elements, pos: elements[(pos + 1) % len(elements)]
    )
    assert not _passes(model, feeds)
    wrong = onnx2bir.validate(model, feeds)  # no drift limit needed
    assert not wrong.passed
    assert [c["passed"] for c in wrong.document["import_rewrite_check"]] == [False]
