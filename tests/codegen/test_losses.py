"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss lowered by `codegen/lower/losses.py`,
validated against onnxruntime (`onnx2bir.api.validate`, fp32 tolerance, no autocast).

One-node models with seeded inputs: targets in [0, C), about a third of them replaced by
`ignore_index` when the case sets one (in range, negative or past C). The shapes cover the
three tilings of positions: D = 1 (batch items on partitions), 1 < D < 128 (whole items of D
positions per tile) and D ≥ 128 (positions of one item), and lines longer than a select chunk
(and, for the softmax, longer than its row chunk).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import IR_VERSION
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.api.validate import validate
from onnx2bir.codegen.driver import CodegenError
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime

NLL, SCE = "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"
OPSET = {NLL: 22, SCE: 13}


def loss_model(
    op: str,
    shape: tuple[int, ...],
    reduction: str = "mean",
    weight: bool | np.ndarray = False,
    ignore_index: int | None = None,
    log_prob: bool = False,
    opset: int | None = None,
    target_type: int = TensorProto.INT64,
) -> onnx.ModelProto:
    """A one-node loss model; `weight` an array makes it an initializer, True an input."""
    classes, target_shape = shape[1], [shape[0], *shape[2:]]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
        helper.make_tensor_value_info("t", target_type, target_shape),
    ]
    names, initializers = ["x", "t"], []
    if isinstance(weight, np.ndarray):
        initializers.append(numpy_helper.from_array(weight, "w"))
        names.append("w")
    elif weight:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [classes]))
        names.append("w")
    outputs = ["loss", "log_prob"] if log_prob else ["loss"]
    attrs: dict[str, object] = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    node = helper.make_node(op, names, outputs, **attrs)
    graph = helper.make_graph(
        [node],
        "loss",
        inputs,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        initializers,
    )
    opset = opset or OPSET[op]
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def loss_feeds(
    shape: tuple[int, ...],
    weight: bool = False,
    ignore_index: int | None = None,
    seed: int = 0,
    target_dtype=np.int64,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, shape[1], size=(shape[0], *shape[2:])).astype(target_dtype)
    if ignore_index is not None:
        targets[rng.random(targets.shape) < 0.3] = ignore_index
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "t": targets}
    if weight:
        feeds["w"] = (rng.random(shape[1]) + 0.25).astype(np.float32)
    return feeds


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    result = validate(model, feeds, auto_cast="none")
    assert result.passed, result.text()
    rules = {inst.origin.rule for inst in _instructions(result.details.module.functions[0].entry)}
    op = model.graph.node[0].op_type
    assert f"generic.{op}" in rules  # lowered as the op itself, not as its function body


def _instructions(block):
    for item in block.items:
        if hasattr(item, "body"):
            yield from _instructions(item.body)
        else:
            yield item


@pytest.mark.parametrize("op", [NLL, SCE])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight", [False, True], ids=["no_weight", "weight"])
def test_reductions_and_weight(op, reduction, weight):
    shape = (6, 5)
    check(loss_model(op, shape, reduction, weight), loss_feeds(shape, weight))


@pytest.mark.parametrize("op", [NLL, SCE])
@pytest.mark.parametrize("ignore_index", [1, -1, 10], ids=["in_range", "negative", "past_c"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("weight", [False, True], ids=["no_weight", "weight"])
def test_ignore_index(op, ignore_index, reduction, weight):
    """Ignored positions weigh nothing; `mean` divides by the weight of the others (their
    count without weights). A target past C picks no score at all."""
    shape = (4, 5, 3)
    model = loss_model(op, shape, reduction, weight, ignore_index)
    check(model, loss_feeds(shape, weight, ignore_index))


@pytest.mark.parametrize("op", [NLL, SCE])
@pytest.mark.parametrize(
    "shape",
    [(3, 4, 2, 3), (2, 3, 2, 2, 2, 2), (2, 3, 130), (200, 7), (2, 2100)],
    ids=["rank4", "rank6", "positions_per_item_over_128", "items_over_128", "long_line"],
)
def test_rank_and_tiling(op, shape):
    """D < 128 packs whole items per tile, D ≥ 128 tiles one item; 200 items take two tiles;
    2100 classes are selected in two chunks."""
    model = loss_model(op, shape, "mean", True, 0)
    check(model, loss_feeds(shape, True, 0))


def test_softmax_rows_longer_than_a_chunk():
    """More classes than the log-softmax holds in SBUF at once (its chunked passes)."""
    shape = (2, 8200)
    check(loss_model(SCE, shape, "sum", log_prob=True), loss_feeds(shape))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("shape", [(3, 5), (2, 4, 3)], ids=["NC", "NCd1"])
def test_log_prob_output(reduction, shape):
    model = loss_model(SCE, shape, reduction, True, 2, log_prob=True)
    check(model, loss_feeds(shape, True, 2))


@pytest.mark.parametrize(("op", "opset"), [(NLL, 12), (NLL, 13), (SCE, 12)])
def test_older_opsets(op, opset):
    """Opset 12 SoftmaxCrossEntropyLoss of rank 3 still normalises over C alone."""
    shape = (3, 4, 5)
    model = loss_model(op, shape, "mean", True, 1, log_prob=op == SCE, opset=opset)
    check(model, loss_feeds(shape, True, 1))


@pytest.mark.parametrize("op", [NLL, SCE])
def test_int32_targets(op):
    shape = (4, 6, 2)
    model = loss_model(op, shape, "sum", target_type=TensorProto.INT32)
    check(model, loss_feeds(shape, target_dtype=np.int32))


def test_minus_infinity_away_from_the_target_costs_nothing():
    """Log-probabilities of 0 (−inf) at classes not picked: the select is inf-safe."""
    shape = (4, 5)
    feeds = loss_feeds(shape, True, 3)
    x = feeds["x"]
    x[np.arange(4), (feeds["t"] + 1) % 5] = -np.inf
    check(loss_model(NLL, shape, "mean", True, 3), feeds)


def test_a_wrong_loss_fails_the_comparison():
    """The bound can fail: the summed weighted loss passes, all zeros fails, and the same
    program with the weight (an initializer) of the class adding most to the sum 1% larger
    fails."""
    shape = (16, 5)
    weight = np.linspace(0.5, 1.5, shape[1]).astype(np.float32)
    model = loss_model(NLL, shape, "sum", weight)
    feeds = loss_feeds(shape)
    feeds["x"] = -np.abs(feeds["x"])  # log-probabilities: every loss term positive
    compiled = compile_graph(import_graph(model), CompileOptions(auto_cast="none"), [])
    expected = run_onnxruntime(model, feeds)["loss"]

    def passed(got: np.ndarray) -> bool:
        return compare_output("loss", got, expected, FP32_ATOL, FP32_RTOL).passed

    def machine() -> np.ndarray:
        got = run_function(compiled.module, feeds)
        return got["loss" if "loss" in got else "loss:output"]

    assert passed(machine())
    assert not passed(np.zeros_like(expected))
    picked = -feeds["x"][np.arange(shape[0]), feeds["t"]]
    heaviest = int(np.argmax(np.bincount(feeds["t"], picked * weight[feeds["t"]])))
    constants = compiled.module.constants
    scaled = constants["w"].copy()
    scaled[heaviest] *= 1.01  # its terms are about half the sum: 0.5% off, five bounds
    constants["w"] = scaled
    assert not passed(machine())


def test_an_unknown_reduction_is_refused_by_name():
    model = loss_model(NLL, (3, 5), "mean")
    model.graph.node[0].attribute[0].s = b"max"
    with pytest.raises(CodegenError, match=r"NegativeLogLikelihoodLoss.*reduction 'max'"):
        compile_graph(import_graph(model), CompileOptions(auto_cast="none"), [])
