"""The native attention kernel (onnx2bir.kernels.attention.kernel) against onnxruntime.

Each case builds the attention math as an ONNX model (MatMul → scale / masks → Softmax
[→ Where(IsNaN)] → MatMul), imports it, replaces the math nodes by one CustomCall node by hand
(what the attention raise does), compiles with no passes, runs the BIR on the machine model
and compares with onnxruntime running the math model on the same inputs.

Tolerances. fp32 storage: 1e-4 absolute, 1e-3 relative, the generic path's. Half storage
rounds q, kt, v and P to p significand bits: relative error up to u = 2^-p (bf16 p = 8,
u = 2^-8; fp16 p = 11, u = 2^-11). A score sums D products each off by about u relative, a
random walk, so its error is about sqrt(D)·u·|q_i·k_i| ≈ sqrt(D)·u for unit-normal inputs,
times the score scale s. A logit error δ moves each P by about δ relative, and O = P·v / Σ P
is a weighted mean of v, so O moves by about (δ + u)·max|v|. The test allows exactly that,
atol = (1 + sqrt(D)·s)·u·max|v| (0.036 for bf16, D = 64, s = 1/8, max|v| ≈ 4.6), and
rtol = 2u (one bf16 spacing); it also asks for a cosine similarity above 0.999. Measured
worst errors sit 2-10x below the bound (the softmax averages the logit errors): bf16 0.003
at s = 1/sqrt(D), 0.1 for the unscaled D = 128 case whose bound is 0.24.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from conftest import is_copy
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import Dtype, MemoryType, Opcode
from onnx2bir.bir.ir import Loop
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen.driver import CodegenError
from onnx2bir.compiler import compile_graph
from onnx2bir.frontend.importer import import_model
from onnx2bir.graph import Graph, TensorInfo
from onnx2bir.kernels.attention import TARGETS
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

IR_VERSION = 10  # onnxruntime reads IR 10 (opsets up to 21)
FP32_TOL = (1e-4, 1e-3)
UNIT_ROUNDOFF = {Dtype.BF16: 2.0**-8, Dtype.FP16: 2.0**-11}
NEG_INF = -math.inf


# --- model building --------------------------------------------------------------------------


class Attention:
    """The math model of one attention block and the CustomCall node that replaces it."""

    def __init__(self, q_shape, kt_shape, v_shape, *, k_input: bool = False) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inputs = {"q": q_shape, "v": v_shape}
        self.inits: dict[str, np.ndarray] = {}
        self.steps: list[dict] = []
        self.extras: list[str] = []
        self.keep: set[str] = set()
        if k_input:  # kt comes from a Transpose the kernel node keeps consuming
            k_shape = (*kt_shape[:-2], kt_shape[-1], kt_shape[-2])
            self.inputs["k"] = k_shape
            perm = [*range(len(k_shape) - 2), len(k_shape) - 1, len(k_shape) - 2]
            self.nodes.append(
                helper.make_node("Transpose", ["k"], ["kt"], "transpose_k", perm=perm)
            )
            self.keep.add("transpose_k")
        else:
            self.inputs["kt"] = kt_shape
        self.fixed: dict[str, np.ndarray] = {}  # runtime inputs with chosen values
        self.nodes.append(helper.make_node("MatMul", ["q", "kt"], ["s0"]))
        self.score = "s0"

    def _next(self) -> str:
        return f"s{len(self.nodes)}"

    def _extra(self, name: str, value: np.ndarray | None, shape) -> int:
        if value is not None:
            self.inits[name] = value
        else:
            self.inputs[name] = shape
        self.extras.append(name)
        return len(self.extras) - 1

    def scale(self, value: float, divide: bool = False) -> Attention:
        name = f"c{len(self.nodes)}"
        self.inits[name] = np.array(value, np.float32)
        out = self._next()
        self.nodes.append(helper.make_node("Div" if divide else "Mul", [self.score, name], [out]))
        self.score = out
        self.steps.append({"op": "divide" if divide else "scale", "value": value})
        return self

    def add(self, name: str, shape, value: np.ndarray | None = None) -> Attention:
        index = self._extra(name, value, shape)
        out = self._next()
        self.nodes.append(helper.make_node("Add", [self.score, name], [out]))
        self.score = out
        self.steps.append({"op": "add", "input": index})
        return self

    def masked_fill(
        self, cond: np.ndarray, value: float, fill_on_true: bool = True, as_float: bool = False
    ) -> Attention:
        """Where(cond, value, S) (or Where(cond, S, value)); a float cond is Cast to bool."""
        name = f"cond{len(self.extras)}"
        if as_float:  # a runtime input: a constant float cond would be folded into a bool one
            index = self._extra(name, None, cond.shape)
            self.fixed[name] = cond.astype(np.float32)
            self.nodes.append(helper.make_node("Cast", [name], [f"{name}_b"], to=TensorProto.BOOL))
            name = f"{name}_b"
        else:
            index = self._extra(name, cond, None)
        fill = f"fill{len(self.nodes)}"
        self.inits[fill] = np.array(value, np.float32)
        out = self._next()
        branches = [fill, self.score] if fill_on_true else [self.score, fill]
        self.nodes.append(helper.make_node("Where", [name, *branches], [out]))
        self.score = out
        self.steps.append(
            {"op": "masked_fill", "input": index, "value": value, "fill_on_true": fill_on_true}
        )
        return self

    def causal(self, sq: int, sk: int) -> Attention:
        """The reference spells it as a Trilu-style constant cond; the kernel as a step."""
        cond = np.triu(np.ones((sq, sk), np.bool_), k=sk - sq + 1)
        self.inits[f"causal{len(self.nodes)}"] = cond
        out = self._next()
        fill = f"fill{len(self.nodes)}"
        self.inits[fill] = np.array(NEG_INF, np.float32)
        self.nodes.append(
            helper.make_node("Where", [f"causal{len(self.nodes)}", fill, self.score], [out])
        )
        self.score = out
        self.steps.append({"op": "causal"})
        return self

    def model(self, guard: bool = False) -> tuple[onnx.ModelProto, list[dict]]:
        nodes = [*self.nodes, helper.make_node("Softmax", [self.score], ["p"], axis=-1)]
        probs, post = "p", []
        if guard:
            self.inits["zero"] = np.array(0.0, np.float32)
            nodes += [
                helper.make_node("IsNaN", ["p"], ["p_nan"]),
                helper.make_node("Where", ["p_nan", "zero", "p"], ["p_safe"]),
            ]
            probs, post = "p_safe", [{"op": "nan_to_zero"}]
        nodes.append(helper.make_node("MatMul", [probs, "v"], ["o"]))
        graph = helper.make_graph(
            nodes,
            "attention",
            [
                helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                for n, s in self.inputs.items()
            ],
            [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(np.asarray(v), n) for n, v in self.inits.items()],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
        )
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
        return model, post

    def fused(
        self, guard: bool = False, storage: str = "float32", target: str = TARGETS[1]
    ) -> tuple[onnx.ModelProto, Graph]:
        """The math model and its graph with the math nodes replaced by the CustomCall."""
        model, post = self.model(guard)
        graph = import_model(model)
        for name, _ in list(graph.nodes()):
            if name not in self.keep:
                graph.remove_node(name)
        attrs = {
            "custom_call_target": target,
            "backend_config": json.dumps({"kernel_name": target}),
            "api_version": 1,
            "steps": json.dumps(self.steps),
            "post_steps": json.dumps(post),
            "storage_dtype": storage,
        }
        graph.add_node(
            "attention",
            "CustomCall",
            ["q", "kt", "v", *self.extras],
            ["o"],
            attrs,
            domain="onnx2bir",
        )
        return model, graph


def run(
    model: onnx.ModelProto,
    graph: Graph,
    tol=FP32_TOL,
    seed: int = 0,
    machine_dtypes: dict[str, Dtype] | None = None,
    fixed: dict | None = None,
):
    """Compile, verify, run on the machine and compare; returns (module, got, expected).

    `machine_dtypes` retypes graph inputs (the Casts a raise inserts before the kernel): the
    machine gets the inputs rounded to that dtype, onnxruntime the fp32 originals."""
    feeds = {**synthesize_inputs(graph, seed), **(fixed or {})}
    machine_feeds = dict(feeds)
    for name, dtype in (machine_dtypes or {}).items():
        info = graph.tensors[name]
        graph.tensors[name] = TensorInfo(name, info.shape, dtype, info.const)
        if name in feeds:
            machine_feeds[name] = feeds[name].astype(dtype.numpy)
    compiled = compile_graph(graph, CompileOptions(), passes=[])
    problems = verify_module(compiled.module)
    assert not problems, "\n".join(problems[:10])
    got = run_function(compiled.module, machine_feeds)["o"]
    expected = run_onnxruntime(model, feeds)["o"]
    if callable(tol):
        tol = tol(feeds)
    result = compare_output("o", got, expected, *tol)
    assert result.passed, result.to_json()
    if tol != FP32_TOL:
        assert result.cosine > 0.999, result.to_json()
    return compiled.module, got, expected


def half_tol(dtype: Dtype, d: int, scale: float):
    """(atol, rtol) = ((1 + sqrt(D)·scale)·u·max|v|, 2u): see the module docstring."""
    u = UNIT_ROUNDOFF[dtype]
    return lambda feeds: ((1 + math.sqrt(d) * scale) * u * np.abs(feeds["v"]).max(), 2 * u)


def kernel_matmuls(module):
    return [
        i
        for i in module.functions[0].instructions()
        if i.opcode is Opcode.MATMULT and i.origin.rule.startswith("kernel.")
    ]


def padding_mask(batch: int, sk: int, lengths) -> np.ndarray:
    """[B, 1, 1, Sk] additive mask: 0 for the first lengths[b] keys, −inf after."""
    mask = np.zeros((batch, 1, 1, sk), np.float32)
    for b, length in enumerate(lengths):
        mask[b, ..., length:] = NEG_INF
    return mask


# --- fp32 storage ------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_small_scaled_every_target(target):
    att = Attention((1, 2, 16, 8), (1, 2, 8, 16), (1, 2, 16, 8)).scale(1 / math.sqrt(8))
    run(*att.fused(target=target))


@pytest.mark.parametrize("d", [8, 64, 128])
def test_130_keys_head_dims(d):
    """Sq = Sk = 130: a full and a 2-row query tile, a 512-key chunk, 2 key tiles."""
    att = Attention((1, 2, 130, d), (1, 2, d, 130), (1, 2, 130, d)).scale(
        1 / math.sqrt(d), divide=False
    )
    run(*att.fused())


def test_long_sequence_1024():
    """Sq = Sk = 1024: 8 query tiles in a BIR loop, 2 key chunks, 8 key tiles."""
    att = Attention((1, 1, 1024, 64), (1, 1, 64, 1024), (1, 1, 1024, 64)).scale(8.0, divide=True)
    run(*att.fused())


def test_padding_mask_b11s():
    """An additive [B, 1, 1, Sk] mask with −inf padding; batch 1 has every key masked, so its
    rows are NaN in onnxruntime and must be NaN here — without poisoning batch 0."""
    mask = padding_mask(2, 130, [100, 0])
    att = Attention((2, 2, 130, 64), (2, 2, 64, 130), (2, 2, 130, 64)).scale(0.125)
    att.add("mask", None, mask)
    _, got, _ = run(*att.fused())
    assert np.isnan(got[1]).all() and np.isfinite(got[0]).all()


def test_padding_mask_with_guard():
    mask = padding_mask(2, 130, [100, 0])
    att = Attention((2, 2, 130, 64), (2, 2, 64, 130), (2, 2, 130, 64)).scale(0.125)
    att.add("mask", None, mask)
    _, got, _ = run(*att.fused(guard=True))
    assert (got[1] == 0).all()


def test_additive_mask_11qs_input():
    att = Attention((2, 2, 130, 64), (2, 2, 64, 130), (2, 2, 130, 64)).scale(8.0, divide=True)
    att.add("bias", (1, 1, 130, 130))
    run(*att.fused())


def test_two_additive_inputs_and_a_late_scale():
    mask = padding_mask(2, 16, [16, 9])
    att = Attention((2, 3, 16, 8), (2, 3, 8, 16), (2, 3, 16, 8)).scale(0.5)
    att.add("bias", (1, 3, 16, 16)).add("mask", None, mask).scale(0.7)
    run(*att.fused())


@pytest.mark.parametrize("guard", [False, True])
def test_masked_fill_causal_trilu_with_fully_masked_row(guard):
    """Where(triu(1) | row 5, −inf, S): row 5 is fully masked (NaN, or 0 with the guard)."""
    sq = sk = 130
    cond = np.triu(np.ones((1, 1, sq, sk), np.bool_), k=1)
    cond[..., 5, :] = True
    att = Attention((1, 2, sq, 64), (1, 2, 64, sk), (1, 2, sk, 32)).scale(0.125)
    att.masked_fill(cond, NEG_INF)
    _, got, _ = run(*att.fused(guard=guard))
    row5 = got[:, :, 5]
    assert (row5 == 0).all() if guard else np.isnan(row5).all()
    assert np.isfinite(np.delete(got, 5, axis=2)).all()


def test_masked_fill_float_cond_keep_where_true_finite_value():
    """Where(cond, S, −1e4) with a float condition (true where nonzero)."""
    rng = np.random.default_rng(3)
    cond = (rng.random((2, 1, 16, 16)) < 0.6) * rng.uniform(0.5, 2.0, (2, 1, 16, 16))
    att = Attention((2, 2, 16, 8), (2, 2, 8, 16), (2, 2, 16, 8)).scale(0.35)
    att.masked_fill(cond, -1e4, fill_on_true=False, as_float=True)
    run(*att.fused(), fixed=att.fixed)


@pytest.mark.parametrize("sq, sk", [(130, 130), (16, 130), (130, 16), (600, 1030)])
def test_causal_step(sq, sk):
    """S[i, j] = −inf for j > i + Sk − Sq; Sq > Sk leaves the first rows fully masked."""
    att = Attention((1, 1, sq, 16), (1, 1, 16, sk), (1, 1, sk, 16)).scale(0.25).causal(sq, sk)
    guard = sq > sk
    run(*att.fused(guard=guard, target=TARGETS[2]))


def test_gqa_broadcast_kv_and_transposed_k():
    """kt, v with 1 where q has H heads; kt comes from a Transpose node of k [B, 1, Sk, D]."""
    att = Attention((2, 4, 130, 64), (2, 1, 64, 130), (2, 1, 130, 64), k_input=True)
    att.scale(0.125).add("mask", None, padding_mask(2, 130, [130, 70]))
    module, _, _ = run(*att.fused())

    # Loads are DMAs, or on-chip copies where the memory planner keeps a tensor in SBUF.
    copies = [i for i in module.functions[0].instructions() if is_copy(i)]
    kv_loads = [i for i in copies if i.srcs["in"].loc in ("kt", "v")]
    q_loads = [i for i in copies if i.srcs["in"].loc == "q"]
    # Every head reads the one K/V head: the loads' addresses do not move with the head axis,
    # the loop of 4 trips that moves q's.
    trips = {}

    def walk(block):
        for item in block.items:
            if isinstance(item, Loop):
                trips[item.axis] = item.trip_count
                walk(item.body)

    walk(module.functions[0].entry)
    head_axes = {a for i in q_loads for a, _ in i.srcs["in"].offset_terms if trips.get(a) == 4}
    assert len(head_axes) == 1
    (head_axis,) = head_axes
    assert kv_loads and q_loads
    assert all(head_axis not in dict(i.srcs["in"].offset_terms) for i in kv_loads)
    assert all(head_axis in dict(i.srcs["in"].offset_terms) for i in q_loads)
    assert all(head_axis in i.loopnest for i in kv_loads)  # streamed, not resident
    locs = module.functions[0].memory_locations
    assert sum(locs[i.dst.loc].shape[1] for i in kv_loads if "/k#" in i.dst.loc) < 130 * 4


@pytest.mark.parametrize("causal", [False, True])
def test_keys_over_several_sections_carry_the_state_through_dram(causal):
    """128-key tiles make 2048-key sections: 2300 keys take two, the running max, sum and
    accumulator of each query group wait in DRAM between them."""
    sq = sk = 2300
    att = Attention((1, 1, sq, 32), (1, 1, 32, sk), (1, 1, sk, 32)).scale(0.2)
    if causal:
        att.causal(sq, sk)
    else:
        att.add("mask", None, padding_mask(1, sk, [2200]))
    model, graph = att.fused(guard=not causal, target=TARGETS[2] if causal else TARGETS[1])
    (call,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    call["attrs"]["backend_config"] = json.dumps({"sb_shape": [128, 128, 0]})
    module, _, _ = run(model, graph)
    locs = module.functions[0].memory_locations
    assert any(name.endswith("/state") for name in locs)


def test_wide_head_and_values():
    """D = 160 accumulates two D tiles in PSUM; Dv = 600 takes two PSUM banks."""
    att = Attention((1, 1, 40, 160), (1, 1, 160, 24), (1, 1, 24, 600)).scale(0.08)
    run(*att.fused())


def test_no_batch_dims():
    att = Attention((20, 8), (8, 30), (30, 12)).scale(0.3)
    run(*att.fused())


# --- bf16 / fp16 storage -----------------------------------------------------------------------


def test_bf16_storage_cast_by_the_kernel():
    """fp32 tensors arrive; storage bf16: the loading DMAs round, PSUM accumulates fp32."""
    att = Attention((1, 2, 130, 64), (1, 2, 64, 130), (1, 2, 130, 64)).scale(0.125)
    att.add("mask", None, padding_mask(1, 130, [120]))
    module, _, _ = run(*att.fused(storage="bfloat16"), tol=half_tol(Dtype.BF16, 64, 0.125))
    matmuls = kernel_matmuls(module)
    locs = module.functions[0].memory_locations
    assert matmuls
    for ins in matmuls:
        assert locs[ins.srcs["stationary"].loc].dtype is Dtype.BF16, ins
        assert locs[ins.srcs["moving"].loc].dtype is Dtype.BF16, ins
        dst = locs[ins.dst.loc]
        assert (dst.memory, dst.dtype) == (MemoryType.PSUM, Dtype.FP32)


@pytest.mark.parametrize("storage", ["bfloat16", "float16"])
def test_half_storage_inputs_arrive_cast(storage):
    """As after the raise's Casts: q, kt, v and O are half-precision DRAM tensors."""
    dtype = {"bfloat16": Dtype.BF16, "float16": Dtype.FP16}[storage]
    sq = sk = 130
    cond = np.triu(np.ones((sq, sk), np.bool_), k=1)
    att = Attention((1, 2, sq, 64), (1, 2, 64, sk), (1, 2, sk, 64)).scale(0.125)
    att.masked_fill(cond, NEG_INF)
    model, graph = att.fused(storage=storage)
    module, _, _ = run(
        model,
        graph,
        half_tol(dtype, 64, 0.125),
        machine_dtypes={name: dtype for name in ("q", "kt", "v", "o")},
    )
    locs = module.functions[0].memory_locations
    assert locs["o"].dtype is dtype
    for ins in kernel_matmuls(module):
        assert {locs[ins.srcs[r].loc].dtype for r in ("stationary", "moving")} == {dtype}


def test_bf16_unscaled_scores_d128():
    """No scale: logits have std sqrt(128) and their rounding error grows with sqrt(D)."""
    att = Attention((1, 2, 130, 128), (1, 2, 128, 130), (1, 2, 130, 128)).scale(1.0)
    run(*att.fused(storage="bfloat16"), tol=half_tol(Dtype.BF16, 128, 1.0))


def test_bf16_probabilities_feed_the_pv_matmul():
    """P itself is stored bf16: the PV matmul's stationary is the bf16 Pᵀ tile."""
    att = Attention((1, 1, 16, 8), (1, 1, 8, 16), (1, 1, 16, 8)).scale(0.3)
    module, _, _ = run(*att.fused(storage="bfloat16"), tol=half_tol(Dtype.BF16, 8, 0.3))
    locs = module.functions[0].memory_locations
    stationaries = {locs[i.srcs["stationary"].loc].name for i in kernel_matmuls(module)}
    assert any("pT" in name for name in stationaries)
    assert all(locs[n].dtype is Dtype.BF16 for n in stationaries)


# --- refusals ----------------------------------------------------------------------------------


def test_unknown_step_fails():
    att = Attention((1, 1, 4, 8), (1, 1, 8, 4), (1, 1, 4, 8)).scale(0.1)
    att.steps.append({"op": "softcap", "value": 30.0})
    _, graph = att.fused()
    with pytest.raises(CodegenError, match="unknown score step"):
        compile_graph(graph, CompileOptions(), passes=[])
