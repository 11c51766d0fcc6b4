"""com.microsoft RotaryEmbedding against onnxruntime (which runs the contrib op) over a seeded
sweep of shapes and attributes: [B, S, hidden] and [B, N, S, H] inputs, halves or interleaved,
partial rotation, [B, S] positions or one offset p0, scale and is_packed_batching."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import IR_VERSION, assert_matches_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.compiler import compile_model
from onnx2bir.errors import UserError
from onnx2bir.options import CompileOptions

RNG = np.random.default_rng(2024)
MS = "com.microsoft"

# (batch, seq, heads, head_size, rotary_embedding_dim; 0 = whole head, the cache sets the head)
SHAPES = [
    (1, 3, 2, 8, 0),
    (2, 5, 3, 6, 4),
    (1, 130, 2, 4, 0),  # positions over two partition tiles
    (2, 4, 4, 16, 8),
    (1, 2, 1, 10, 6),
    (1, 3, 70, 64, 32),  # heads split over two chunks of a tile row
]


def _model(shape, rank, interleaved, offset, extra_attrs=None, constant_ids=False):
    batch, seq, heads, head_size, rotary = shape
    half = (rotary or head_size) // 2
    x_shape = [batch, heads, seq, head_size] if rank == 4 else [batch, seq, heads * head_size]
    max_pos = seq + 9
    ids_shape = [1] if offset else [batch, seq]
    attrs = {"interleaved": int(interleaved), **(extra_attrs or {})}
    if rotary:
        attrs.update(rotary_embedding_dim=rotary, num_heads=heads)
    elif rank == 3 and RNG.integers(2):
        attrs["num_heads"] = heads  # optional when the cache gives the head size
    node = helper.make_node(
        "RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs
    )
    if offset:
        ids = np.array([RNG.integers(0, max_pos - seq + 1)], np.int64)
    else:
        ids = RNG.integers(0, max_pos, (batch, seq)).astype(np.int64)
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
        helper.make_tensor_value_info("cos", TensorProto.FLOAT, [max_pos, half]),
        helper.make_tensor_value_info("sin", TensorProto.FLOAT, [max_pos, half]),
    ]
    initializers = []
    if constant_ids:
        initializers.append(numpy_helper.from_array(ids, "pos"))
    else:
        inputs.insert(1, helper.make_tensor_value_info("pos", TensorProto.INT64, ids_shape))
    graph = helper.make_graph(
        [node],
        "rotary_ms",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_shape)],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)],
        ir_version=IR_VERSION,
    )
    feeds = {
        "x": RNG.standard_normal(x_shape).astype(np.float32),
        "cos": RNG.uniform(-1, 1, (max_pos, half)).astype(np.float32),
        "sin": RNG.uniform(-1, 1, (max_pos, half)).astype(np.float32),
    }
    if not constant_ids:
        feeds["pos"] = ids
    return model, feeds


@pytest.mark.parametrize("offset", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_rotary_embedding_ms(shape, rank, interleaved, offset):
    model, feeds = _model(shape, rank, interleaved, offset)
    assert_matches_onnxruntime(model, feeds=feeds, passes=[])


@pytest.mark.parametrize(
    "attrs", [{"scale": 0.5}, {"is_packed_batching": 1}, {"scale": 2.0, "is_packed_batching": 0}]
)
def test_scale_and_packed_batching_change_nothing(attrs):
    model, feeds = _model((2, 6, 2, 8, 4), 3, False, False, attrs)
    assert_matches_onnxruntime(model, feeds=feeds, passes=[])


@pytest.mark.parametrize("offset", [False, True])
def test_constant_positions_and_the_default_passes(offset):
    model, feeds = _model((1, 7, 2, 8, 0), 4, True, offset, constant_ids=True)
    assert_matches_onnxruntime(model, feeds=feeds)


@pytest.mark.parametrize("seq", [128, 259, 383])
def test_offset_positions_fill_whole_and_partial_partition_rows(seq):
    """p0 + s is made as [rows, cols] on chip: 259 and 383 positions leave a short last row."""
    model, feeds = _model((1, seq, 1, 4, 0), 3, False, True)
    assert_matches_onnxruntime(model, feeds=feeds, passes=[])


def test_positions_as_a_scalar():
    model, feeds = _model((2, 5, 2, 8, 0), 3, False, True)
    model.graph.input[1].type.tensor_type.shape.ClearField("dim")
    feeds["pos"] = feeds["pos"].reshape(())
    assert_matches_onnxruntime(model, feeds=feeds, passes=[])


def _set_heads(model, heads: int) -> None:
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != "num_heads"]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("num_heads", heads)])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.graph.input[1].type.tensor_type.shape.dim[1].__setattr__("dim_value", 4),
         "position_ids of shape [2, 4]"),
        (lambda m: _set_heads(m, 3), "3 heads of 8 for a hidden size 16"),
    ],
)  # fmt: skip
def test_bad_shapes_are_refused_with_one_line(change, message):
    model, _ = _model((2, 5, 2, 8, 0), 3, False, False)
    change(model)
    with pytest.raises(UserError, match=re.escape(message)):
        compile_model(model, CompileOptions())


def test_the_standard_op_of_the_same_name_is_not_confused_with_it():
    model, _ = _model((1, 3, 2, 8, 0), 3, False, False)
    model.graph.node[0].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UserError, match="com.example.RotaryEmbedding x1"):
        compile_model(model, CompileOptions())


def test_its_output_shape_reaches_the_nodes_after_it():
    """onnx cannot infer a com.microsoft output; onnx2bir gives it the input's shape, so a
    rotated query and key feed a MatMul without value_info in the model."""
    model, feeds = _model((1, 6, 2, 8, 0), 4, False, False)
    graph = model.graph
    graph.node.append(
        helper.make_node("RotaryEmbedding", ["k", "pos", "cos", "sin"], ["k_rot"], domain=MS)
    )
    graph.node.append(helper.make_node("Transpose", ["k_rot"], ["k_t"], perm=[0, 1, 3, 2]))
    graph.node.append(helper.make_node("MatMul", ["y", "k_t"], ["scores"]))
    graph.input.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, 6, 8]))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, 6, 6]))
    feeds["k"] = RNG.standard_normal((1, 2, 6, 8)).astype(np.float32)
    assert not graph.value_info
    assert_matches_onnxruntime(model, feeds=feeds)


def test_float16():
    """onnxruntime's CPU kernel also takes fp16; the rotation is done in the input's type."""
    model, feeds = _model((2, 5, 2, 8, 0), 3, True, False)
    for value in [*model.graph.input, *model.graph.output]:
        if value.name != "pos":
            value.type.tensor_type.elem_type = TensorProto.FLOAT16
    feeds = {k: v if k == "pos" else v.astype(np.float16) for k, v in feeds.items()}
    assert_matches_onnxruntime(model, feeds=feeds, passes=[], atol=2e-3, rtol=2e-3)
