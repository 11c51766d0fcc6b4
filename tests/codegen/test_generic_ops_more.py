"""The second batch of generic lowerings against onnxruntime, over small seeded sweeps.

Same style as test_generic_ops.py: one-node models compiled without the pattern passes, run on
the machine model with seeded inputs and compared with onnxruntime (fp32 at atol 1e-4 /
rtol 1e-3, integer and bool outputs exactly). Opsets are the ones PyTorch's exporter emits
(17-20) unless a case exercises an older form.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import IR_VERSION, assert_matches_onnxruntime, make_model, one_node_model
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.verify import verify_module
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.errors import UserError
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import synthesize_inputs

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast


def check(model, **kwargs) -> dict[str, np.ndarray]:
    """No pattern passes: every node goes through its generic lowering."""
    return assert_matches_onnxruntime(model, passes=[], **kwargs)


def exact(model, **kwargs) -> dict[str, np.ndarray]:
    return check(model, atol=0.0, rtol=0.0, **kwargs)


def weights(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def int64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def feeds_of(model, seed: int = 0, **overrides: np.ndarray) -> dict[str, np.ndarray]:
    feeds = synthesize_inputs(import_graph(model), seed)
    feeds.update(overrides)
    return feeds


def typed_model(
    op: str,
    inputs: dict,
    elem_types: dict,
    out_type: int,
    opset: int = 18,
    initializers: dict | None = None,
    order: tuple[str, ...] | None = None,
    **attrs,
) -> onnx.ModelProto:
    """A one-node model whose inputs carry their own element types; `order` reorders the
    node's inputs (graph inputs and initializers by name)."""
    names = list(order) if order else [*inputs, *(initializers or {})]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "test",
        [helper.make_tensor_value_info(n, elem_types[n], list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in (initializers or {}).items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


# --- activations --------------------------------------------------------------------------------

ACTIVATION_SHAPES = [(2, 3, 4, 5), (3, 129, 7)]
# (op, attributes, opset)
ACTIVATIONS = {
    "gelu": ("Gelu", {}, 20),
    "gelu_tanh": ("Gelu", {"approximate": "tanh"}, 20),
    "hard_sigmoid": ("HardSigmoid", {}, 18),
    "hard_sigmoid_ab": ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 18),
    "hard_swish": ("HardSwish", {}, 18),
    "leaky_relu": ("LeakyRelu", {}, 18),
    "leaky_relu_0.3": ("LeakyRelu", {"alpha": 0.3}, 16),
    "leaky_relu_neg": ("LeakyRelu", {"alpha": -1.5}, 18),
    "leaky_relu_big": ("LeakyRelu", {"alpha": 2.5}, 18),
    "elu": ("Elu", {}, 18),
    "elu_alpha": ("Elu", {"alpha": 0.5}, 18),
    "selu": ("Selu", {}, 18),
    "celu": ("Celu", {"alpha": 0.7}, 18),
    "thresholded_relu": ("ThresholdedRelu", {"alpha": 0.5}, 18),
    "softsign": ("Softsign", {}, 18),
    "shrink": ("Shrink", {}, 18),
    "shrink_bias": ("Shrink", {"lambd": 1.5, "bias": 0.25}, 18),
    "mish": ("Mish", {}, 18),
}


@pytest.mark.parametrize("shape", ACTIVATION_SHAPES, ids=str)
@pytest.mark.parametrize("case", list(ACTIVATIONS))
def test_activation(case: str, shape: tuple[int, ...]) -> None:
    op, attrs, opset = ACTIVATIONS[case]
    model = one_node_model(op, {"x": shape}, shape, opset=opset, **attrs)
    feeds = feeds_of(model)
    feeds["x"] = feeds["x"] * 3  # reach the clamps of the hard functions
    check(model, feeds=feeds)


@pytest.mark.parametrize("slope", [(1,), (3, 1, 1), (2, 3, 4, 5)], ids=str)
def test_prelu(slope: tuple[int, ...]) -> None:
    model = one_node_model("PRelu", {"x": (2, 3, 4, 5), "s": slope})
    check(model)


def test_prelu_constant_slope() -> None:
    model = one_node_model("PRelu", {"x": (2, 3, 4, 5)}, initializers={"s": weights(3, 3, 1, 1)})
    check(model)


# (input bounds as (min, max): a float is a constant input, "runtime" a graph input, None absent)
CLIP_CASES = {
    "both": (-0.5, 0.7),
    "min_only": (-0.5, None),
    "max_only": (None, 0.3),
    "none": (None, None),
    "runtime_both": ("runtime", "runtime"),
    "runtime_min_const_max": ("runtime", 1.0),
    "inverted": (0.5, -0.5),
}


@pytest.mark.parametrize("case", list(CLIP_CASES))
def test_clip(case: str) -> None:
    low, high = CLIP_CASES[case]
    inputs: dict = {"x": (3, 4, 5)}
    inits, names = {}, ["x"]
    for name, bound in (("lo", low), ("hi", high)):
        if bound is None:
            names.append("")
        elif bound == "runtime":
            inputs[name] = ()
            names.append(name)
        else:
            inits[name] = np.array(bound, np.float32)
            names.append(name)
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Clip", names, ["y"])
    check(make_model(node, inputs, {"y": None}, initializers=inits))


def test_clip_opset6_attributes() -> None:
    check(one_node_model("Clip", {"x": (3, 4, 5)}, opset=6, min=-0.2, max=0.4))


def test_clip_int64_exact() -> None:
    # Beyond 2^24, inside int32: exact on GpSimd's integer lanes, not in fp32
    # (docs/neuroncore.md#integers).
    big = 1 << 30
    model = typed_model(
        "Clip",
        {"x": (4, 5)},
        {"x": TensorProto.INT64},
        TensorProto.INT64,
        initializers={"lo": np.array(big + 2, np.int64), "hi": np.array(big + 5, np.int64)},
    )
    x = big + np.arange(20, dtype=np.int64).reshape(4, 5)
    exact(model, feeds={"x": x})


# --- comparisons, logic, Where ----------------------------------------------------------------

COMPARE_OPS = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]
COMPARE_SHAPES = {
    "same": ((3, 4, 5), (3, 4, 5)),
    "broadcast": ((2, 3, 4, 5), (3, 1, 1)),
    "scalar": ((7, 9), ()),
}


@pytest.mark.parametrize("case", list(COMPARE_SHAPES))
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32])
@pytest.mark.parametrize("op", COMPARE_OPS)
def test_compare(op: str, elem: int, case: str) -> None:
    a, b = COMPARE_SHAPES[case]
    model = typed_model(op, {"a": a, "b": b}, {"a": elem, "b": elem}, TensorProto.BOOL)
    feeds = feeds_of(model, 1)
    if elem == TensorProto.FLOAT:  # ties, so that equality is exercised
        feeds = {k: np.asarray(np.round(v), np.float32) for k, v in feeds.items()}
    exact(model, feeds=feeds)


def test_equal_large_int64_exact() -> None:
    """Values 1 apart above 2^53: only an int64 comparison tells them apart."""
    model = typed_model(
        "Equal",
        {"a": (6,), "b": (6,)},
        {"a": TensorProto.INT64, "b": TensorProto.INT64},
        TensorProto.BOOL,
    )
    base = (1 << 60) + np.arange(6, dtype=np.int64)
    exact(model, feeds={"a": base, "b": base + np.array([0, 1, 0, 1, 0, 1])})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize(
    "shapes", [((3, 4, 5), (3, 4, 5)), ((2, 1, 16, 1), (1, 1, 1, 16))], ids=str
)
def test_logic(op: str, shapes) -> None:
    a, b = shapes
    model = typed_model(
        op, {"a": a, "b": b}, {"a": TensorProto.BOOL, "b": TensorProto.BOOL}, TensorProto.BOOL
    )
    exact(model)


def test_not() -> None:
    exact(typed_model("Not", {"a": (5, 130)}, {"a": TensorProto.BOOL}, TensorProto.BOOL))


def special_values(shape) -> np.ndarray:
    values = weights(5, *shape)
    flat = values.reshape(-1)
    flat[::7] = np.nan
    flat[1::11] = np.inf
    flat[2::13] = -np.inf
    return values


@pytest.mark.parametrize("opset", [13, 20])
def test_isnan(opset: int) -> None:
    model = typed_model(
        "IsNaN", {"x": (6, 50)}, {"x": TensorProto.FLOAT}, TensorProto.BOOL, opset=opset
    )
    exact(model, feeds={"x": special_values((6, 50))})


@pytest.mark.parametrize("detect", [(1, 1), (1, 0), (0, 1), (0, 0)], ids=str)
def test_isinf(detect) -> None:
    model = typed_model(
        "IsInf",
        {"x": (6, 50)},
        {"x": TensorProto.FLOAT},
        TensorProto.BOOL,
        detect_positive=detect[0],
        detect_negative=detect[1],
    )
    exact(model, feeds={"x": special_values((6, 50))})


WHERE_SHAPES = {
    "same": ((3, 4, 5), (3, 4, 5), (3, 4, 5)),
    "broadcast": ((1, 4, 1), (3, 4, 5), (5,)),
    "mask_scalars": ((1, 1, 16, 16), (), ()),
}


@pytest.mark.parametrize("case", list(WHERE_SHAPES))
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8])
def test_where(case: str, elem: int) -> None:
    c, x, y = WHERE_SHAPES[case]
    model = typed_model(
        "Where", {"c": c, "a": x, "b": y}, {"c": TensorProto.BOOL, "a": elem, "b": elem}, elem
    )
    exact(model, feeds=feeds_of(model, 2))


def test_where_masked_fill_inf() -> None:
    """Attention masking: Where(mask, x, -inf) and Where(mask, -inf, x) keep the infinities."""
    for order in (("c", "x", "m"), ("c", "m", "x")):
        model = typed_model(
            "Where",
            {"c": (2, 8, 8), "x": (2, 8, 8)},
            {"c": TensorProto.BOOL, "x": TensorProto.FLOAT},
            TensorProto.FLOAT,
            initializers={"m": np.array(-np.inf, np.float32)},
            order=order,
        )
        graph_feeds = feeds_of(model, 3)
        graph_feeds["x"][0, 0, :3] = np.inf
        exact(model, feeds=graph_feeds)


# --- Cast -----------------------------------------------------------------------------------------

CAST_TYPES = {
    "float": TensorProto.FLOAT,
    "fp16": TensorProto.FLOAT16,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "uint8": TensorProto.UINT8,
    "int8": TensorProto.INT8,
    "bool": TensorProto.BOOL,
}


def cast_input(elem: int, shape) -> np.ndarray:
    rng = np.random.default_rng(7)
    if elem in (TensorProto.FLOAT, TensorProto.FLOAT16):
        values = rng.standard_normal(shape) * 40
        values.reshape(-1)[::5] = 0.0
        return values.astype(helper.tensor_dtype_to_np_dtype(elem))
    if elem == TensorProto.BOOL:
        return rng.integers(0, 2, shape).astype(bool)
    low = 0 if elem == TensorProto.UINT8 else -100
    return rng.integers(low, 100, shape).astype(helper.tensor_dtype_to_np_dtype(elem))


@pytest.mark.parametrize("dst", list(CAST_TYPES))
@pytest.mark.parametrize("src", list(CAST_TYPES))
def test_cast(src: str, dst: str) -> None:
    model = typed_model(
        "Cast", {"x": (3, 50)}, {"x": CAST_TYPES[src]}, CAST_TYPES[dst], to=CAST_TYPES[dst]
    )
    x = cast_input(CAST_TYPES[src], (3, 50))
    if dst in ("uint8", "int8") and src in ("float", "fp16"):
        x = np.abs(x) % 100  # float → small int stays in range (out-of-range is UB in C++)
    exact(model, feeds={"x": x})


def test_cast_int64_to_int32_wraps_and_large_exact() -> None:
    model = typed_model(
        "Cast", {"x": (4,)}, {"x": TensorProto.INT64}, TensorProto.INT32, to=TensorProto.INT32
    )
    exact(model, feeds={"x": np.array([2**31 + 5, -(2**33) - 7, 123456789, -1], np.int64)})


def test_castlike() -> None:
    model = typed_model(
        "CastLike",
        {"x": (3, 4), "t": (1,)},
        {"x": TensorProto.FLOAT, "t": TensorProto.INT64},
        TensorProto.INT64,
    )
    exact(model, feeds={"x": cast_input(TensorProto.FLOAT, (3, 4)), "t": np.zeros(1, np.int64)})


# --- Split, Slice, Expand, Tile ----------------------------------------------------------------

# (input shape, axis, split sizes or None, num_outputs or None, outputs, opset)
SPLIT_CASES = {
    "num_outputs_even": ((1, 16, 192), 2, None, 3, 3, 18),
    "num_outputs_uneven": ((2, 7, 5), 1, None, 3, 3, 18),
    "sizes_input": ((4, 10), 1, [2, 3, 5], None, 3, 13),
    "sizes_attr": ((6, 4), 0, [1, 5], None, 2, 11),
    "equal_default": ((6, 4, 3), 0, None, None, 3, 13),
    "negative_axis": ((2, 3, 8), -1, [4, 4], None, 2, 18),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_split(case: str) -> None:
    shape, axis, sizes, parts, count, opset = SPLIT_CASES[case]
    outputs = [f"y{i}" for i in range(count)]
    attrs: dict = {"axis": axis}
    inits = {}
    names = ["x"]
    if sizes is not None and opset >= 13:
        inits["split"] = int64(*sizes)
        names.append("split")
    elif sizes is not None:
        attrs["split"] = sizes
    if parts is not None:
        attrs["num_outputs"] = parts
    node = helper.make_node("Split", names, outputs, **attrs)
    check(make_model(node, {"x": shape}, {o: None for o in outputs}, opset, inits))


def test_split_unused_output() -> None:
    """An output nobody reads is dropped by the importer; the others keep their offsets."""
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3),
        helper.make_node("Neg", ["c"], ["y"]),
    ]
    check(make_model(nodes, {"x": (2, 9)}, {"y": None, "a": None}))


# (input shape, starts, ends, axes or None, steps or None)
SLICE_CASES = {
    "llama_last_axis": ((1, 4, 16, 16), [8], [16], [3], None),
    "two_axes": ((3, 10, 12), [1, 2], [3, 11], [0, 2], None),
    "step2": ((4, 20), [1], [19], [1], [2]),
    "negative_step": ((4, 20), [-1], [-100], [1], [-1]),
    "negative_step3": ((5, 6, 7), [5, 4], [0, 0], [2, 1], [-3, -2]),
    "int_max_end": ((5, 6), [2], [2**63 - 1], [0], None),
    "negative_indices": ((5, 6), [-4], [-1], [-1], None),
    "default_axes": ((4, 5, 6), [1, 0, 2], [3, 5, 6], None, None),
    "empty": ((4, 5), [3], [1], [0], None),
    "rank6": ((2, 3, 2, 3, 2, 5), [0, 1, 1], [2, 3, 5], [1, 3, 5], [1, 1, 2]),
}


@pytest.mark.parametrize("case", list(SLICE_CASES))
def test_slice(case: str) -> None:
    shape, starts, ends, axes, steps = SLICE_CASES[case]
    inits = {"starts": int64(*starts), "ends": int64(*ends)}
    if axes is not None:
        inits["axes"] = int64(*axes)
    if steps is not None:
        inits["steps"] = int64(*steps)
    check(one_node_model("Slice", {"x": shape}, initializers=inits))


def test_slice_opset1_attributes() -> None:
    check(
        one_node_model("Slice", {"x": (5, 6)}, opset=9, starts=[1, 2], ends=[4, 100], axes=[0, 1])
    )


def test_slice_int64_data() -> None:
    model = typed_model(
        "Slice",
        {"x": (6, 7)},
        {"x": TensorProto.INT64},
        TensorProto.INT64,
        initializers={"s": int64(5), "e": int64(0), "a": int64(1), "t": int64(-2)},
    )
    exact(model)


EXPAND_CASES = {
    "llama": ((1, 2, 1, 16, 16), (1, 2, 3, 16, 16)),
    "rank_grows": ((3, 1), (2, 3, 4)),
    "scalar": ((), (4, 5)),
    "ones_in_shape": ((2, 1, 5), (1, 4, 1)),
}


@pytest.mark.parametrize("case", list(EXPAND_CASES))
def test_expand(case: str) -> None:
    shape, target = EXPAND_CASES[case]
    check(one_node_model("Expand", {"x": shape}, initializers={"s": int64(*target)}))


@pytest.mark.parametrize("repeats", [(2, 3), (1, 1), (3, 1), (1, 4)], ids=str)
def test_tile(repeats) -> None:
    check(one_node_model("Tile", {"x": (3, 5)}, initializers={"r": int64(*repeats)}))


def test_tile_rank4_int64() -> None:
    model = typed_model(
        "Tile",
        {"x": (2, 1, 3, 2)},
        {"x": TensorProto.INT64},
        TensorProto.INT64,
        initializers={"r": int64(2, 3, 1, 2)},
    )
    exact(model)


# --- Pad --------------------------------------------------------------------------------------

# (input shape, pads, mode, opset)
PAD_CASES = {
    "constant_nchw": ((1, 3, 5, 6), [0, 0, 1, 2, 0, 0, 2, 1], "constant", 18),
    "constant_all_axes": ((2, 3, 4), [1, 0, 2, 2, 1, 0], "constant", 18),
    "constant_negative": ((2, 6, 7), [0, -1, 2, 0, 2, -3], "constant", 18),
    "reflect": ((1, 2, 5, 6), [0, 0, 2, 3, 0, 0, 4, 1], "reflect", 18),
    "reflect_1d": ((3, 9), [0, 8, 0, 8], "reflect", 18),
    "edge": ((1, 2, 5, 6), [0, 0, 2, 3, 0, 0, 4, 1], "edge", 18),
    "edge_all": ((2, 3, 4), [1, 2, 3, 2, 1, 0], "edge", 13),
    "wrap": ((1, 2, 5, 6), [0, 0, 2, 3, 0, 0, 5, 6], "wrap", 19),
    "opset2_attr": ((3, 4), [1, 2, 0, 1], "constant", 2),
}


@pytest.mark.parametrize("case", list(PAD_CASES))
def test_pad(case: str) -> None:
    shape, pads, mode, opset = PAD_CASES[case]
    if opset < 11:
        model = one_node_model("Pad", {"x": shape}, opset=opset, pads=pads, mode=mode, value=1.5)
    else:
        model = one_node_model(
            "Pad", {"x": shape}, opset=opset, mode=mode, initializers={"p": int64(*pads)}
        )
    check(model)


def test_pad_constant_value_and_axes() -> None:
    inits = {"p": int64(1, 2, 3, 0), "v": np.array([2.5], np.float32), "a": int64(1, -1)}
    node = helper.make_node("Pad", ["x", "p", "", "a"], ["y"])
    check(make_model(node, {"x": (2, 3, 4)}, {"y": None}, 18, inits))
    node = helper.make_node("Pad", ["x", "p", "v", "a"], ["y"])
    check(make_model(node, {"x": (2, 3, 4)}, {"y": None}, 18, inits))


def test_pad_runtime_constant_value() -> None:
    node = helper.make_node("Pad", ["x", "p", "v"], ["y"])
    model = make_model(
        node, {"x": (2, 3, 40), "v": ()}, {"y": None}, 18, {"p": int64(1, 0, 30, 2, 1, 30)}
    )
    check(model)


def test_pad_large_int64() -> None:
    model = typed_model(
        "Pad",
        {"x": (3, 300, 9)},
        {"x": TensorProto.INT64},
        TensorProto.INT64,
        initializers={"p": int64(0, 2, 1, 1, 2, 1), "v": np.array([(1 << 30) + 7], np.int64)},
    )
    exact(model)


# --- Gather, GatherND, GatherElements ---------------------------------------------------------

# (data shape, indices shape, axis)
GATHER_CASES = {
    "embedding": ((1000, 64), (1, 16), 0),
    "rows_300_inner_600": ((300, 600), (2, 70), 0),
    "axis1": ((3, 20, 7), (4,), 1),
    "axis_last": ((2, 3, 150), (5, 2), -1),
    "picks_gt_128": ((50, 3), (130,), 0),
    # 3 row tiles of 6000 fp32 take 72 KiB a partition: the table streams tile by tile
    "table_not_resident": ((300, 6000), (1, 20), 0),
}


def random_indices(shape, n: int, seed: int = 11, negative: bool = True) -> np.ndarray:
    low = -n if negative else 0
    return np.random.default_rng(seed).integers(low, n, shape).astype(np.int64)


@pytest.mark.parametrize("case", list(GATHER_CASES))
def test_gather_runtime_indices(case: str) -> None:
    data, idx, axis = GATHER_CASES[case]
    model = typed_model(
        "Gather",
        {"x": data, "i": idx},
        {"x": TensorProto.FLOAT, "i": TensorProto.INT64},
        TensorProto.FLOAT,
        axis=axis,
    )
    feeds = feeds_of(model, 1, i=random_indices(idx, data[axis]))
    exact(model, feeds=feeds)


def test_gather_runtime_int32_indices_into_table_input() -> None:
    model = typed_model(
        "Gather",
        {"x": (40, 9), "i": (3, 5)},
        {"x": TensorProto.FLOAT, "i": TensorProto.INT32},
        TensorProto.FLOAT,
    )
    exact(model, feeds=feeds_of(model, 2, i=random_indices((3, 5), 40).astype(np.int32)))


@pytest.mark.parametrize("elem", [TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL])
def test_gather_runtime_integer_table(elem: int) -> None:
    model = typed_model(
        "Gather", {"x": (300, 5), "i": (2, 70)}, {"x": elem, "i": TensorProto.INT64}, elem
    )
    x = cast_input(elem, (300, 5))
    if elem == TensorProto.INT64:
        x = x + (1 << 30)  # beyond fp32, inside int32: the gather moves the bits
    exact(model, feeds={"x": x, "i": random_indices((2, 70), 300)})


# (data shape, constant indices, axis)
GATHER_CONST = {
    "scalar_index": ((3, 16, 1, 64), np.array(1), 0),
    "scalar_index_axis1": ((1, 17, 64), np.array(0), 1),
    "negative_scalar": ((4, 6), np.array(-1), 1),
    "slice_like": ((10, 4), np.arange(2, 8), 0),
    "reversed": ((10, 4), np.arange(9, -1, -1), 0),
    "repeat": ((5, 3), np.array([[2, 2], [2, 2]]), 0),
    "irregular": ((8, 3, 4), np.array([3, 0, 7, 1, -2, 5]), 0),
    "too_irregular": ((100, 7), random_indices((90,), 100, seed=3), 0),
}


@pytest.mark.parametrize("case", list(GATHER_CONST))
def test_gather_constant_indices(case: str) -> None:
    data, idx, axis = GATHER_CONST[case]
    model = one_node_model(
        "Gather", {"x": data}, initializers={"i": idx.astype(np.int64)}, axis=axis
    )
    exact(model)


# (data shape, indices shape, batch_dims)
GATHER_ND_CASES = {
    "full_index": ((4, 5), (3, 2), 0),
    "row_index": ((4, 5, 6), (2, 3, 1), 0),
    "two_of_three": ((4, 5, 6), (7, 2), 0),
    "batch_dims1": ((2, 5, 6), (2, 3, 1), 1),
    "batch_dims1_full": ((2, 5, 6), (2, 4, 2), 1),
    "rows_gt_128": ((20, 15, 3), (40, 2), 0),
}


def nd_indices(data, idx, batch_dims, seed=5) -> np.ndarray:
    dims = data[batch_dims : batch_dims + idx[-1]]
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(-d, d, idx[:-1]) for d in dims], -1).astype(np.int64)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64])
@pytest.mark.parametrize("case", list(GATHER_ND_CASES))
def test_gather_nd_runtime(case: str, elem: int) -> None:
    data, idx, batch_dims = GATHER_ND_CASES[case]
    model = typed_model(
        "GatherND",
        {"x": data, "i": idx},
        {"x": elem, "i": TensorProto.INT64},
        elem,
        batch_dims=batch_dims,
    )
    exact(model, feeds={"x": cast_input(elem, data), "i": nd_indices(data, idx, batch_dims)})


@pytest.mark.parametrize("case", list(GATHER_ND_CASES))
def test_gather_nd_constant(case: str) -> None:
    data, idx, batch_dims = GATHER_ND_CASES[case]
    model = one_node_model(
        "GatherND",
        {"x": data},
        batch_dims=batch_dims,
        initializers={"i": nd_indices(data, idx, batch_dims)},
    )
    exact(model)


def test_gather_nd_bert_mask() -> None:
    """As exported by PyTorch: a bool mask picked by constant (0, j) pairs."""
    idx = np.stack([np.zeros(16, np.int64), np.arange(16)], -1).reshape(1, 1, 1, 16, 2)
    model = typed_model(
        "GatherND",
        {"x": (1, 16)},
        {"x": TensorProto.BOOL},
        TensorProto.BOOL,
        initializers={"i": idx},
    )
    exact(model)


# (data shape, indices shape, axis)
GATHER_ELEMENTS_CASES = {
    "axis0": ((4, 5), (3, 5), 0),
    "axis1": ((4, 5), (4, 7), 1),
    "smaller_index": ((6, 7, 8), (3, 4, 5), 2),
    "middle_axis": ((3, 9, 4), (3, 6, 4), 1),
    "long_axis": ((2, 3000), (2, 40), 1),
    "partitions_on_axis": ((4, 300), (1, 200), 1),
}


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64])
@pytest.mark.parametrize("case", list(GATHER_ELEMENTS_CASES))
def test_gather_elements_runtime(case: str, elem: int) -> None:
    data, idx, axis = GATHER_ELEMENTS_CASES[case]
    model = typed_model(
        "GatherElements",
        {"x": data, "i": idx},
        {"x": elem, "i": TensorProto.INT64},
        elem,
        axis=axis,
    )
    exact(model, feeds={"x": cast_input(elem, data), "i": random_indices(idx, data[axis])})


def test_gather_elements_keeps_infinities() -> None:
    model = typed_model(
        "GatherElements",
        {"x": (6, 50), "i": (6, 20)},
        {"x": TensorProto.FLOAT, "i": TensorProto.INT64},
        TensorProto.FLOAT,
        axis=1,
    )
    x = special_values((6, 50))
    x[np.isnan(x)] = 1.0
    exact(model, feeds={"x": x, "i": random_indices((6, 20), 50)})


@pytest.mark.parametrize("case", ["axis0", "smaller_index", "long_axis"])
def test_gather_elements_constant(case: str) -> None:
    data, idx, axis = GATHER_ELEMENTS_CASES[case]
    model = one_node_model(
        "GatherElements",
        {"x": data},
        axis=axis,
        initializers={"i": random_indices(idx, data[axis])},
    )
    exact(model)


# --- normalisations -----------------------------------------------------------------------------

BATCH_NORM_SHAPES = [(1, 3, 5, 6), (2, 130, 4, 4), (3, 4), (2, 5, 70, 70), (4, 6, 9)]


@pytest.mark.parametrize("opset", [9, 15])
@pytest.mark.parametrize("shape", BATCH_NORM_SHAPES, ids=str)
def test_batch_norm(shape: tuple[int, ...], opset: int) -> None:
    c = shape[1]
    inits = {
        "scale": weights(1, c),
        "bias": weights(2, c),
        "mean": weights(3, c),
        "var": np.abs(weights(4, c)) + 0.5,
    }
    model = one_node_model(
        "BatchNormalization", {"x": shape}, shape, opset=opset, initializers=inits, epsilon=1e-3
    )
    check(model)


def test_batch_norm_runtime_statistics() -> None:
    model = one_node_model(
        "BatchNormalization",
        {"x": (2, 3, 4, 5), "scale": (3,), "b": (3,), "mean": (3,), "var": (3,)},
    )
    feeds = feeds_of(model, 1)
    feeds["var"] = np.abs(feeds["var"]) + 0.1
    check(model, feeds=feeds)


# (shape, axis, scale/bias shape or None for the normalised shape, bias present)
LAYER_NORM_CASES = {
    "bert": ((1, 16, 64), -1, None, True),
    "no_bias": ((3, 7, 20), -1, None, False),
    "axis1": ((2, 3, 4, 5), 1, None, True),
    "rows_gt_128": ((300, 32), -1, None, True),
    "broadcast_scale": ((2, 3, 4, 5), 2, (5,), True),
    "long_rows": ((3, 20000), -1, None, True),
    "long_rows_broadcast": ((2, 3, 9000), 1, (1, 9000), True),
}


@pytest.mark.parametrize("case", list(LAYER_NORM_CASES))
def test_layer_norm(case: str) -> None:
    shape, axis, vec_shape, with_bias = LAYER_NORM_CASES[case]
    vec_shape = vec_shape or shape[axis:]
    inits = {"scale": weights(1, *vec_shape)}
    if with_bias:
        inits["bias"] = weights(2, *vec_shape)
    model = one_node_model(
        "LayerNormalization",
        {"x": shape},
        shape,
        opset=17,
        initializers=inits,
        axis=axis,
        epsilon=1e-5,
    )
    check(model)


def test_layer_norm_statistics_outputs() -> None:
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "rstd"], axis=1)
    model = make_model(
        node,
        {"x": (6, 3, 10)},
        {"y": None, "mean": None, "rstd": None},
        17,
        {"s": weights(1, 3, 10), "b": weights(2, 3, 10)},
    )
    check(model)


def test_layer_norm_fp16() -> None:
    model = make_model(
        helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"]),
        {"x": (4, 32)},
        {"y": None},
        17,
        {"s": weights(1, 32).astype(np.float16), "b": weights(2, 32).astype(np.float16)},
        elem_type=TensorProto.FLOAT16,
    )
    check(model, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(
    "shape", [(2, 3, 5, 6), (1, 130, 4, 4), (1, 2, 100, 100), (2, 4, 9)], ids=str
)
def test_instance_norm(shape: tuple[int, ...]) -> None:
    c = shape[1]
    model = one_node_model(
        "InstanceNormalization",
        {"x": shape},
        shape,
        initializers={"s": weights(1, c), "b": weights(2, c)},
        epsilon=1e-4,
    )
    check(model)


# (shape, size, alpha, beta, bias)
LRN_CASES = {
    "alexnet": ((1, 16, 7, 7), 5, 1e-4, 0.75, 1.0),
    "batch2_size3": ((2, 6, 4, 5), 3, 0.01, 0.5, 2.0),
    "size1": ((1, 3, 5, 5), 1, 0.5, 0.75, 1.0),
    "channels_gt_128": ((1, 200, 3, 3), 5, 0.1, 0.75, 1.0),
    "pixels_gt_512": ((1, 8, 30, 30), 3, 0.05, 0.6, 1.5),
}


@pytest.mark.parametrize("case", list(LRN_CASES))
def test_lrn(case: str) -> None:
    shape, size, alpha, beta, bias = LRN_CASES[case]
    model = one_node_model("LRN", {"x": shape}, shape, size=size, alpha=alpha, beta=beta, bias=bias)
    check(model)


# --- pooling ------------------------------------------------------------------------------------

AVERAGE_POOL_CASES = {
    "k2s2": ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "k3s1_pad": ((1, 3, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "k3s2_pad_asym": (
        (2, 4, 9, 8),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 2, 1]},
    ),
    "ceil_mode": ((1, 3, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "ceil_mode_pad": (
        (1, 2, 9, 10),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    ),
    "same_upper": (
        (1, 3, 7, 7),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    ),
    "same_lower": ((1, 3, 6, 7), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}),
    "planes_gt_128": ((2, 80, 6, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "1d": ((2, 3, 20), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "global_like": ((1, 4, 7, 7), {"kernel_shape": [7, 7]}),
}


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", list(AVERAGE_POOL_CASES))
def test_average_pool(case: str, count_include_pad: int) -> None:
    shape, attrs = AVERAGE_POOL_CASES[case]
    check(one_node_model("AveragePool", {"x": shape}, count_include_pad=count_include_pad, **attrs))


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool_dilations_opset19(count_include_pad: int) -> None:
    model = one_node_model(
        "AveragePool",
        {"x": (1, 2, 9, 9)},
        opset=19,
        kernel_shape=[2, 3],
        dilations=[2, 2],
        pads=[1, 1, 1, 1],
        count_include_pad=count_include_pad,
    )
    check(model)


@pytest.mark.parametrize(
    "shape", [(2, 3, 5, 5), (1, 3, 100, 100), (1, 130, 4, 4), (2, 3, 17)], ids=str
)
def test_global_max_pool(shape: tuple[int, ...]) -> None:
    check(one_node_model("GlobalMaxPool", {"x": shape}))


# --- ConvTranspose ------------------------------------------------------------------------------

# (x shape, w shape [C_in, C_out/group, k...], bias, attributes)
CONV_TRANSPOSE_CASES = {
    "unet_k2s2": ((1, 8, 8, 8), (8, 4, 2, 2), True, {"strides": [2, 2]}),
    "k3s1_pad1": ((1, 3, 6, 6), (3, 5, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    "k3s2_pad1_outpad1": (
        (1, 4, 5, 5),
        (4, 3, 3, 3),
        True,
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    "k4s2_pad1": ((2, 3, 5, 6), (3, 2, 4, 4), False, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "asym": (
        (1, 3, 5, 4),
        (3, 2, 3, 2),
        True,
        {"strides": [3, 2], "pads": [0, 1, 2, 0], "output_padding": [2, 1]},
    ),
    "pad_gt_reach": ((1, 2, 6, 6), (2, 3, 3, 3), True, {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    "dilation2": (
        (1, 3, 5, 5),
        (3, 2, 3, 3),
        True,
        {"dilations": [2, 2], "strides": [2, 2], "pads": [1, 2, 1, 0]},
    ),
    "group2": ((1, 4, 5, 5), (4, 3, 3, 3), True, {"group": 2, "strides": [2, 2]}),
    "depthwise": (
        (1, 6, 4, 4),
        (6, 1, 3, 3),
        True,
        {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    "same_upper": ((1, 3, 5, 5), (3, 2, 3, 3), True, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 3, 5, 5), (3, 2, 4, 4), True, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "output_shape": (
        (1, 3, 5, 5),
        (3, 2, 3, 3),
        False,
        {"strides": [2, 2], "output_shape": [10, 10]},
    ),
    "channels_gt_128": ((1, 130, 3, 3), (130, 140, 2, 2), True, {"strides": [2, 2]}),
    "1d": ((2, 4, 9), (4, 3, 3), True, {"strides": [2], "pads": [1, 0]}),
    "1d_outpad": (
        (1, 4, 7),
        (4, 2, 5),
        False,
        {"strides": [3], "pads": [2, 2], "output_padding": [1]},
    ),
}


@pytest.mark.parametrize("case", list(CONV_TRANSPOSE_CASES))
def test_conv_transpose(case: str) -> None:
    x_shape, w_shape, bias, attrs = CONV_TRANSPOSE_CASES[case]
    inits = {"w": weights(1, *w_shape)}
    if bias:
        inits["b"] = weights(2, w_shape[1] * attrs.get("group", 1))
    model = one_node_model("ConvTranspose", {"x": x_shape}, initializers=inits, **attrs)
    check(model)


def test_conv_transpose_runtime_weights() -> None:
    model = one_node_model(
        "ConvTranspose",
        {"x": (1, 3, 4, 4), "w": (3, 2, 3, 3), "b": (2,)},
        strides=[2, 2],
        pads=[1, 1, 1, 1],
    )
    check(model, seed=4)


# --- Trilu, CumSum, Range -----------------------------------------------------------------------

# (shape, upper, k or None)
TRILU_CASES = {
    "upper": ((5, 7), 1, None),
    "lower": ((5, 7), 0, None),
    "upper_k2": ((6, 6), 1, 2),
    "lower_k_neg": ((2, 6, 8), 0, -2),
    "upper_k_neg": ((3, 4, 5), 1, -1),
    "k_beyond": ((4, 5), 1, 9),
    "rows_gt_128": ((200, 30), 0, 3),
    "cols_gt_2048": ((3, 2500), 1, 1000),
}


@pytest.mark.parametrize("case", list(TRILU_CASES))
def test_trilu(case: str) -> None:
    shape, upper, k = TRILU_CASES[case]
    inits = {} if k is None else {"k": int64(k)}
    check(
        one_node_model("Trilu", {"x": shape}, initializers=inits, upper=upper), atol=0.0, rtol=0.0
    )


def test_trilu_runtime_k_and_int64() -> None:
    model = typed_model(
        "Trilu",
        {"x": (3, 6, 6), "k": ()},
        {"x": TensorProto.INT64, "k": TensorProto.INT64},
        TensorProto.INT64,
        upper=0,
    )
    x = (1 << 30) + np.arange(108, dtype=np.int64).reshape(3, 6, 6)
    exact(model, feeds={"x": x, "k": np.array(-1, np.int64)})


def test_trilu_causal_mask_of_infinities() -> None:
    """triu(full(-inf), 1): the zeros below the diagonal must not become NaN."""
    model = one_node_model("Trilu", {"x": (8, 8)}, initializers={"k": int64(1)})
    exact(model, feeds={"x": np.full((8, 8), -np.inf, np.float32)})


# (shape, axis)
CUMSUM_SHAPES = {
    "1d": ((10,), 0),
    "last_axis": ((3, 7), 1),
    "first_axis": ((6, 5), 0),
    "middle_axis": ((2, 9, 3), 1),
    "long_axis": ((2, 300), -1),
    "long_axis_exact_blocks": ((3, 256, 2), 1),
    "wide": ((5, 700), 0),
}


@pytest.mark.parametrize("flags", [(0, 0), (1, 0), (0, 1), (1, 1)], ids=str)
@pytest.mark.parametrize("case", list(CUMSUM_SHAPES))
def test_cumsum(case: str, flags) -> None:
    shape, axis = CUMSUM_SHAPES[case]
    exclusive, reverse = flags
    model = one_node_model(
        "CumSum",
        {"x": shape},
        initializers={"axis": int64(axis)},
        exclusive=exclusive,
        reverse=reverse,
    )
    check(model)


@pytest.mark.parametrize("flags", [(0, 0), (1, 0), (0, 1), (1, 1)], ids=str)
@pytest.mark.parametrize("case", ["last_axis", "middle_axis", "long_axis", "wide"])
def test_cumsum_int64_exact(case: str, flags) -> None:
    shape, axis = CUMSUM_SHAPES[case]
    model = typed_model(
        "CumSum",
        {"x": shape},
        {"x": TensorProto.INT64},
        TensorProto.INT64,
        initializers={"axis": np.array(axis, np.int32)},
        exclusive=flags[0],
        reverse=flags[1],
    )
    # Sums of up to 700 values of ±2^21: beyond 2^24, inside int32 (docs/neuroncore.md#integers).
    x = np.random.default_rng(1).integers(-(1 << 21), 1 << 21, shape)
    exact(model, feeds={"x": x})


def test_cumsum_position_ids() -> None:
    """Position ids from an attention mask, as exported: CumSum over int64 along the sequence."""
    model = typed_model(
        "CumSum",
        {"x": (2, 5000)},
        {"x": TensorProto.INT64},
        TensorProto.INT64,
        initializers={"axis": int64(1)},
    )
    exact(model, feeds={"x": np.random.default_rng(2).integers(0, 2, (2, 5000))})


# (start, limit, delta, element type)
RANGE_CASES = {
    "int64": (2, 300, 3, TensorProto.INT64),
    "int64_negative_delta": (10, -5, -2, TensorProto.INT64),
    "int32_large": (1 << 30, (1 << 30) + 40, 1, TensorProto.INT32),
    "float": (0.5, 7.0, 0.25, TensorProto.FLOAT),
}


@pytest.mark.parametrize("runtime", [False, True])
@pytest.mark.parametrize("case", list(RANGE_CASES))
def test_range(case: str, runtime: bool) -> None:
    """Range of constants is folded by the importer, so the node reaching the code generator
    has run-time scalars (the output length declared) or a run-time limit only."""
    start, limit, delta, elem = RANGE_CASES[case]
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    length = max(0, int(np.ceil((limit - start) / delta)))
    values = {
        "s": np.array(start, np_type),
        "l": np.array(limit, np_type),
        "d": np.array(delta, np_type),
    }
    runtime_names = ["s", "l", "d"] if runtime else ["l"]
    inits = {n: v for n, v in values.items() if n not in runtime_names}
    graph = helper.make_graph(
        [helper.make_node("Range", ["s", "l", "d"], ["y"])],
        "test",
        [helper.make_tensor_value_info(n, elem, []) for n in runtime_names],
        [helper.make_tensor_value_info("y", elem, [length])],
        [helper.make_tensor(n, elem, [], [v.item()]) for n, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    tolerance = 1e-5 if elem == TensorProto.FLOAT else 0.0  # onnxruntime accumulates delta
    check(model, feeds={n: values[n] for n in runtime_names}, atol=tolerance, rtol=tolerance)


# --- Resize -------------------------------------------------------------------------------------


def resize_model(shape, mode: str, scales=None, sizes=None, opset: int = 18, **attrs):
    names, inits = ["x", ""], {}
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        names.append("scales")
    else:
        inits["sizes"] = int64(*sizes)
        names += ["", "sizes"]
    node = helper.make_node("Resize", names, ["y"], mode=mode, **attrs)
    return make_model(node, {"x": shape}, {"y": None}, opset, inits)


NEAREST_TRANSFORMS = [
    "half_pixel",
    "asymmetric",
    "align_corners",
    "pytorch_half_pixel",
    "tf_half_pixel_for_nn",
]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# (shape, scales or None, sizes or None)
RESIZE_SHAPES = {
    "up2": ((1, 2, 4, 5), [1, 1, 2, 2], None),
    "up3_by_sizes": ((1, 2, 3, 4), None, [1, 2, 9, 12]),
    "down2": ((1, 2, 8, 6), [1, 1, 0.5, 0.5], None),
    "fractional": ((1, 1, 5, 7), None, [1, 1, 7, 4]),
    "fractional_scale": ((2, 1, 4, 6), [1, 1, 1.7, 0.6], None),
}


# onnxruntime's source computes asymmetric coordinates as fp32 x / scale, which puts 2 · 7/4 at
# 3.4999998 (round_prefer_ceil: 3), yet the built library returns 4, as exact arithmetic would.
# The lowering follows the source's fp32 formula, which matches every other case here.
ORT_ASYMMETRIC_TIE = pytest.mark.xfail(
    strict=True, reason="onnxruntime rounds the fp32 near-tie 3.4999998 (exactly 3.5) up"
)


def nearest_params():
    for case in RESIZE_SHAPES:
        for transform in NEAREST_TRANSFORMS:
            for mode in NEAREST_MODES:
                marks = (
                    [ORT_ASYMMETRIC_TIE]
                    if (case, transform, mode) == ("fractional", "asymmetric", "round_prefer_ceil")
                    else []
                )
                yield pytest.param(
                    case, transform, mode, marks=marks, id=f"{case}-{transform}-{mode}"
                )


@pytest.mark.parametrize(("case", "transform", "nearest_mode"), list(nearest_params()))
def test_resize_nearest(case: str, transform: str, nearest_mode: str) -> None:
    shape, scales, sizes = RESIZE_SHAPES[case]
    opset = 13 if transform == "tf_half_pixel_for_nn" else 18
    model = resize_model(
        shape,
        "nearest",
        scales,
        sizes,
        opset,
        coordinate_transformation_mode=transform,
        nearest_mode=nearest_mode,
    )
    exact(model)


LINEAR_TRANSFORMS = [
    "half_pixel",
    "asymmetric",
    "align_corners",
    "pytorch_half_pixel",
    "half_pixel_symmetric",
]


@pytest.mark.parametrize("transform", LINEAR_TRANSFORMS)
@pytest.mark.parametrize("case", list(RESIZE_SHAPES))
def test_resize_linear(case: str, transform: str) -> None:
    shape, scales, sizes = RESIZE_SHAPES[case]
    opset = 19 if transform == "half_pixel_symmetric" else 18
    check(
        resize_model(
            shape, "linear", scales, sizes, opset, coordinate_transformation_mode=transform
        )
    )


@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("case", ["up2", "down2", "fractional"])
def test_resize_cubic(case: str, exclude_outside: int) -> None:
    shape, scales, sizes = RESIZE_SHAPES[case]
    check(
        resize_model(
            shape, "cubic", scales, sizes, cubic_coeff_a=-0.5, exclude_outside=exclude_outside
        )
    )


def test_resize_unet_bilinear() -> None:
    check(resize_model((1, 16, 32, 32), "linear", [1, 1, 2, 2]))


def test_resize_linear_large_plane() -> None:
    """Input and output sides beyond 128 rows and 512 columns: tiled contraction and N."""
    check(resize_model((1, 1, 150, 140), "linear", None, [1, 1, 200, 600]))


def test_resize_nearest_rank3_and_batch_axis() -> None:
    exact(resize_model((2, 3, 5), "nearest", [2, 1, 3]))


def test_resize_axes_and_keep_aspect_ratio() -> None:
    node = helper.make_node(
        "Resize",
        ["x", "", "", "sizes"],
        ["y"],
        mode="nearest",
        axes=[2, 3],
        keep_aspect_ratio_policy="not_larger",
    )
    exact(make_model(node, {"x": (1, 2, 4, 6)}, {"y": None}, 18, {"sizes": int64(8, 9)}))
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", axes=[3, 2])
    check(
        make_model(
            node, {"x": (1, 2, 4, 6)}, {"y": None}, 18, {"scales": np.array([0.5, 2.0], np.float32)}
        )
    )


# --- reductions -------------------------------------------------------------------------------

MORE_REDUCE_OPS = [
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceProd",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
# (shape, axes or None for all)
MORE_REDUCE_AXES = {
    "last": ((2, 3, 4, 5), [-1]),
    "axes_0_2": ((2, 3, 4, 5), [0, 2]),
    "all": ((3, 4, 5), None),
    "long_row": ((3, 10000), [1]),
    "long_strided_pieces": ((3, 9000, 2, 5), [1, 3]),
}


def reduce_feeds(op: str, model) -> dict[str, np.ndarray]:
    feeds = feeds_of(model, 3)
    x = feeds["x"]
    if op == "ReduceProd":  # products of many values near ±1 stay finite
        x = np.where(x < 0, -1.0, 1.0) * (1.0 + np.abs(x) / 1000)
    elif op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    elif op == "ReduceLogSumExp":
        x = x * 30  # exp(30+) overflows fp32 without the max shift
    return {"x": np.asarray(x, np.float32)}


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("case", list(MORE_REDUCE_AXES))
@pytest.mark.parametrize("op", MORE_REDUCE_OPS)
def test_reduce_more(op: str, case: str, keepdims: int) -> None:
    shape, axes = MORE_REDUCE_AXES[case]
    inits = {} if axes is None else {"axes": int64(*axes)}
    model = one_node_model(op, {"x": shape}, initializers=inits, keepdims=keepdims)
    check(model, feeds=reduce_feeds(op, model))


def test_reduce_opset13_axes_attribute_l2() -> None:
    check(one_node_model("ReduceL2", {"x": (2, 3, 4)}, opset=13, axes=[1, 2], keepdims=0))


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceSumSquare", "ReduceProd"])
def test_reduce_int64_exact(op: str) -> None:
    model = typed_model(
        op,
        {"x": (3, 4, 5)},
        {"x": TensorProto.INT64},
        TensorProto.INT64,
        initializers={"axes": int64(1)},
    )
    # Results beyond 2^24 and inside int32: exact only on GpSimd's integer lanes
    # (docs/neuroncore.md#integers).
    x = np.random.default_rng(4).integers(-200, 200, (3, 4, 5))
    if op != "ReduceProd":
        x = x * 100  # squares up to 4e8, sums of four of them under 2^31
    exact(model, feeds={"x": x})


# --- opset variants -----------------------------------------------------------------------------


def _variant(op: str, opset: int):
    inits = {}
    if op == "Cast":
        return typed_model(
            "Cast",
            {"x": (3, 4)},
            {"x": TensorProto.FLOAT},
            TensorProto.INT32,
            opset=opset,
            to=TensorProto.INT32,
        )
    if op == "Where":
        return typed_model(
            "Where",
            {"c": (3, 4), "a": (3, 4), "b": (4,)},
            {"c": TensorProto.BOOL, "a": TensorProto.FLOAT, "b": TensorProto.FLOAT},
            TensorProto.FLOAT,
            opset=opset,
        )
    if op == "Equal":
        return typed_model(
            "Equal",
            {"a": (3, 4), "b": (4,)},
            {"a": TensorProto.INT64, "b": TensorProto.INT64},
            TensorProto.BOOL,
            opset=opset,
        )
    if op == "CumSum":
        inits = {"axis": int64(1)}
    elif op == "Trilu":
        inits = {"k": int64(1)}
    elif op in ("Expand", "Tile"):
        inits = {"s": int64(2, 3, 4)} if op == "Expand" else {"s": int64(2, 1)}
    elif op == "Clip":
        inits = {"lo": np.full((), -0.3, np.float32)}
    return one_node_model(op, {"x": (3, 4)}, opset=opset, initializers=inits)


OPSET_VARIANTS = [
    ("Cast", 13),
    ("Cast", 19),
    ("Cast", 21),
    ("Where", 16),
    ("Equal", 19),
    ("CumSum", 14),
    ("Trilu", 14),
    ("Expand", 13),
    ("Tile", 13),
    ("HardSigmoid", 6),
    ("HardSwish", 14),
    ("Elu", 6),
    ("Selu", 6),
    ("LeakyRelu", 16),
    ("Softsign", 1),
    ("Mish", 18),
    ("Celu", 12),
    ("Clip", 13),
]


@pytest.mark.parametrize(
    ("op", "opset"), OPSET_VARIANTS, ids=[f"{o}-{v}" for o, v in OPSET_VARIANTS]
)
def test_opset_variants(op: str, opset: int) -> None:
    check(_variant(op, opset), atol=0.0 if op in ("Cast", "Equal", "Where") else 1e-4)


def test_resize_nearest_three_halves() -> None:
    """A 3/2 upsample: each axis is two periodic segments, so four DMAs in all."""
    exact(resize_model((1, 2, 20, 30), "nearest", [1, 1, 1.5, 1.5]))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 1.3, 1.0], [1, 1, 1.3, 2.0]], ids=str)
def test_resize_scale_without_length_change(mode: str, scales) -> None:
    """Scale 1.3 on 3 rows keeps 3 rows: onnxruntime copies a tensor whose shape does not
    change, but still maps the rows through the scale when another axis resizes."""
    check(resize_model((1, 1, 3, 4), mode, scales))


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64])
def test_where_both_branches_scalar_constants(elem: int) -> None:
    """The exported attention mask: Where(mask, 0, lowest) with 0-d constant branches."""
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    low = -np.inf if elem == TensorProto.FLOAT else -(1 << 30) - 3
    model = typed_model(
        "Where",
        {"c": (1, 1, 16, 16)},
        {"c": TensorProto.BOOL},
        elem,
        initializers={"a": np.zeros((), np_type), "b": np.array(low, np_type)},
    )
    exact(model)


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5)], ids=str)
def test_prelu_opset6_per_channel_slope(shape) -> None:
    """Before opset 7 a [C] slope applies per channel, not along the last axis. onnxruntime
    has no PRelu-6 kernel, so the reference is the formula."""
    model = one_node_model("PRelu", {"x": shape, "s": (3,)}, opset=6)
    compiled = compile_graph(import_graph(model), FP32, [])
    assert not verify_module(compiled.module)
    feeds = feeds_of(model, 2)
    got = run_function(compiled.module, feeds)["y"]
    slope = feeds["s"].reshape((3,) + (1,) * (len(shape) - 2))
    np.testing.assert_allclose(
        got, np.where(feeds["x"] > 0, feeds["x"], feeds["x"] * slope), rtol=1e-6, atol=1e-7
    )


def test_resize_aspect_policy_needs_constant_sizes() -> None:
    node = helper.make_node(
        "Resize",
        ["x", "", "", "sizes"],
        ["y"],
        mode="nearest",
        keep_aspect_ratio_policy="not_larger",
    )
    graph = helper.make_graph(
        [node],
        "test",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
            helper.make_tensor_value_info("sizes", TensorProto.INT64, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    with pytest.raises(UserError, match="sizes must be constants"):
        check(model, feeds={"x": weights(1, 1, 1, 4, 4), "sizes": int64(1, 1, 8, 8)})


def test_where_nan_guard_is_exact() -> None:
    """Where(IsNaN(p), 0, p): a NaN in the branch not taken must not leak (CopyPredicated)."""
    from onnx2bir.compiler import compile_model
    from onnx2bir.runtime.machine.interpreter import run_function

    nodes = [
        helper.make_node("Log", ["x"], ["p"]),  # log of negatives: NaN
        helper.make_node("IsNaN", ["p"], ["nan"]),
        helper.make_node("Where", ["nan", "zero", "p"], ["y"]),
    ]
    model = make_model(
        nodes, {"x": (3, 50)}, {"y": (3, 50)}, initializers={"zero": np.array(0.0, np.float32)}
    )
    compilation = compile_model(model, FP32)
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    got = run_function(compilation.module, {"x": x})["y"]
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.where(x < 0, 0.0, np.log(x)).astype(np.float32)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, expected, rtol=1e-6)
