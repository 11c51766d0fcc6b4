"""ONNX `Loop` lowered to BIR loops (docs/loops.md), run on the machine, against onnxruntime.

- a cumulative sum with a trip count: a constant M gives a static Loop, a runtime M a
  DynamicFor loop whose bound is read from M's DRAM location;
- a data-dependent condition: a test-before DoWhile whose continue condition the body
  recomputes; with M as well, the condition also bounds the trips;
- the body's own tensors live for the loop region (`local_locations`).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from conftest import IR_VERSION
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.ir import DoWhile, DynamicLoop, Loop, runtime_loops
from onnx2bir.bir.json_io import read_module, write_module
from onnx2bir.bir.verify import verify_module
from onnx2bir.compiler import compile_model
from onnx2bir.errors import UserError
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime

N = 4


def _model(nodes, inputs, outputs, body, initializers=()):
    loop_inputs, loop_outputs = nodes
    loop = helper.make_node("Loop", loop_inputs, loop_outputs, body=body)
    graph = helper.make_graph([loop], "loop_test", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _scalar(name, elem):
    return helper.make_tensor_value_info(name, elem, [])


def cumsum_body():
    """acc ← acc + x + i (the iteration number), the condition passed through."""
    nodes = [
        helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["acc", "x"], ["t"]),
        helper.make_node("Add", ["t", "i_f"], ["acc_out"]),
        helper.make_node("Identity", ["cond"], ["cond_out"]),
    ]
    return helper.make_graph(
        nodes,
        "cumsum",
        [
            _scalar("i", TensorProto.INT64),
            _scalar("cond", TensorProto.BOOL),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, [N]),
        ],
        [
            _scalar("cond_out", TensorProto.BOOL),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [N]),
        ],
    )


def grow_body(threshold: float = 40.0):
    """acc ← acc + |x| + 1 while sum(acc) < threshold: the trip count depends on the data."""
    nodes = [
        helper.make_node("Abs", ["x"], ["ax"]),
        helper.make_node("Add", ["acc", "ax"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["acc_out"]),
        helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
        helper.make_node("Less", ["total", "limit"], ["cond_out"]),
    ]
    return helper.make_graph(
        nodes,
        "grow",
        [
            _scalar("i", TensorProto.INT64),
            _scalar("cond", TensorProto.BOOL),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, [N]),
        ],
        [
            _scalar("cond_out", TensorProto.BOOL),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [N]),
        ],
    )


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])
CONSTS = [
    numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    numpy_helper.from_array(np.array(40.0, np.float32), "limit"),
    numpy_helper.from_array(np.array(True), "true"),
]


def cumsum_model(trip_count: int | None):
    """y = x·M + M(M−1)/2 by a loop; M an input when trip_count is None."""
    inputs, inits = [X], list(CONSTS)
    if trip_count is None:
        inputs.append(_scalar("M", TensorProto.INT64))
    else:
        inits.append(numpy_helper.from_array(np.array(trip_count, np.int64), "M"))
    inits.append(numpy_helper.from_array(np.zeros(N, np.float32), "zero"))
    return _model((["M", "true", "zero"], ["y"]), inputs, [Y], cumsum_body(), inits)


def grow_model(with_trip_count: bool):
    """y = x grown until its sum reaches 40 (at most M trips); the first test reads x."""
    inputs = [X, *([_scalar("M", TensorProto.INT64)] if with_trip_count else [])]
    head = [
        helper.make_node("ReduceSum", ["x"], ["s0"], keepdims=0),
        helper.make_node("Less", ["s0", "limit"], ["c0"]),
    ]
    loop = helper.make_node("Loop", ["M" if with_trip_count else "", "c0", "x"], ["y"])
    loop.attribute.append(helper.make_attribute("body", grow_body()))
    graph = helper.make_graph([*head, loop], "grow_test", inputs, [Y], initializer=CONSTS)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def run_and_compare(model, feeds):
    compilation = compile_model(model)
    module = compilation.module
    problems = verify_module(module)
    assert not problems, problems
    got = run_function(module, feeds)["y"]
    ref = run_onnxruntime(model, feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    return module


def loops_of(module):
    def walk(block):
        for item in block.items:
            if isinstance(item, Loop):
                yield item
                yield from walk(item.body)

    return list(walk(module.functions[0].entry))


def x_feed(seed=0):
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


def test_cumsum_with_constant_trip_count_is_a_static_loop():
    module = run_and_compare(cumsum_model(5), {"x": x_feed()})
    kinds = {type(loop) for loop in loops_of(module)}
    assert DynamicLoop not in kinds and DoWhile not in kinds
    assert [loop.trip_count for loop in loops_of(module) if loop.axis.startswith("loop")] == [5]


@pytest.mark.parametrize("trips", [0, 1, 7])
def test_cumsum_with_runtime_trip_count_is_a_dynamic_for_loop(trips):
    model = cumsum_model(None)
    module = run_and_compare(model, {"x": x_feed(trips), "M": np.array(trips, np.int64)})
    (loop,) = runtime_loops(module.functions[0].entry)
    assert isinstance(loop, DynamicLoop)
    assert loop.stop_value.loc == "M" and not loop.parallel
    # The body's own DRAM tensors live for the loop region.
    assert any(name.endswith("/t") for name in loop.local_locations), loop.local_locations


def test_data_dependent_condition_is_a_test_before_do_while():
    model = grow_model(with_trip_count=False)
    for seed in range(3):
        module = run_and_compare(model, {"x": x_feed(seed)})
    (loop,) = runtime_loops(module.functions[0].entry)
    assert isinstance(loop, DoWhile) and not loop.is_do_while
    # x already past the threshold: tested before the first trip, the body never runs.
    big = np.full(N, 20.0, np.float32)
    np.testing.assert_array_equal(run_function(module, {"x": big})["y"], big)


@pytest.mark.parametrize("trips", [0, 2, 50])
def test_condition_and_trip_count_bound_the_do_while_together(trips):
    model = grow_model(with_trip_count=True)
    run_and_compare(model, {"x": x_feed(1), "M": np.array(trips, np.int64)})


def test_runtime_loops_survive_the_json_round_trip(tmp_path):
    model = grow_model(with_trip_count=True)
    module = compile_model(model).module
    json_path, _ = write_module(module, tmp_path, "grow")
    schema = json.loads((Path(__file__).parents[2] / "onnx2bir/bir/schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads(json_path.read_text()))
    loaded = read_module(json_path)
    feeds = {"x": x_feed(2), "M": np.array(3, np.int64)}
    np.testing.assert_array_equal(
        run_function(loaded, feeds)["y"], run_function(module, feeds)["y"]
    )
    (loop,) = runtime_loops(loaded.functions[0].entry)
    assert isinstance(loop, DoWhile)
    assert loop.local_locations == next(runtime_loops(module.functions[0].entry)).local_locations


def test_scan_outputs_are_refused_with_a_clear_error():
    body = cumsum_body()
    body.output.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [N]))
    inits = [
        *CONSTS,
        numpy_helper.from_array(np.zeros(N, np.float32), "zero"),
        numpy_helper.from_array(np.array(3, np.int64), "M"),
    ]
    scan = helper.make_tensor_value_info("scan", TensorProto.FLOAT, [3, N])
    model = _model((["M", "true", "zero"], ["y", "scan"]), [X], [Y, scan], body, inits)
    with pytest.raises(UserError, match="scan outputs are not supported"):
        compile_model(model)


@pytest.mark.parametrize(("name", "kind"), [("loop_cumsum", DynamicLoop), ("loop_while", DoWhile)])
def test_committed_loop_models_convert_and_validate(name, kind, tmp_path, capsys):
    from pathlib import Path

    from onnx2bir.cli.commands import main

    path = Path(__file__).parents[2] / "models" / f"{name}.onnx"
    assert main(["validate", str(path)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["convert", str(path), "-o", str(tmp_path)]) == 0
    loaded = read_module(tmp_path / f"{name}.bir.json")
    assert [type(loop) for loop in runtime_loops(loaded.functions[0].entry)] == [kind]


def test_body_with_its_own_constant_and_an_outer_computed_tensor():
    """The body folds its Constant node and reads r = Relu(x), computed before the loop."""
    body = helper.make_graph(
        [
            helper.make_node(
                # a vector, so that it is loaded (a one-element constant rides as an immediate)
                "Constant",
                [],
                ["half"],
                value=numpy_helper.from_array(np.full(N, 0.5, np.float32)),
            ),
            helper.make_node("Mul", ["r", "half"], ["step"]),
            helper.make_node("Add", ["acc", "step"], ["acc_out"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
        "body",
        [
            _scalar("i", TensorProto.INT64),
            _scalar("cond", TensorProto.BOOL),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, [N]),
        ],
        [
            _scalar("cond_out", TensorProto.BOOL),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [N]),
        ],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Loop", ["M", "", "x"], ["y"], body=body),
    ]
    graph = helper.make_graph(nodes, "outer_ref", [X, _scalar("M", TensorProto.INT64)], [Y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    module = run_and_compare(model, {"x": x_feed(4), "M": np.array(6, np.int64)})
    (loop,) = runtime_loops(module.functions[0].entry)
    assert isinstance(loop, DynamicLoop)
    # The folded constant travels as a payload; it is not a loop-region local.
    consts = [name for name in module.constants if name.endswith("/half")]
    assert consts and not set(consts) & set(loop.local_locations)


def test_a_body_with_initializers_of_its_own_matches_onnxruntime():
    """Valid ONNX (the checker passes, onnxruntime runs it): the body's own initializers are
    constants of the body; one shares a name with an outer tensor and must not be confused."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["acc", "half"], ["scaled"]),
            helper.make_node("Add", ["scaled", "x"], ["acc_out"]),  # the outer x
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
        "body",
        [
            _scalar("i", TensorProto.INT64),
            _scalar("cond", TensorProto.BOOL),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, [N]),
        ],
        [
            _scalar("cond_out", TensorProto.BOOL),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [N]),
        ],
        [numpy_helper.from_array(np.linspace(0.25, 1.0, N).astype(np.float32), "half")],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["half"]),  # an outer tensor of the same name
        helper.make_node("Loop", ["M", "", "half"], ["y"], body=body),
    ]
    graph = helper.make_graph(nodes, "body_inits", [X, _scalar("M", TensorProto.INT64)], [Y])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    run_and_compare(model, {"x": x_feed(5), "M": np.array(3, np.int64)})
