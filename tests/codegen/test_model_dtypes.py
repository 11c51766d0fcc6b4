"""Every numeric ONNX dtype the machine has, end to end against onnxruntime, and a wrong
answer per dtype that fails.

Each model computes in one dtype (docs/dtypes.md): int16, uint16, uint32, uint64 and float64
in arithmetic onnxruntime has kernels for; int4, uint4 and the float8 types through
QuantizeLinear / Cast and a Transpose between (onnxruntime has little arithmetic in them), with
float32 at the boundary. The right answer passes; the machine's answer with one element moved
(one integer step, or one step of the narrow float) fails the product's own verdict. A value
that does not fit the on-chip dtype of float64 or uint64 is refused by the load's checked
narrowing (NARROWING-CHECKED), naming the node.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2bir
from onnx2bir.errors import MachineError
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine import interpreter
from onnx2bir.runtime.machine.probes import ProbeReader
from onnx2bir.runtime.oracle.ort import run_onnxruntime
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.runtime.oracle.verdict import Evidence, judge
from onnx2bir.validation.prepared import prepare
from onnx2bir.validation.run import oracle_runner

F = TensorProto.FLOAT
SHAPE = [4, 6]


def _model(nodes, inputs, out_type=F, initializers=(), opset=21) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "dtypes",
        inputs,
        [helper.make_tensor_value_info("out", out_type, None)],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _x(elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("x", elem, SHAPE)


def _integer_arithmetic(elem: int, ops: tuple[str, ...]) -> onnx.ModelProto:
    """x (float) -> Cast(elem) -> each op of `ops` with the running value and a constant of
    elem -> Transpose -> Cast(float)."""
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    const = numpy_helper.from_array(np.array([3, 5, 7, 2, 9, 4], np_type), "c")
    nodes, last = [helper.make_node("Cast", ["x"], ["v0"], to=elem)], "v0"
    for index, op in enumerate(ops, 1):
        nodes.append(helper.make_node(op, [last, "c"], [f"v{index}"]))
        last = f"v{index}"
    nodes += [
        helper.make_node("Transpose", [last], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["out"], to=F),
    ]
    return _model(nodes, [_x()], initializers=[const])


def _quantized(elem: int) -> onnx.ModelProto:
    """x -> QuantizeLinear(elem) -> Transpose -> DequantizeLinear -> out."""
    scale = numpy_helper.from_array(np.float32(0.25), "scale")
    zero = numpy_helper.from_array(np.zeros((), helper.tensor_dtype_to_np_dtype(elem)), "zero")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
        helper.make_node("Transpose", ["q"], ["t"], perm=[1, 0]),
        helper.make_node("DequantizeLinear", ["t", "scale", "zero"], ["out"]),
    ]
    return _model(nodes, [_x()], initializers=[scale, zero])


def _cast_through(elem: int) -> onnx.ModelProto:
    """x -> Cast(elem) (rounding, saturating) -> Transpose -> Cast(float)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["n"], to=elem),
        helper.make_node("Transpose", ["n"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["out"], to=F),
    ]
    return _model(nodes, [_x()])


def _float64() -> onnx.ModelProto:
    d = TensorProto.DOUBLE
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Add", ["sq", "x"], ["s"]),
        helper.make_node("ReduceSum", ["s", "axes"], ["r"], keepdims=1),
        helper.make_node("Div", ["s", "r"], ["out"]),
    ]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    return _model(nodes, [_x(d)], out_type=d, initializers=[axes])


def _matmul(elem: int) -> onnx.ModelProto:
    """x @ w + Relu in a float type other than float32: the oracle's allowance and roundings
    are built in the model's own type."""
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    weight = np.random.default_rng(2).standard_normal((SHAPE[1], 5)).astype(np_type)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    return _model(nodes, [_x(elem)], elem, [numpy_helper.from_array(weight, "w")])


def _einsum(elem: int) -> onnx.ModelProto:
    """x·w as an Einsum (onnxruntime has a bfloat16 Einsum, not a bfloat16 MatMul; ONNX's
    Einsum takes bfloat16 from opset 28)."""
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    weight = np.random.default_rng(2).standard_normal((SHAPE[1], 5)).astype(np_type)
    nodes = [helper.make_node("Einsum", ["x", "w"], ["out"], equation="ij,jk->ik")]
    return _model(nodes, [_x(elem)], elem, [numpy_helper.from_array(weight, "w")], opset=28)


def _integers(low: int, high: int):
    return np.random.default_rng(1).integers(low, high, SHAPE).astype(np.float32)


CASES = {
    # int16 products x·c³ of values up to 200 pass 32767 and wrap, as onnxruntime's do
    "int16": (
        _integer_arithmetic(TensorProto.INT16, ("Mul", "Sub", "Mul", "Mul")),
        _integers(-200, 200),
    ),
    "uint16": (_integer_arithmetic(TensorProto.UINT16, ("Mul", "Add", "Div")), _integers(0, 600)),
    "uint32": (_integer_arithmetic(TensorProto.UINT32, ("Mul", "Max", "Div")), _integers(0, 9000)),
    "uint64": (_integer_arithmetic(TensorProto.UINT64, ("Add", "Mul", "Sub")), _integers(10, 9000)),
    "float64": (_float64(), None),
    "float64 matmul": (_matmul(TensorProto.DOUBLE), None),
    "float16 matmul": (_matmul(TensorProto.FLOAT16), None),
    "bfloat16 einsum": (_einsum(TensorProto.BFLOAT16), None),
    "int4": (_quantized(TensorProto.INT4), _integers(-12, 12) / 4.0),
    "uint4": (_quantized(TensorProto.UINT4), _integers(-2, 20) / 4.0),
    "float8e4m3fn quantize": (_quantized(TensorProto.FLOAT8E4M3FN), None),
    # halves and values past the range: rounded half away from zero, wrapped (docs/dtypes.md)
    "int4 cast": (_cast_through(TensorProto.INT4), _integers(-40, 40) / 2.0),
    "uint4 cast": (_cast_through(TensorProto.UINT4), _integers(-40, 40) / 2.0),
    # the scaled inputs reach past ±448 and ±57344: both sides saturate
    "float8e4m3fn cast": (_cast_through(TensorProto.FLOAT8E4M3FN), "wide"),
    "float8e5m2 cast": (_cast_through(TensorProto.FLOAT8E5M2), "wide"),
}


def _inputs(model: onnx.ModelProto, given) -> dict[str, np.ndarray]:
    elem = model.graph.input[0].type.tensor_type.elem_type
    rng = np.random.default_rng(0)
    if isinstance(given, np.ndarray):
        return {"x": given}
    values = rng.standard_normal(SHAPE)
    if given == "wide":
        values *= np.logspace(-3, 5.5, SHAPE[1])  # 1e-3 .. 3e5 across the columns
    return {"x": values.astype(helper.tensor_dtype_to_np_dtype(elem))}


class Run:
    """One run of a model on the machine, and the verdict on any outputs in its place."""

    def __init__(self, path: str, feeds: dict[str, np.ndarray]):
        self.prepared = prepare(path, CompileOptions(auto_cast="none"))
        graph = self.prepared.pristine
        self.graph, self.plan = graph, self.prepared.compilation.cast_plan
        function = self.prepared.compilation.module.functions[0]
        reader = ProbeReader(
            function, self.plan.probes, {t: graph.tensors[t].shape for t in self.plan.probes}
        )
        raw = interpreter.run_function(
            self.prepared.compilation.module, feeds, before=reader.before()
        )
        self.outputs = dict(zip(graph.outputs, (raw[loc] for loc in function.outputs), strict=True))
        self.probes, self.stored = reader.values, reader.stored()
        self.reference = run_onnxruntime(path, feeds, graph.outputs)
        self.runner = oracle_runner(self.prepared, feeds)

    def passes(self, outputs: dict[str, np.ndarray]) -> bool:
        evidence = Evidence(outputs, self.probes, self.stored, self.reference, "fp32")
        judged, checkpoints, _ = judge(
            self.graph, self.plan, evidence, TolerancePolicy(), self.runner
        )
        return all(o["passed"] for o in judged) and all(c["passed"] for c in checkpoints)


def _one_step_off(value: np.ndarray) -> np.ndarray:
    """The same array with its largest finite element moved by about one step of the dtype
    the model computed in (a quarter for the quantized ones, an fp8 step for the casts)."""
    out = value.astype(np.float64).copy()
    flat = out.reshape(-1)
    index = int(np.argmax(np.where(np.isfinite(flat), np.abs(flat), -1)))
    step = max(abs(flat[index]) * 0.13, 0.25)  # more than an e5m2 half-step, at least one quantum
    flat[index] += step if flat[index] >= 0 else -step
    return out.astype(value.dtype)


@pytest.mark.parametrize("name", list(CASES))
def test_a_model_in_the_dtype_matches_onnxruntime_and_a_wrong_answer_fails(tmp_path, name):
    model, given = CASES[name]
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    feeds = _inputs(model, given)
    for auto_cast in ("none", "matmult"):  # the default autocast rounds matmul operands
        result = onnx2bir.validate(path, feeds, auto_cast=auto_cast)
        assert result.passed, (auto_cast, result)
    run = Run(path, feeds)
    assert run.passes(run.outputs)
    wrong = {name: _one_step_off(value) for name, value in run.outputs.items()}
    assert not run.passes(wrong), f"{name}: an answer one step off passes"


def test_float64_beyond_fp32_range_is_refused_by_the_checked_narrowing(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(_float64(), path)
    feeds = {"x": np.full(SHAPE, 1e300)}
    with pytest.raises(MachineError, match=r"NARROWING-CHECKED.*float64 value.*do not fit float32"):
        onnx2bir.validate(path, feeds, auto_cast="none")


def test_uint64_beyond_uint32_is_refused_by_the_checked_narrowing(tmp_path):
    u64 = TensorProto.UINT64
    model = _model(
        [helper.make_node("Add", ["x", "x"], ["out"])],
        [_x(u64)],
        out_type=u64,
    )
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    feeds = {"x": np.full(SHAPE, 2**33, np.uint64)}
    with pytest.raises(MachineError, match=r"NARROWING-CHECKED.*uint64.*do not fit uint32"):
        onnx2bir.validate(path, feeds, auto_cast="none")


def test_int16_products_wrap_as_onnxruntime_s_do(tmp_path):
    model, given = CASES["int16"]
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    run = Run(path, {"x": given})
    c = np.array([3, 5, 7, 2, 9, 4])
    exact = (((given.astype(np.int64) * c - c) * c) * c).T
    assert np.abs(exact).max() > 2**15  # the case does overflow int16
    wrapped = exact.astype(np.int16).astype(np.float32)
    np.testing.assert_array_equal(run.outputs["out"], wrapped)
    np.testing.assert_array_equal(run.reference["out"], wrapped)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2])
def test_a_float8_output_one_step_off_fails(tmp_path, elem):
    """A float8 graph output (tolerance path fp8_e4m3 / fp8_e5m2): the machine's value equals
    onnxruntime's Cast, and the next representable value in one element fails; zeros fail."""
    nodes = [
        helper.make_node("Cast", ["x"], ["n"], to=elem),
        helper.make_node("Transpose", ["n"], ["out"], perm=[1, 0]),
    ]
    path = str(tmp_path / "m.onnx")
    onnx.save(_model(nodes, [_x()], out_type=elem), path)
    feeds = {"x": (np.random.default_rng(0).standard_normal(SHAPE) * 10).astype(np.float32)}
    run = Run(path, feeds)
    out = run.outputs["out"]
    np.testing.assert_array_equal(out.astype(np.float32), run.reference["out"].astype(np.float32))
    assert run.passes(run.outputs)
    bits = out.view(np.uint8).copy()
    bits.reshape(-1)[5] += 1  # the next float8 value away from zero
    assert not run.passes({"out": bits.view(out.dtype)})
    assert not run.passes({"out": np.zeros_like(out)})
