"""com.microsoft MatMulNBits expanded into a dequantization and a MatMul
(patterns/quant/nbits.py, docs/quantization.md#nbits): the packing read as onnxruntime reads it,
every layout the op allows run on the machine against onnxruntime, the verdict rejecting a
wrong unpacking, and the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from conftest import IR_VERSION, assert_matches_onnxruntime
from onnx import TensorProto, helper, numpy_helper

import onnx2bir.patterns.quant.nbits as nbits
from onnx2bir.api.validate import validate
from onnx2bir.bir.enums import Dtype
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.errors import CompileError
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.quant.nbits import ExpandMatMulNBits, pack_bits, unpack_bits
from onnx2bir.runtime.oracle.ort import run_onnxruntime

FP32 = CompileOptions(auto_cast="none")


def nbits_model(
    k: int,
    n: int,
    block: int,
    bits: int = 4,
    zero_points: str | None = None,
    bias: bool = False,
    a_shape: tuple[int, ...] | None = None,
    scales_2d: bool = False,
    g_idx: np.ndarray | None = None,
    b_input: bool = False,
    seed: int = 0,
) -> tuple[onnx.ModelProto, np.ndarray]:
    """y = MatMulNBits(a, …) with random codes, and the dequantized weight [K, N] it stands
    for (zero points: None, "packed" uint8 or "float" in the scales' type)."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    codes = rng.integers(0, 1 << bits, size=(n, blocks * block)).astype(np.uint8)
    packed = pack_bits(codes, bits).reshape(n, blocks, block * bits // 8)
    scales = rng.uniform(0.01, 0.1, size=(n, blocks)).astype(np.float32)
    zp = np.full((n, blocks), 1 << (bits - 1), np.float32)
    inits = {"scales": scales if scales_2d else scales.ravel()}
    names = ["a", "B", "scales"]
    if zero_points == "packed":
        per_row = -(-blocks * bits // 8)
        z = rng.integers(0, 1 << bits, size=(n, per_row * 8 // bits)).astype(np.uint8)
        inits["zero_points"] = pack_bits(z, bits).ravel()
        zp = z[:, :blocks].astype(np.float32)
    elif zero_points == "float":
        zp = rng.uniform(0, (1 << bits) - 1, size=(n, blocks)).astype(np.float32)
        inits["zero_points"] = zp.ravel()
    names.append("zero_points" if zero_points else "")
    if g_idx is not None:
        inits["g_idx"] = g_idx.astype(np.int32)
    names.append("g_idx" if g_idx is not None else "")
    if bias:
        inits["bias"] = rng.standard_normal(n).astype(np.float32)
    names.append("bias" if bias else "")
    while not names[-1]:
        names.pop()
    node = helper.make_node(
        "MatMulNBits",
        names,
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=0,
        name="mm",
    )
    a_shape = a_shape or (3, k)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))]
    initializers = [numpy_helper.from_array(v, name) for name, v in inits.items()]
    if b_input:
        inputs.append(helper.make_tensor_value_info("B", TensorProto.UINT8, list(packed.shape)))
    else:
        initializers.append(numpy_helper.from_array(packed, "B"))
    relu = helper.make_node("Relu", ["y"], ["out"])  # y's shape comes from the vendor rule
    graph = helper.make_graph(
        [node, relu],
        "nbits",
        inputs,
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [*a_shape[:-1], n])],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSION,
    )
    weight = (codes.reshape(n, blocks, block) - zp[:, :, None]) * scales[:, :, None]
    return model, weight.reshape(n, -1)[:, :k].T


def test_unpack_reads_the_low_bits_first():
    assert unpack_bits(np.array([0x21, 0xF0], np.uint8), 4).tolist() == [1, 2, 0, 15]
    assert unpack_bits(np.array([0b11_10_01_00], np.uint8), 2).tolist() == [0, 1, 2, 3]
    for bits in (2, 4, 8):
        values = np.random.default_rng(bits).integers(0, 1 << bits, size=(3, 16)).astype(np.uint8)
        assert np.array_equal(unpack_bits(pack_bits(values, bits), bits), values)


def test_the_reference_weight_is_what_onnxruntime_multiplies():
    """The test models' packing is onnxruntime's (low nibble first, zero points per row)."""
    for kwargs in ({}, {"zero_points": "packed", "k": 48}, {"bits": 2, "zero_points": "packed"}):
        args = {"k": 64, "n": 8, "block": 16, **kwargs}
        model, weight = nbits_model(**args)
        a = np.random.default_rng(1).standard_normal((3, args["k"])).astype(np.float32)
        got = run_onnxruntime(model, {"a": a})["out"]
        np.testing.assert_allclose(got, np.maximum(a @ weight, 0), atol=1e-5, rtol=1e-5)


CASES = {
    "block16": dict(k=64, n=16, block=16),
    "block32_zp": dict(k=64, n=24, block=32, zero_points="packed"),
    "block64_bias": dict(k=128, n=16, block=64, bias=True),
    "block128_zp_rank3": dict(k=256, n=8, block=128, zero_points="packed", a_shape=(2, 3, 256)),
    "block256_zp_bias": dict(k=256, n=8, block=256, zero_points="packed", bias=True),
    "k_not_multiple": dict(k=40, n=16, block=16, zero_points="packed", bias=True),
    "odd_blocks_zp": dict(k=80, n=5, block=16, zero_points="packed"),
    "float_zp_2d_scales": dict(k=64, n=16, block=32, zero_points="float", scales_2d=True),
    "bits2": dict(k=64, n=16, block=16, bits=2, zero_points="packed"),
    "bits8": dict(k=64, n=16, block=32, bits=8, zero_points="packed"),
    "trivial_g_idx": dict(k=64, n=16, block=32, g_idx=np.arange(64) // 32),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_onnxruntime(case):
    model, _ = nbits_model(**CASES[case])
    assert_matches_onnxruntime(model)


def test_expansion_keeps_the_weight_integer_and_dequantizes_on_chip():
    model, _ = nbits_model(k=40, n=16, block=16, zero_points="packed", bias=True)
    compiled = compile_graph(import_graph(model), FP32)
    graph = compiled.graph
    ops = [data["op_type"] for _, data in graph.nodes()]
    assert "MatMulNBits" not in ops
    assert sorted(ops) == sorted(
        ["Cast", "Sub", "Mul", "Reshape", "Slice", "MatMul", "Add", "Relu"]
    )
    q = graph.tensors["mm/weight_q"]
    assert q.dtype is Dtype.UINT8 and q.shape == (3, 16, 16)  # [k_blocks, block_size, N]
    assert graph.producer("y") == "mm/bias"  # the node's output tensor is kept
    assert compiled.module.functions[0].memory_locations["mm/weight_q"].dtype is Dtype.UINT8
    (finding,) = compiled.passes.result_of("ExpandMatMulNBits").findings
    assert finding["nodes"] == ["mm"]
    assert (finding["bits"], finding["block_size"], finding["zero_points"]) == (4, 16, True)
    assert finding["bias"] and finding["zero_point_kind"] == "packed uint8"
    (stat,) = compiled.passes.result_of("ExpandMatMulNBits").statistics
    assert stat.name == "matmul_nbits_expanded" and stat.value == 1


def test_validates_under_the_default_autocast():
    model, _ = nbits_model(k=128, n=32, block=32, zero_points="packed", bias=True)
    result = validate(model)
    assert result.passed, result.text()


def test_the_verdict_rejects_a_weight_unpacked_high_nibble_first(monkeypatch):
    """Reading each byte's nibbles in the wrong order compiles a different weight; validation
    against onnxruntime fails, under the default autocast and in fp32."""
    model, _ = nbits_model(k=128, n=32, block=32, zero_points="packed")
    assert validate(model, auto_cast="none").passed

    def swapped(packed: np.ndarray, bits: int) -> np.ndarray:
        low_first = unpack_bits(packed, bits)
        return low_first.reshape(*low_first.shape[:-1], -1, 8 // bits)[..., ::-1].reshape(
            low_first.shape
        )

    monkeypatch.setattr(nbits, "unpack_bits", swapped)
    assert not validate(model, auto_cast="none").passed
    assert not validate(model).passed


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(bits=4, g_idx=np.arange(64)[::-1] // 32), "g_idx reorders"),
        (dict(b_input=True), "computed at run time"),
    ],
)
def test_refused_with_the_reason(kwargs, reason):
    model, _ = nbits_model(k=64, n=16, block=32, **kwargs)
    with pytest.raises(CompileError, match=f"MatMulNBits node 'mm': .*{reason}"):
        compile_graph(import_graph(model), FP32)


def test_refuses_bits_the_kernel_does_not_have():
    model, _ = nbits_model(k=64, n=16, block=32)
    node = model.graph.node[0]
    for attr in node.attribute:
        if attr.name == "bits":
            attr.i = 3
    graph = import_graph(model)
    with pytest.raises(CompileError, match=r"'mm': bits=3 \(supported: 2, 4, 8\)"):
        ExpandMatMulNBits().run(graph, FP32)


def test_leaves_a_graph_without_the_op_alone():
    model, _ = nbits_model(k=64, n=16, block=32)
    graph = import_graph(model)
    graph.remove_node(next(name for name, _ in graph.nodes() if name == "mm"))
    result = ExpandMatMulNBits().run(graph, FP32)
    assert not result.changed and result.statistics[0].value == 0


def with_accuracy_level(model: onnx.ModelProto, level: int) -> onnx.ModelProto:
    for attr in model.graph.node[0].attribute:
        if attr.name == "accuracy_level":
            attr.i = level
    return model


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(k=256, n=32, block=32, zero_points="packed"),  # B of 4096 values: held aside
        dict(k=72, n=16, block=16, bias=True, a_shape=(2, 3, 72)),  # a padded last block
        dict(k=128, n=16, block=64, bits=8, zero_points="packed"),
    ],
)
def test_accuracy_level_4_quantizes_a_as_onnxruntime_does(kwargs):
    """onnxruntime's int8 path (accuracy_level 4) quantizes A per block; so does the expansion,
    and validation agrees in fp32 and under the default autocast."""
    model, weight = nbits_model(**kwargs)
    model = with_accuracy_level(model, 4)
    shape = kwargs.get("a_shape", (3, kwargs["k"]))
    a = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    plain = np.maximum(a @ weight, 0)
    ort = run_onnxruntime(model, {"a": a})["out"]
    assert np.abs(ort - plain).max() > 1e-3  # onnxruntime did quantize A
    result = validate(model, {"a": a}, auto_cast="none")
    assert result.passed, result.text()
    (finding,) = result.details.passes.result_of("ExpandMatMulNBits").findings
    assert finding["a_quantized_int8"] and finding["accuracy_level"] == 4
    assert validate(model, {"a": a}).passed


def test_ignoring_accuracy_level_4_is_rejected(monkeypatch):
    model = with_accuracy_level(nbits_model(k=256, n=32, block=32)[0], 4)
    monkeypatch.setattr(nbits, "_quantizes_a", lambda node, weight: False)
    assert not validate(model, auto_cast="none").passed


def swiglu_of_nbits() -> onnx.ModelProto:
    """gate, up and down projections as MatMulNBits (4 bits, block 32, zero points)."""
    rng = np.random.default_rng(5)
    nodes, inits = [], []

    def projection(name: str, a: str, k: int, n: int) -> str:
        blocks = k // 32
        codes = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
        zero = rng.integers(0, 16, size=(n, blocks)).astype(np.uint8)
        inits.extend(
            [
                numpy_helper.from_array(pack_bits(codes, 4).reshape(n, blocks, 16), f"{name}_B"),
                numpy_helper.from_array(
                    rng.uniform(0.01, 0.05, n * blocks).astype(np.float32), f"{name}_scales"
                ),
                numpy_helper.from_array(pack_bits(zero, 4).ravel(), f"{name}_zp"),
            ]
        )
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [a, f"{name}_B", f"{name}_scales", f"{name}_zp"],
                [name],
                domain="com.microsoft",
                name=name,
                K=k,
                N=n,
                bits=4,
                block_size=32,
            )
        )
        return name

    gate, up = projection("gate", "x", 64, 128), projection("up", "x", 64, 128)
    nodes.append(helper.make_node("Sigmoid", [gate], ["sig"]))
    nodes.append(helper.make_node("Mul", [gate, "sig"], ["silu"]))
    nodes.append(helper.make_node("Mul", ["silu", up], ["act"]))
    projection("y", "act", 128, 64)
    graph = helper.make_graph(
        nodes,
        "swiglu_nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 64])],
        inits,
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
        ir_version=IR_VERSION,
    )


def test_expanded_projections_raised_into_an_mlp_kernel_validate():
    """The expansions' MatMuls form a SwiGLU block the MLP raise takes; its bf16 roundings are
    inside the MatMulNBits ops, which the verdict reports as not emulated."""
    result = validate(swiglu_of_nbits())
    assert result.passed, result.text()
    passes = result.details.passes
    assert len(passes.result_of("ExpandMatMulNBits").findings) == 3
    assert [f["target"] for f in passes.result_of("LowerToNKIKernelCC").findings if f["target"]]
    unemulated = result.details.cast_plan.unemulated
    assert {"gate", "up", "y"} <= set(unemulated)
    assert validate(swiglu_of_nbits(), auto_cast="none").passed


def test_the_oracle_reads_the_weights_as_onnxruntime_prepacks_them(monkeypatch):
    """accuracy_level 4 changes onnxruntime's answer only when the weight is an initializer:
    the emulating oracle gives MatMulNBits its held-aside weights back
    (`emulating.restore_prepacked_weights`). Without that, the oracle ignores the level and
    rejects a program that computes exactly what onnxruntime computes."""
    import onnx2bir.runtime.oracle.emulating as emulating

    model = with_accuracy_level(nbits_model(k=256, n=32, block=32)[0], 4)
    assert validate(model, auto_cast="none").passed
    monkeypatch.setattr(emulating, "restore_prepacked_weights", lambda model, weights: set())
    assert not validate(model, auto_cast="none").passed


@pytest.mark.parametrize("gain", [0.0, 1.02])
def test_with_the_weights_restored_a_wrong_scale_still_fails(monkeypatch, gain):
    """Through the same oracle path, zeros and a 2% gain on the weight's scales fail."""
    model = with_accuracy_level(nbits_model(k=256, n=32, block=32)[0], 4)
    read = nbits.read_weight

    def scaled(graph, node):
        weight = read(graph, node)
        return dataclasses.replace(
            weight, scales=(weight.scales * gain).astype(weight.scales.dtype)
        )

    monkeypatch.setattr(nbits, "read_weight", scaled)
    assert not validate(model, auto_cast="none").passed
