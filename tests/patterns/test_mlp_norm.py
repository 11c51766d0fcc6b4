"""LowerToNKIKernelCC on gated MLPs with a normalisation inside (docs/mlp.md#inner-norm) and on
fused gate/up projections (docs/mlp.md#fused): each exported form is raised and runs against
onnxruntime through the real compile + run path; a kernel without the norm, or without its
scale, is rejected by the same comparison; forms that are not a LayerNorm or an RMSNorm over the
hidden features are listed with their reason; a residual stream's pre-norm is no MLP."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.api.validate import validate
from onnx2bir.compiler import compile_graph, compile_model
from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.mlp.raising import TARGET, LowerToNKIKernelCC
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

ROOT = Path(__file__).resolve().parents[2]
FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast
K, H, N, T = 24, 40, 16, 12
EPS = 1e-6


class Block:
    """A SwiGLU block in ONNX ops: the gate and up projections (two MatMuls, or one fused
    projection split in two), silu(gate)·up, a normalisation, the down projection."""

    def __init__(self, seed=0, k=K, h=H, n=N, t=T):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], [], 0
        self.k, self.h, self.n, self.t = k, h, n, t

    def const(self, value, dtype=np.float32):
        name = f"c{self.count}"
        self.count += 1
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, *shape):
        return self.const(self.rng.standard_normal(shape) / math.sqrt(shape[0]))

    def vector(self, size, low=None):
        if low is None:
            return self.const(self.rng.standard_normal(size))
        return self.const(self.rng.uniform(low, low + 1.0, size))

    def op(self, op_type, inputs, outputs=1, **attrs):
        names = [f"t{self.count + i}" for i in range(outputs)]
        self.count += outputs
        self.nodes.append(helper.make_node(op_type, inputs, names, name=names[0], **attrs))
        return names[0] if outputs == 1 else names

    def projections(self, fused):
        k, h = self.k, self.h
        if fused == "split":
            z = self.op(
                "Add", [self.op("MatMul", ["x", self.weight(k, 2 * h)]), self.vector(2 * h)]
            )
            return self.op("Split", [z], outputs=2, axis=-1, num_outputs=2)
        if fused == "slice":  # the gate last: x·W[:, H:] is the gate
            z = self.op("MatMul", ["x", self.weight(k, 2 * h)])
            ax = self.const([-1], np.int64)
            up = self.op("Slice", [z, self.const([0], np.int64), self.const([h], np.int64), ax])
            gate = self.op(
                "Slice", [z, self.const([h], np.int64), self.const([2 * h], np.int64), ax]
            )
            return gate, up
        if fused == "gemm":  # Gemm with transB: the weight stored [2H, K]
            x2 = self.op("Reshape", ["x", self.const([self.t, k], np.int64)])
            z = self.op("Gemm", [x2, self.weight(2 * h, k), self.vector(2 * h)], transB=1)
            return self.op("Split", [z, self.const([h, h], np.int64)], outputs=2, axis=1)
        gate = self.op("MatMul", ["x", self.weight(k, h)])
        up = self.op("Add", [self.op("MatMul", ["x", self.weight(k, h)]), self.vector(h)])
        return gate, up

    def swiglu(self, fused=""):
        gate, up = self.projections(fused)
        return self.op("Mul", [self.op("Mul", [gate, self.op("Sigmoid", [gate])]), up])

    def axes(self):
        return self.const([-1], np.int64)

    def norm(self, kind, h, affine=True):
        """`h` normalised over its last axis, in the form `kind`."""
        op, vec = self.op, self.vector
        scale = vec(self.h, low=0.5) if affine else ""
        shift = vec(self.h) if affine else ""
        if kind == "layer_op":  # without affine weights: the scale (required) only
            inputs = [h, scale, shift] if affine else [h, vec(self.h, low=0.5)]
            return op("LayerNormalization", inputs, axis=-1, epsilon=EPS, stash_type=1)
        if kind == "rms_div":  # x / sqrt(mean(x²) + ε) · γ
            ms = op("ReduceMean", [op("Pow", [h, self.const(2.0)]), self.axes()])
            normed = op("Div", [h, op("Sqrt", [op("Add", [ms, self.const(EPS)])])])
            return op("Mul", [normed, scale]) if affine else normed
        if kind == "rms_reciprocal":  # the torch exporter's: γ · (x · 1/sqrt(mean(x·x) + ε))
            ms = op("ReduceMean", [op("Mul", [h, h]), self.axes()])
            r = op("Reciprocal", [op("Sqrt", [op("Add", [self.const(EPS), ms])])])
            return op("Mul", [scale, op("Mul", [h, r])])
        if kind in ("layer_written", "layer_eps_after_sqrt"):
            d = op("Sub", [h, op("ReduceMean", [h, self.axes()])])
            var = op("ReduceMean", [op("Pow", [d, self.const(2.0)]), self.axes()])
            if kind == "layer_written":
                std = op("Sqrt", [op("Add", [var, self.const(EPS)])])
            else:  # (x − μ) / (σ + ε): not a LayerNorm
                std = op("Add", [op("Sqrt", [var]), self.const(1e-2)])
            normed = op("Div", [d, std])
            return op("Add", [op("Mul", [normed, scale]), shift]) if affine else normed
        raise ValueError(kind)

    def down(self, h):
        return self.op(
            "Add", [self.op("MatMul", [h, self.weight(self.h, self.n)]), self.vector(self.n)]
        )

    def model(self, out, extra_outputs=(), opset=20):
        graph = helper.make_graph(
            self.nodes,
            "mlp_norm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, self.t, self.k))],
            [
                helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                for o in (out, *extra_outputs)
            ],
            self.inits,
        )
        opsets = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=11 if opset > 21 else 10)
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def swiglu_norm(kind, fused="", affine=True, seed=0, **dims):
    b = Block(seed, **dims)
    return b.model(b.down(b.norm(kind, b.swiglu(fused), affine)))


def raised(model):
    graph = import_model(model)
    return graph, LowerToNKIKernelCC().run(graph, CompileOptions()).findings


def compare(model, graph=None, seed=1):
    """Compile (the passes, or none on a hand-edited `graph`), run on the machine, compare
    with onnxruntime at the fp32 tolerance."""
    if graph is None:
        compilation = compile_model(model, FP32)
    else:
        compilation = compile_graph(graph, FP32, passes=[])
    feeds = synthesize_inputs(compilation.graph, seed)
    (name,) = compilation.graph.outputs
    got = run_function(compilation.module, feeds)[name]
    return compare_output(name, got, run_onnxruntime(model, feeds)[name], FP32_ATOL, FP32_RTOL)


NORMS = {
    "layer_op": "layer_norm",
    "layer_written": "layer_norm",
    "rms_div": "rms_norm",
    "rms_reciprocal": "rms_norm",
}


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("fused", ["", "split"])
def test_swiglu_with_an_inner_norm_is_raised_and_runs(kind, fused):
    model = swiglu_norm(kind, fused)
    graph, (finding,) = raised(model)
    assert finding["activation"] == f"swiglu+{NORMS[kind]}" and finding["target"] == TARGET
    assert finding["norm"] == NORMS[kind] and finding["fused_projection"] == bool(fused)
    assert graph.op_counts() == {"CustomCall": 1}
    (node,) = [d for _, d in graph.nodes()]
    assert node["attrs"]["norm"] == NORMS[kind].removesuffix("_norm")
    assert node["attrs"]["norm_epsilon"] == pytest.approx(EPS)
    result = compare(model)
    assert result.passed, result.to_json()


@pytest.mark.parametrize("kind, vectors", [("layer_op", 1), ("layer_written", 0), ("rms_div", 0)])
def test_norms_without_affine_weights(kind, vectors):
    """The op without its bias (its scale is required); written-out forms without either."""
    model = swiglu_norm(kind, affine=False)
    graph, (finding,) = raised(model)
    assert finding["target"] == TARGET and finding["activation"] == f"swiglu+{NORMS[kind]}"
    (node,) = [d for _, d in graph.nodes()]
    assert len([t for t in node["inputs"][7:] if t]) == vectors
    result = compare(model)
    assert result.passed, result.to_json()


@pytest.mark.parametrize("fused", ["slice", "gemm"])
def test_fused_projection_forms(fused):
    """Two Slices with the gate second (the raise swaps them), and a Gemm with transB split
    by sizes: the kernel reads each part of the one weight and bias in place."""
    model = swiglu_norm("layer_op", fused)
    graph, (finding,) = raised(model)
    assert finding["target"] == TARGET and finding["fused_projection"]
    (node,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    assert node["inputs"][1] == node["inputs"][5]  # w1 and w_up: the one fused weight
    offsets = node["attrs"]["w1_offset"], node["attrs"]["w_up_offset"]
    assert offsets == ((H, 0) if fused == "slice" else (0, H))
    assert compare(model).passed


def test_fused_swiglu_without_a_norm():
    """timm's GluMlp (EVA-02 without scale_mlp): one fc1, chunked; no norm."""
    b = Block()
    model = b.model(b.down(b.swiglu("split")))
    graph, (finding,) = raised(model)
    assert finding["activation"] == "swiglu" and finding["norm"] is None
    assert graph.op_counts() == {"CustomCall": 1}
    assert compare(model).passed


def test_gelu_mlp_with_an_inner_norm():
    """timm's MlpHead: fc1, GELU, LayerNorm, fc2 (no gate)."""
    b = Block()
    z = b.op("Add", [b.op("MatMul", ["x", b.weight(K, H)]), b.vector(H)])
    model = b.model(b.down(b.norm("layer_op", b.op("Gelu", [z]))))
    graph, (finding,) = raised(model)
    assert finding["activation"] == "gelu+layer_norm" and finding["target"] == TARGET
    assert compare(model).passed


def test_reshape_between_the_norm_and_the_down_projection():
    """LN → Reshape to [tokens, H] → Gemm: the Reshape is part of the block."""
    b = Block()
    normed = b.op("Reshape", [b.norm("layer_op", b.swiglu()), b.const([T, H], np.int64)])
    model = b.model(b.op("Gemm", [normed, b.weight(H, N), b.vector(N)]))
    graph, (finding,) = raised(model)
    assert finding["activation"] == "swiglu+layer_norm" and finding["target"] == TARGET
    assert graph.op_counts() == {"CustomCall": 1}
    assert compare(model).passed


def test_many_hidden_and_token_tiles():
    """H = 300 (two whole hidden tiles and a partial one: the row sums accumulate over three
    matmuls), T = 200 (two token tiles), K = 150."""
    model = swiglu_norm("layer_written", "split", k=150, h=300, n=70, t=200)
    _, (finding,) = raised(model)
    assert finding["target"] == TARGET
    result = compare(model)
    assert result.passed, result.to_json()


def test_rms_normalization_op():
    """Opset 23's RMSNormalization (what the exporter can write from opset 23 on)."""
    b = Block()
    h = b.op("RMSNormalization", [b.swiglu("split"), b.vector(H, low=0.5)], epsilon=EPS)
    model = b.model(b.down(h), opset=23)
    graph, (finding,) = raised(model)
    assert finding["activation"] == "swiglu+rms_norm" and finding["target"] == TARGET
    assert graph.op_counts() == {"CustomCall": 1}
    assert compare(model).passed


@pytest.mark.parametrize("kind", ["layer_op", "rms_reciprocal"])
def test_under_the_default_autocast(kind):
    """`validate` with the default options (matmuls in bf16): the kernel rounds the normalised
    value once, where the oracle rounds the down projection's input. The block feeds a residual
    Add, as in a transformer, so its output is a probe whose check allows the flips of that
    rounding (docs/validation.md#kernel-boundaries)."""
    b = Block(k=150, h=300, n=150, t=200)
    y = b.op("Add", [b.down(b.norm(kind, b.swiglu("split"))), "x"])
    result = validate(b.model(y))
    assert result.passed
    (block,) = [c for c in result.to_json()["checkpoints"] if c["op_type"] == "Add"]
    assert block["passed"] and block["flip_allowance_max"] > 0


# --- a wrong kernel fails the comparison -----------------------------------------------------
def _edited(model, edit):
    graph, (finding,) = raised(model)
    assert finding["target"] == TARGET
    (name,) = [n for n, _ in graph.nodes()]
    data = graph.node(name)
    inputs, attrs = list(data["inputs"]), dict(data["attrs"])
    edit(inputs, attrs)
    graph.remove_node(name)
    graph.add_node(name, "CustomCall", inputs, data["outputs"], attrs, domain="onnx2bir")
    return graph


def _skip_norm(inputs, attrs):
    del inputs[7:]
    del attrs["norm"], attrs["norm_epsilon"]


def _drop_scale(inputs, attrs):
    inputs[7] = ""


def _drop_shift(inputs, attrs):
    inputs[8] = ""


def _rms_for_layer(inputs, attrs):
    attrs["norm"] = "rms"


@pytest.mark.parametrize(
    "edit", [_skip_norm, _drop_scale, _drop_shift, _rms_for_layer], ids=lambda f: f.__name__
)
def test_a_wrong_kernel_is_rejected(edit):
    """The raised program passes with a wide margin; the same kernel with the norm skipped,
    its scale or its shift dropped, or an RMSNorm for the LayerNorm, fails the same bound."""
    model = swiglu_norm("layer_op")
    right = compare(model, _edited(model, lambda inputs, attrs: None))
    assert right.passed and right.max_abs_err < FP32_ATOL / 10, right.to_json()
    wrong = compare(model, _edited(model, edit))
    assert not wrong.passed, wrong.to_json()
    assert wrong.max_abs_err > 10 * FP32_ATOL


# --- refusals: found and listed with the reason -----------------------------------------------
def test_epsilon_after_the_square_root_is_refused_by_value():
    model = swiglu_norm("layer_eps_after_sqrt")
    graph, (finding,) = raised(model)
    assert finding["target"] is None and finding["status"] == "refused"
    assert "not a LayerNorm or an RMSNorm" in finding["reason"]
    assert graph.op_counts()["ReduceMean"] == 2
    assert compare(model).passed  # left to the generic lowerings, still right


def test_layer_norm_over_tokens_and_features_is_refused():
    b = Block()
    scale = b.const(b.rng.uniform(0.5, 1.5, (T, H)))  # the normalised dims [T, H]
    model = b.model(b.down(b.op("LayerNormalization", [b.swiglu(), scale], axis=1)))
    _, (finding,) = raised(model)
    assert finding["target"] is None
    assert "LayerNormalization" in finding["reason"] and "axis 1" in finding["reason"]


def test_norm_before_the_activation_is_refused():
    b = Block()
    z = b.op("MatMul", ["x", b.weight(K, H)])
    a = b.op("Relu", [b.op("LayerNormalization", [z, b.vector(H, low=0.5)], epsilon=EPS)])
    model = b.model(b.down(a))
    _, (finding,) = raised(model)
    assert finding["target"] is None
    assert (
        "inside the activation" in finding["reason"] and "LayerNormalization" in finding["reason"]
    )


def test_normalised_value_used_elsewhere_is_refused():
    b = Block()
    h = b.swiglu()
    model = b.model(b.down(b.norm("layer_op", h)), extra_outputs=[h])
    _, (finding,) = raised(model)
    assert finding["target"] is None and "graph output" in finding["reason"]


def test_residual_pre_norm_is_not_an_mlp():
    """LN(x + proj(x)) before a dot: a residual stream, not an MLP's activation; no finding."""
    b = Block()
    x2 = b.op("Relu", ["x"])  # not a graph input: the walk goes on to the projection
    res = b.op("Add", [x2, b.op("MatMul", [x2, b.weight(K, K)])])
    normed = b.op("LayerNormalization", [res, b.vector(K, low=0.5)], epsilon=EPS)
    model = b.model(b.op("MatMul", [normed, b.weight(K, N)]))
    _, findings = raised(model)
    assert findings == []


# --- EVA-02 as timm and torch 2.14 export it ---------------------------------------------------
IDIOM_EVA02 = ROOT / "models" / "idioms" / "eva02.onnx"


def test_eva02_scale_mlp_export_raises_both_blocks_and_validates():
    """models/idioms' EVA-02 (scale_mlp: timm's SwiGLU with norm_layer=LayerNorm, hidden 170, so
    a partial hidden tile): fc1_g and fc1_x, silu(gate)·x, LayerNormalization, fc2 — both
    blocks raised with the norm, and the model validates with the default options."""
    graph = import_model(str(IDIOM_EVA02))
    findings = LowerToNKIKernelCC().run(graph, CompileOptions()).findings
    assert [(f["activation"], f["target"]) for f in findings] == [("swiglu+layer_norm", TARGET)] * 2
    result = validate(str(IDIOM_EVA02))
    assert result.passed, result.text()


# --- the sweep's EVA-02 ------------------------------------------------------------------------
EVA02 = ROOT / "models" / ".cache" / "sweep" / "timm_eva02_tiny_patch14_224.onnx"


@pytest.mark.skipif(not EVA02.is_file(), reason="the sweep's export is not cached here")
def test_eva02_tiny_finds_its_12_mlp_blocks():
    """timm's eva02_tiny: each block's GluMlp is one fc1 split in two (Split), silu(gate)·up,
    fc2; all 12 are raised."""
    graph = import_model(str(EVA02))
    findings = LowerToNKIKernelCC().run(graph, CompileOptions()).findings
    assert len(findings) == 12
    assert all(f["activation"] == "swiglu" and f["target"] == TARGET for f in findings)
    assert all(f["fused_projection"] for f in findings)
