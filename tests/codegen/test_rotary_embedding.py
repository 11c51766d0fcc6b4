"""RotaryEmbedding (opset 23) against onnxruntime over a seeded sweep of shapes and attributes:
3-D and 4-D inputs, interleaved or halves, partial rotation, position_ids given or not."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import TensorProto, helper

RNG = np.random.default_rng(23)

# (batch, seq, heads, head_size, rotary_embedding_dim; 0 = whole head)
SHAPES = [(1, 3, 2, 8, 0), (2, 5, 3, 6, 4), (1, 130, 2, 4, 0), (2, 4, 4, 16, 8), (1, 2, 1, 10, 6)]
# 70 heads of 64 span two chunks of heads in one tile row.
SHAPES.append((1, 3, 70, 64, 32))


def _model(batch, seq, heads, head_size, rotary, rank, interleaved, with_ids):
    half = (rotary or head_size) // 2
    x_shape = (batch, heads, seq, head_size) if rank == 4 else (batch, seq, heads * head_size)
    max_pos = seq + 7
    if with_ids:
        cache_shape = (max_pos, half)
    else:
        cache_shape = (batch, seq, half)
    attrs = {"interleaved": int(interleaved)}
    if rotary:
        attrs["rotary_embedding_dim"] = rotary
    if rank == 3:
        attrs["num_heads"] = heads
    inputs = ["x", "cos", "sin"] + (["pos"] if with_ids else [])
    # position_ids are int64: a Cast of a float input (exact for these small integers).
    nodes = [helper.make_node("Cast", ["pos_f"], ["pos"], to=TensorProto.INT64)] if with_ids else []
    nodes.append(helper.make_node("RotaryEmbedding", inputs, ["y"], **attrs))
    shapes = {"x": x_shape, "cos": cache_shape, "sin": cache_shape}
    if with_ids:
        shapes["pos_f"] = (batch, seq)
    model = make_model(nodes, shapes, {"y": x_shape}, opset=23)
    feeds = {
        "x": RNG.standard_normal(x_shape).astype(np.float32),
        "cos": RNG.uniform(-1, 1, cache_shape).astype(np.float32),
        "sin": RNG.uniform(-1, 1, cache_shape).astype(np.float32),
    }
    if with_ids:
        feeds["pos_f"] = RNG.integers(0, max_pos, (batch, seq)).astype(np.float32)
    return model, feeds


@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_rotary_embedding(shape, rank, interleaved, with_ids):
    model, feeds = _model(*shape, rank, interleaved, with_ids)
    assert_matches_onnxruntime(model, feeds=feeds, passes=[])
