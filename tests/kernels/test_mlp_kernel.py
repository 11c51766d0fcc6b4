"""The fused MLP kernel (onnx2bir.kernels.mlp.kernel) against onnxruntime.

Each case builds y = act(x·w1 + b1)·w2 + b2 as an ONNX model (MatMul + Add, or Gemm with
transB for the transposed-weight flags; the activation spelled in primitive ops), imports
it, replaces every math node by one AwsNeuronMLPNKI CustomCall node by hand (what the MLP
raise does), compiles with no passes, runs the BIR on the machine model and compares with
onnxruntime on the same inputs. All matmuls are fp32, so the fp32 tolerance applies: 1e-4
absolute, 1e-3 relative. Weights are seeded normals scaled by 1/sqrt(fan-in), so activations
stay O(1) whatever K and H.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.api import commands as api
from onnx2bir.api.validate import validate
from onnx2bir.bir.enums import Dtype, MemoryType, Opcode
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen.driver import BirCodeGen, CodegenError
from onnx2bir.compiler import compile_graph
from onnx2bir.frontend.importer import import_model
from onnx2bir.graph import Graph, Node
from onnx2bir.kernels.mlp import TARGET
from onnx2bir.kernels.mlp.kernel import ACTIVATIONS, mlp_args, token_block
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast

IR_VERSION = 10  # onnxruntime reads IR 10 (opsets up to 21)


class Mlp:
    """The math model of one MLP block and the CustomCall node that replaces it."""

    def __init__(
        self,
        x_shape,
        h: int,
        n: int,
        activation: str,
        bias: bool = True,
        up_bias: bool | None = None,
        trans_w1: bool = False,
        trans_w2: bool = False,
        flatten_hidden: bool = False,
        seed: int = 0,
    ) -> None:
        self.x_shape, self.activation = tuple(x_shape), activation
        self.trans_w1, self.trans_w2 = trans_w1, trans_w2
        k = self.x_shape[-1]
        rng = np.random.default_rng(seed)
        self.inits: dict[str, np.ndarray] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.slots = {"w1": "", "b1": "", "w2": "", "b2": "", "w_up": "", "b_up": ""}

        def weight(name: str, rows: int, cols: int, transposed: bool) -> None:
            value = (rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(np.float32)
            self.inits[name] = np.ascontiguousarray(value.T) if transposed else value
            self.slots[name] = name

        def bias_of(name: str, size: int, present: bool) -> str:
            if present:
                self.inits[name] = rng.standard_normal(size).astype(np.float32)
                self.slots[name] = name
            return name if present else ""

        weight("w1", k, h, trans_w1)
        z = self.linear("x", "w1", bias_of("b1", h, bias), trans_w1, "z")
        if activation == "swiglu":
            weight("w_up", k, h, trans_w1)
            u = self.linear(
                "x", "w_up", bias_of("b_up", h, bias if up_bias is None else up_bias), trans_w1, "u"
            )
            hidden = self.mul(self.mul(z, self.unary("Sigmoid", z)), u)
        else:
            hidden = self.act(z)
        if flatten_hidden:  # GPT-2 style: a Reshape to [tokens, H] between the dots
            shape = np.array([math.prod(self.x_shape[:-1]), h], np.int64)
            self.inits["hidden_shape"] = shape
            hidden = self.op("Reshape", [hidden, "hidden_shape"])
        weight("w2", h, n, trans_w2)
        self.linear(hidden, "w2", bias_of("b2", n, bias), trans_w2, "y")

    def const(self, value: float) -> str:
        name = f"c{len(self.inits)}"
        self.inits[name] = np.array(value, np.float32)
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def unary(self, op_type: str, a: str) -> str:
        return self.op(op_type, [a])

    def mul(self, a: str, b: str) -> str:
        return self.op("Mul", [a, b])

    def linear(self, x: str, w: str, b: str, transposed: bool, out: str) -> str:
        if transposed:  # Gemm transB: the weight is stored [out, in]
            return self.op("Gemm", [x, w, *([b] if b else [])], out, transB=1)
        if not b:
            return self.op("MatMul", [x, w], out)
        return self.op("Add", [self.op("MatMul", [x, w]), b], out)

    def act(self, z: str) -> str:
        a = self.activation
        if a == "relu":
            return self.unary("Relu", z)
        if a == "silu":
            return self.mul(z, self.unary("Sigmoid", z))
        if a == "quick_gelu":
            return self.mul(z, self.unary("Sigmoid", self.mul(z, self.const(1.702))))
        if a == "gelu":  # 0.5·z·(1 + erf(z / sqrt 2))
            erf = self.unary("Erf", self.op("Div", [z, self.const(math.sqrt(2.0))]))
            return self.mul(self.mul(z, self.op("Add", [erf, self.const(1.0)])), self.const(0.5))
        if a == "gelu_tanh":  # 0.5·z·(1 + tanh(sqrt(2/π)·(z + 0.044715·z³)))
            cube = self.mul(self.mul(z, z), z)
            inner = self.op("Add", [z, self.mul(cube, self.const(0.044715))])
            tanh = self.unary("Tanh", self.mul(inner, self.const(math.sqrt(2.0 / math.pi))))
            return self.mul(self.mul(z, self.op("Add", [tanh, self.const(1.0)])), self.const(0.5))
        raise ValueError(a)

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "mlp",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(self.x_shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(v, n) for n, v in self.inits.items()],
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
        )
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
        return model

    def fused(self, activation: str | None = None, **attrs) -> tuple[onnx.ModelProto, Graph]:
        model = self.model()
        graph = import_model(model)
        for name, _ in list(graph.nodes()):
            graph.remove_node(name)
        attrs = {
            **attrs,
            "custom_call_target": TARGET,
            "backend_config": "",
            "api_version": 1,
            "activation": activation or self.activation,
            "trans_w1": int(self.trans_w1),
            "trans_w2": int(self.trans_w2),
        }
        s = self.slots
        inputs = ["x", s["w1"], s["b1"], s["w2"], s["b2"], s["w_up"], s["b_up"]]
        graph.add_node("mlp", "CustomCall", inputs, ["y"], attrs, domain="onnx2bir")
        return model, graph


def run(model: onnx.ModelProto, graph: Graph, seed: int = 0):
    """Compile, verify, run on the machine and compare; returns the module."""
    compiled = compile_graph(graph, FP32, passes=[])
    problems = verify_module(compiled.module)
    assert not problems, "\n".join(problems[:10])
    feeds = synthesize_inputs(graph, seed)
    got = run_function(compiled.module, feeds)["y"]
    expected = run_onnxruntime(model, feeds)["y"]
    result = compare_output("y", got, expected, FP32_ATOL, FP32_RTOL)
    assert result.passed, result.to_json()
    return compiled.module


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_each_activation(activation):
    run(*Mlp((2, 8, 32), 64, 48, activation).fused())


@pytest.mark.parametrize("activation", ["relu", "quick_gelu", "swiglu"])
def test_without_biases(activation):
    run(*Mlp((16, 24), 40, 20, activation, bias=False).fused())


def test_swiglu_up_bias_only():
    run(*Mlp((16, 24), 40, 20, "swiglu", bias=False, up_bias=True).fused())


@pytest.mark.parametrize("trans_w1, trans_w2", [(True, False), (False, True), (True, True)])
def test_transposed_weights(trans_w1, trans_w2):
    run(*Mlp((20, 40), 70, 30, "gelu", trans_w1=trans_w1, trans_w2=trans_w2).fused())


def test_transposed_weights_wider_than_a_tile():
    run(*Mlp((150, 200), 260, 530, "silu", trans_w1=True, trans_w2=True).fused())


@pytest.mark.parametrize("activation", ["gelu_tanh", "swiglu"])
def test_tokens_k_h_over_128_n_over_512(activation):
    """T = 300 (one block of 3 token tiles), K = 200, H = 300, N = 600 (two N chunks)."""
    module = run(*Mlp((3, 100, 200), 300, 600, activation).fused())
    matmuls = [i for i in module.functions[0].instructions() if i.opcode is Opcode.MATMULT]
    locs = module.functions[0].memory_locations
    assert all(
        locs[i.srcs[r].loc].dtype is Dtype.FP32 for i in matmuls for r in ("stationary", "moving")
    )


def _weight_loads(module, weight: str) -> list:
    """The DMAs that read `weight` (or its stored transpose `<node>/<weight>.T`)."""
    return [
        i
        for i in module.functions[0].instructions()
        if i.opcode is Opcode.DMA_COPY and _source(i).loc.split("/")[-1] in (weight, f"{weight}.T")
    ]


def _row_tiles(load) -> int:
    """128-row tiles one weight DMA brings: its source's row-tile count."""
    counts = _source(load).counts
    return counts[1] if len(counts) == 3 else 1


def _source(dma):
    (src,) = dma.srcs.values()
    return src


def test_w2_blocks_over_the_limit_come_in_row_groups():
    """H = 2560: a 512-column block of w2 is 20 row tiles of 2 KiB per partition in fp32, over
    WEIGHT_BLOCK_BYTES, so it comes in groups of at most 16 row tiles, evened out to two of 10
    (not 16 and 4: `balanced`), one DMA each, for the five N chunks (four of 512 columns and
    one of 152); the accumulation runs across the groups. (The weights, 172 KiB per partition
    for w2 alone, are too large to hold whole.)"""
    module = run(*Mlp((4, 256), 2560, 2200, "relu").fused())
    loads = _weight_loads(module, "w2")
    assert sorted({_row_tiles(i) for i in loads}) == [10]


def test_row_groups_are_evened_out():
    from onnx2bir.kernels.mlp.kernel import balanced

    # as few groups as the largest size needs, all of one size but a last one at most one
    # smaller: 196 tiles in groups of at most 64 need four, so 49 each
    for largest, tiles, even in [(64, 196, 49), (64, 128, 64), (16, 20, 10), (64, 132, 44)]:
        assert balanced(largest, tiles) == even
        groups = -(-tiles // even)
        assert groups == -(-tiles // largest) and tiles - (groups - 1) * even >= even - groups


def test_w1_and_w_up_blocks_over_the_limit_come_in_row_groups():
    """K = 8448 (66 row tiles): a 128-column block of w1 or w_up is 33 KiB per partition in
    fp32, over WEIGHT_BLOCK_BYTES, so it comes in groups of at most 64 row tiles, the gated
    pair together. Three copies of 64-tile groups of both weights (192 KiB) cannot fit beside
    x (33 KiB), so the groups halve to 32 tiles (96 KiB), evened out to three groups of 22."""
    module = run(*Mlp((3, 8448), 130, 20, "swiglu").fused())
    for weight in ("w1", "w_up"):
        assert sorted({_row_tiles(i) for i in _weight_loads(module, weight)}) == [22]


def test_row_group_loads_do_not_wait_for_the_peeled_group():
    """K = 16,896 (132 row tiles) at batch 1: w1's 128-column blocks come in groups of at most 64
    row tiles, evened out to three of 44. The first group of each block opens the accumulation,
    so it is peeled out of the group loop; it has a copy of its own, and the other groups rotate
    over two more. So within a block no load of w1 waits for a matmul: its only waits are for
    the previous block's matmuls (edges carried by the hidden loop). With the peeled group in
    one of the rotating copies, the last group's load would wait for the peeled group's matmuls
    and the stream of weights would stall behind the PE array (docs/mlp.md#weights)."""
    module = run(*Mlp((1, 16896), 256, 20, "relu").fused())
    by_id = {i.id: i for i in module.functions[0].instructions()}
    loads = _weight_loads(module, "w1")
    # the peeled group's load and the group loop's (one instruction for the other two)
    assert sorted(_row_tiles(i) for i in loads) == [44, 44]
    for load in loads:
        for dep in load.deps:
            if by_id[dep.source].opcode is Opcode.MATMULT:
                assert dep.carried_by is not None, f"{load} waits for {by_id[dep.source]}"


def test_transposed_classifier_weights_stored_transposed_in_bf16():
    """A classifier (Gemm transB, Relu, Gemm transB) raised under the default autocast: its
    weights are stored transposed and in bf16 at compile time (docs/autocast.md#weights), so
    they are loaded by plain DMAs, w1's 16,512 rows in row groups (w1 is 129 KiB per partition,
    too large to hold whole), and never flipped on the PE array (no matmul against the
    identity); the model validates."""
    model = Mlp((1, 16512), 512, 1000, "relu", trans_w1=True, trans_w2=True).model()
    result = validate(model)
    assert result.passed, result.text()
    module = api.compile(model).module
    fn = module.functions[0]
    stored = {n: loc.dtype for n, loc in fn.memory_locations.items() if n.endswith(".T")}
    assert sorted(n.split("/")[-1] for n in stored) == ["w1.T", "w2.T"]
    assert set(stored.values()) == {Dtype.BF16}
    assert {_row_tiles(i) for i in _weight_loads(module, "w1")} == {65, 64}
    flips = [
        i
        for i in fn.instructions()
        if i.opcode is Opcode.MATMULT and i.srcs["stationary"].loc.startswith("identity")
    ]
    assert not flips


def test_reshape_between_the_dots():
    """x [2, 8, 32] but y [16, 48]: only the token-major order matters."""
    run(*Mlp((2, 8, 32), 64, 48, "gelu_tanh", flatten_hidden=True).fused())


def test_several_token_blocks():
    """T = 1100: two whole 512-token blocks (a BIR loop) and a 76-token remainder."""
    run(*Mlp((1100, 64), 96, 40, "relu").fused())


def test_hidden_stays_on_chip():
    """h is never written to DRAM: every DMA out of SBUF goes to the output y."""
    module = run(*Mlp((3, 100, 200), 300, 600, "quick_gelu").fused())
    fn = module.functions[0]
    for ins in fn.instructions():
        if (
            ins.opcode is Opcode.DMA_COPY
            and fn.memory_locations[ins.dst.loc].memory is MemoryType.DRAM
        ):
            assert ins.dst.loc == "y", ins


@pytest.mark.parametrize("h, block", [(12800, 256), (25600, 128)])
def test_large_hidden_shrinks_the_token_block(h, block):
    """hᵀ takes H/128·block·4 bytes per partition: for 512 tokens 200 KiB at H = 12800, more
    than SBUF's 192 KiB, so the block shrinks to 256 tokens (to 128 at H = 25600)."""
    mlp = Mlp((600, 8), h, 8, "relu")
    model, graph = mlp.fused()
    cg = BirCodeGen(graph, CompileOptions(), {}, {})
    cg.before_function()
    assert token_block(cg, mlp_args(cg, Node.of(graph.node("mlp")))) == block
    run(model, graph)


def test_hidden_too_large_fails_clearly():
    model, graph = Mlp((200, 8), 60000, 8, "relu").fused()
    with pytest.raises(CodegenError, match="hᵀ and xᵀ for even 128 tokens"):
        compile_graph(graph, FP32, passes=[])


def test_unsupported_activation_fails():
    model, graph = Mlp((4, 8), 16, 8, "relu").fused(activation="sigmoid_mul")
    with pytest.raises(CodegenError, match="activation 'sigmoid_mul'"):
        compile_graph(graph, FP32, passes=[])


def test_unknown_norm_fails():
    model, graph = Mlp((4, 8), 16, 8, "relu").fused(norm="group")
    with pytest.raises(CodegenError, match="norm 'group' is not one of layer, rms"):
        compile_graph(graph, FP32, passes=[])


def test_fused_offset_past_the_weight_fails():
    """w1_offset + H beyond w1's columns (H from w2's rows)."""
    model, graph = Mlp((4, 8), 16, 8, "relu").fused(w1_offset=4)
    with pytest.raises(CodegenError, match="has no 16 hidden features from 4"):
        compile_graph(graph, FP32, passes=[])


def _loads_in_loops(module, weight: str) -> list:
    """Loads of `weight` under a loop (every instruction is in its node's scope region)."""
    return [i for i in _weight_loads(module, weight) if len(i.loopnest) > 1]


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_weights_held_whole_come_in_chunks_before_the_compute(activation):
    """K = 256, H = 640, N = 600 in fp32: the weights (5, 5 and 12 KiB per partition) are held
    whole (MlpTiles.held_whole), each loaded once in chunks of about CHUNK_BYTES per partition,
    unrolled, before any compute: w1 (and w_up) in runs of four hidden tiles (640 = 512 + 128),
    w2 one row tile per DMA (2,400 bytes per partition each). No weight DMA sits in a loop or
    waits for anything (nothing is rotated into its buffer)."""
    module = run(*Mlp((2, 100, 256), 640, 600, activation).fused())
    weights = ["w1", "w2"] + (["w_up"] if activation == "swiglu" else [])
    for weight in weights:
        loads = _weight_loads(module, weight)
        assert len(loads) == (5 if weight == "w2" else 2)
        assert not _loads_in_loops(module, weight)
        assert all(not load.deps for load in loads)
    assert {_source(i).counts[-1] for i in _weight_loads(module, "w1")} == {512, 128}


def test_weights_held_whole_serve_every_token_block():
    """T = 1100 (two 512-token blocks in a loop and a remainder): whole weights are loaded once
    for all of them, not once per block (w1 and w2 in one chunk each); race-free under a
    random schedule."""
    model, graph = Mlp((1100, 128), 256, 130, "relu").fused()
    module = run(model, graph)
    feeds = synthesize_inputs(graph, 0)
    assert run_scheduled(module, feeds, parse_schedule("random:1"), True).race_count == 0
    assert len(_weight_loads(module, "w1")) == 1
    assert len(_weight_loads(module, "w2")) == 1
    assert not _loads_in_loops(module, "w2")


@pytest.mark.parametrize("tokens, whole", [(128, True), (512, False)])
def test_weights_held_whole_leave_room_for_the_activations(tokens, whole):
    """K = 1024, H = 2048, N = 1024 in fp32 (BERT-large's MLP in bf16 has the same 128 KiB per
    partition): at 128 tokens (one tile) the weights are held whole, loaded once and outside
    any loop; at 512 tokens (four tiles) the kernel's larger tiles and the room kept for
    three 1024-wide activations of four row tiles (`activation_room`, 48 KiB) leave too little,
    so the weights stream per block, their loads in loops. Both match onnxruntime."""
    module = run(*Mlp((tokens, 1024), 2048, 1024, "gelu").fused())
    for weight in ("w1", "w2"):
        assert bool(_loads_in_loops(module, weight)) is not whole, weight
        if whole:
            assert all(not load.deps for load in _weight_loads(module, weight)), weight
