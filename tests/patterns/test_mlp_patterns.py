"""LowerToNKIKernelCC: each exported activation form matches (and runs right after the raise);
each broken form is refused with its reason."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.compiler import compile_model
from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.mlp.raising import TARGET, LowerToNKIKernelCC
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast

K, H, N, T = 24, 40, 16, 12


class Mlp:
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0

    def const(self, value):
        name = f"c{self.count}"
        self.count += 1
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def weight(self, *shape):
        return self.const(self.rng.standard_normal(shape) / math.sqrt(shape[0]))

    def op(self, op_type, inputs, **attrs):
        out = f"t{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def model(self, out, x_shape=(1, T, K), extra_outputs=()):
        graph = helper.make_graph(
            self.nodes,
            "mlp",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
            [
                helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                for o in (out, *extra_outputs)
            ],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
        return onnx.shape_inference.infer_shapes(model)


def activation(m: Mlp, kind: str, h: str) -> str:
    op = m.op
    if kind == "relu":
        return op("Relu", [h])
    if kind in ("gelu_none", "gelu_tanh_op"):
        return op("Gelu", [h], approximate="none" if kind == "gelu_none" else "tanh")
    if kind == "erf_a":  # x·(1+erf(x/√2))·½
        e = op("Add", [op("Erf", [op("Div", [h, m.const(math.sqrt(2))])]), m.const(1.0)])
        return op("Mul", [op("Mul", [h, e]), m.const(0.5)])
    if kind == "erf_b":  # (1+erf)·½·x with ·1/√2
        e = op("Add", [op("Erf", [op("Mul", [h, m.const(1 / math.sqrt(2))])]), m.const(1.0)])
        return op("Mul", [op("Mul", [e, m.const(0.5)]), h])
    if kind == "erf_c":  # (½x)·(1+erf)
        e = op("Add", [m.const(1.0), op("Erf", [op("Div", [h, m.const(math.sqrt(2))])])])
        return op("Mul", [op("Mul", [m.const(0.5), h]), e])
    if kind in ("gelu_new_pow", "gelu_new_mul", "tanh_b"):
        cube = (
            op("Pow", [h, m.const(3.0)])
            if kind != "gelu_new_mul"
            else op("Mul", [op("Mul", [h, h]), h])
        )
        inner = op("Add", [h, op("Mul", [m.const(0.044715), cube])])
        t = op("Tanh", [op("Mul", [inner, m.const(math.sqrt(2 / math.pi))])])
        one = op("Add", [t, m.const(1.0)])
        if kind == "tanh_b":
            return op("Mul", [op("Mul", [h, one]), m.const(0.5)])
        return op("Mul", [op("Mul", [m.const(0.5), h]), one])
    if kind == "silu":
        return op("Mul", [h, op("Sigmoid", [h])])
    if kind == "quick_gelu":
        return op("Mul", [h, op("Sigmoid", [op("Mul", [h, m.const(1.702)])])])
    raise ValueError(kind)


def mlp_model(kind: str, bias=True, gemm=False, seed=0):
    m = Mlp(seed)
    if gemm:  # GPT-2 form: Reshape(2-D) → Gemm → Reshape → act → Reshape → Gemm
        x2 = m.op("Reshape", ["x", m.const(np.array([T, K]))])
        h = m.op("Gemm", [x2, m.weight(H, K), m.const(m.rng.standard_normal(H))], transB=1)
        h = m.op("Reshape", [h, m.const(np.array([1, T, H]))])
        a = m.op("Reshape", [activation(m, kind, h), m.const(np.array([T, H]))])
        y = m.op("Gemm", [a, m.weight(H, N), m.const(m.rng.standard_normal(N))])
        return m.model(y)
    h = m.op("MatMul", ["x", m.weight(K, H)])
    if bias:
        h = m.op("Add", [h, m.const(m.rng.standard_normal(H))])
    y = m.op("MatMul", [activation(m, kind, h), m.weight(H, N)])
    if bias:
        y = m.op("Add", [y, m.const(m.rng.standard_normal(N))])
    return m.model(y)


def fix_int_consts(model):
    for init in model.graph.initializer:  # Reshape targets must be int64
        if len(init.dims) == 1 and init.dims[0] in (2, 3) and init.data_type == 1:
            value = numpy_helper.to_array(init).astype(np.int64)
            init.CopyFrom(numpy_helper.from_array(value, init.name))
    return model


def raised(model):
    graph = import_model(model)
    findings = LowerToNKIKernelCC().run(graph, CompileOptions()).findings
    return graph, findings


EXPECTED = {
    "relu": "relu",
    "gelu_none": "gelu",
    "gelu_tanh_op": "gelu_tanh",
    "erf_a": "gelu",
    "erf_b": "gelu",
    "erf_c": "gelu",
    "gelu_new_pow": "gelu_tanh",
    "gelu_new_mul": "gelu_tanh",
    "tanh_b": "gelu_tanh",
    "silu": "silu",
    "quick_gelu": "quick_gelu",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
@pytest.mark.parametrize("bias", [True, False])
def test_activation_forms_match_and_run(kind, bias):
    model = mlp_model(kind, bias)
    graph, findings = raised(model)
    (block,) = [f for f in findings if f["target"]]
    assert block["activation"] == EXPECTED[kind] and block["target"] == TARGET
    assert list(graph.op_counts()) == ["CustomCall"]
    compilation = compile_model(model, FP32)
    feeds = synthesize_inputs(compilation.graph, 1)
    (name,) = compilation.graph.outputs
    result = compare_output(
        name, run_function(compilation.module, feeds)[name], run_onnxruntime(model, feeds)[name]
    )
    assert result.passed, result.to_json()


def test_the_kernel_takes_the_place_of_the_blocks_first_node():
    # x -> MatMul -> Relu -> MatMul (the block) and Neg(x), a node the block does not read,
    # written after the block's first MatMul: the kernel keeps that MatMul's place, before
    # the Neg, as the rewrite found them (added plainly, it would run after the Neg).
    m = Mlp()
    h = m.op("MatMul", ["x", m.weight(K, H)])
    other = m.op("Neg", ["x"])
    y = m.op("MatMul", [m.op("Relu", [h]), m.weight(H, N)])
    graph, _ = raised(m.model(y, extra_outputs=(other,)))
    assert [graph.node(n)["op_type"] for n in graph.topological_order()] == ["CustomCall", "Neg"]


def test_gpt2_gemm_reshape_form():
    model = fix_int_consts(mlp_model("gelu_new_pow", gemm=True))
    graph, findings = raised(model)
    (block,) = [f for f in findings if f["target"]]
    assert block["activation"] == "gelu_tanh" and block["pattern"] == "mlp.dot2_rooted"
    # The Reshape in front of the first Gemm feeds the block; it is not absorbed.
    assert graph.op_counts() == {"Reshape": 1, "CustomCall": 1}


def test_swiglu():
    m = Mlp()
    gate = m.op("MatMul", ["x", m.weight(K, H)])
    up = m.op("MatMul", ["x", m.weight(K, H)])
    act = m.op("Mul", [m.op("Mul", [gate, m.op("Sigmoid", [gate])]), up])
    model = m.model(m.op("MatMul", [act, m.weight(H, N)]))
    graph, findings = raised(model)
    (block,) = [f for f in findings if f["target"]]
    assert block["activation"] == "swiglu" and list(graph.op_counts()) == ["CustomCall"]


# --- no-match ------------------------------------------------------------------------------------
def validates(model, seed=1):
    compilation = compile_model(model, FP32)
    feeds = synthesize_inputs(compilation.graph, seed)
    (name,) = compilation.graph.outputs
    result = compare_output(
        name, run_function(compilation.module, feeds)[name], run_onnxruntime(model, feeds)[name]
    )
    assert result.passed, result.to_json()
    return compilation


def test_erf_over_2_is_a_generic_elementwise_chain():
    """x·(1+erf(x/2))·½ is not GELU: raised as the program it is, and it runs."""
    m = Mlp()
    h = m.op("MatMul", ["x", m.weight(K, H)])
    e = m.op("Add", [m.op("Erf", [m.op("Div", [h, m.const(2.0)])]), m.const(1.0)])
    y = m.op("MatMul", [m.op("Mul", [m.op("Mul", [h, e]), m.const(0.5)]), m.weight(H, N)])
    model = m.model(y)
    graph, (finding,) = raised(model)
    assert finding["activation"] == "elementwise:divide+erf+add+multiply+multiply"
    assert graph.op_counts() == {"CustomCall": 1}
    validates(model)


def test_wrong_tanh_coefficient_is_not_gelu_tanh():
    m = Mlp()
    h = m.op("MatMul", ["x", m.weight(K, H)])
    inner = m.op("Add", [h, m.op("Mul", [m.const(0.05), m.op("Pow", [h, m.const(3.0)])])])
    t = m.op("Tanh", [m.op("Mul", [inner, m.const(math.sqrt(2 / math.pi))])])
    a = m.op("Mul", [m.op("Mul", [m.const(0.5), h]), m.op("Add", [t, m.const(1.0)])])
    model = m.model(m.op("MatMul", [a, m.weight(H, N)]))
    _, (finding,) = raised(model)
    assert finding["activation"].startswith("elementwise:") and "pow" in finding["activation"]
    validates(model)


def test_runtime_weights_are_raised():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("MatMul", ["a", "w2"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, K]),
                helper.make_tensor_value_info("w", TensorProto.FLOAT, [K, H]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, N])],
            [numpy_helper.from_array(np.ones((H, N), np.float32), "w2")],
        ),
        opset_imports=[helper.make_opsetid("", 20)],
        ir_version=10,
    )
    _, (finding,) = raised(model)
    assert finding["activation"] == "relu" and not finding["constant_weights"]
    validates(model)


@pytest.mark.parametrize(
    "kind, name",
    [
        ("hardswish", "hardswish"),
        ("mish", "mish"),
        ("leaky", "elementwise:multiply+max"),
        ("clip_sigmoid", "elementwise:sigmoid+max+min"),
    ],
)
def test_other_elementwise_chains_are_raised_and_run(kind, name):
    m = Mlp()
    h = m.op("Add", [m.op("MatMul", ["x", m.weight(K, H)]), m.const(m.rng.standard_normal(H))])
    if kind == "hardswish":
        a = m.op("HardSwish", [h])
    elif kind == "mish":
        a = m.op("Mish", [h])
    elif kind == "leaky":
        a = m.op("LeakyRelu", [h], alpha=0.1)
    else:
        a = m.op("Clip", [m.op("Sigmoid", [h]), m.const(0.2), m.const(0.7)])
    model = m.model(m.op("MatMul", [a, m.weight(H, N)]))
    _, (finding,) = raised(model)
    assert finding["activation"] == name
    validates(model)


GATES = {
    "swiglu": lambda m, g: m.op("Mul", [g, m.op("Sigmoid", [g])]),
    "geglu": lambda m, g: m.op("Gelu", [g]),
    "reglu": lambda m, g: m.op("Relu", [g]),
}


@pytest.mark.parametrize("form", sorted(GATES))
@pytest.mark.parametrize("biases", ["", "g", "u", "o", "gu", "go", "uo", "guo"])
def test_gated_forms_with_a_bias_on_any_subset(form, biases):
    m = Mlp()
    gate = m.op("MatMul", ["x", m.weight(K, H)])
    up = m.op("MatMul", ["x", m.weight(K, H)])
    if "g" in biases:
        gate = m.op("Add", [gate, m.const(m.rng.standard_normal(H))])
    if "u" in biases:
        up = m.op("Add", [m.const(m.rng.standard_normal(H)), up])
    act = m.op("Mul", [up, GATES[form](m, gate)])  # up first: the matcher finds the gate
    y = m.op("MatMul", [act, m.weight(H, N)])
    if "o" in biases:
        y = m.op("Add", [y, m.const(m.rng.standard_normal(N))])
    model = m.model(y)
    graph, (finding,) = raised(model)
    assert finding["activation"] == form and finding["gated"]
    assert finding["biases"] == [
        b for b, k in (("w1", "g"), ("up", "u"), ("w2", "o")) if k in biases
    ]
    assert graph.op_counts() == {"CustomCall": 1}
    validates(model)


def test_non_scalar_constant_in_the_chain_is_refused():
    m = Mlp()
    h = m.op("MatMul", ["x", m.weight(K, H)])
    a = m.op("Relu", [m.op("Mul", [h, m.const(m.rng.standard_normal((T, H)))])])
    _, (finding,) = raised(m.model(m.op("MatMul", [a, m.weight(H, N)])))
    assert finding["target"] is None and "non-scalar constant" in finding["reason"]


def test_op_without_a_kernel_step_is_refused_by_name():
    m = Mlp()
    h = m.op("MatMul", ["x", m.weight(K, H)])
    a = m.op("Floor", [h])
    _, (finding,) = raised(m.model(m.op("MatMul", [a, m.weight(H, N)])))
    assert finding["target"] is None and "Floor" in finding["reason"]
    assert "no MLP kernel step" in finding["reason"]


def test_three_projections_are_refused():
    m = Mlp()
    p = [m.op("MatMul", ["x", m.weight(K, H)]) for _ in range(3)]
    a = m.op("Mul", [m.op("Mul", [p[0], m.op("Sigmoid", [p[1]])]), p[2]])
    _, (finding,) = raised(m.model(m.op("MatMul", [a, m.weight(H, N)])))
    assert "3 projections" in finding["reason"]


def test_hidden_value_used_elsewhere_is_refused():
    m = Mlp()
    h = m.op("MatMul", ["x", m.weight(K, H)])
    a = m.op("Relu", [h])
    y = m.op("MatMul", [a, m.weight(H, N)])
    graph, (finding,) = raised(m.model(y, extra_outputs=[a]))
    assert finding["target"] is None and "graph output" in finding["reason"]
    assert graph.op_counts()["Relu"] == 1


def test_swiglu_with_different_inputs_is_refused():
    m = Mlp()
    other = m.op("Relu", ["x"])
    gate = m.op("MatMul", ["x", m.weight(K, H)])
    up = m.op("MatMul", [other, m.weight(K, H)])
    act = m.op("Mul", [m.op("Mul", [gate, m.op("Sigmoid", [gate])]), up])
    _, findings = raised(m.model(m.op("MatMul", [act, m.weight(H, N)])))
    assert any("different inputs" in (f["reason"] or "") for f in findings)
