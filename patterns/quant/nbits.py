"""com.microsoft MatMulNBits as a dequantization and a MatMul (docs/quantization.md#nbits).

In: a MatMulNBits node as onnxruntime's `MatMulNBitsQuantizer` writes it — A [..., K];
B uint8 [N, k_blocks, blob], each byte holding 8 / bits values, the lowest bits first; scales
[N · k_blocks] (or [N, k_blocks]); optional zero points, packed like B per row of N
([N · ⌈k_blocks · bits / 8⌉] uint8) or in the scales' type; optional bias [N]. Out: standard ops,
the node's output tensor kept:

    q  = B unpacked at compile time: uint8 [k_blocks, block_size, N], one byte per value
    W  = (Cast(q) − zp[k_blocks, 1, N]) · scale[k_blocks, 1, N]    on chip, each run
    W  = Reshape(W, [k_blocks · block_size, N]) → Slice to K rows when K is not a multiple
    Y  = MatMul(A, W) (+ bias)

zp is 2^(bits − 1) (8 for 4 bits) when the node has none, as onnxruntime's kernel takes it.
New tensors and nodes are named "<node>/<part>". The weight stays integer in DRAM (one byte
per value: the 4-bit packing itself is not modelled); scales and zero points are small fp
constants. With `accuracy_level` 4 and 4 or 8 bits, A is first quantized as onnxruntime's CPU
kernel quantizes it for its int8 dot products — symmetric int8 per block of block_size along
K, s = max|A_block| / 127, A ← round_half_even(A / s) · s — so the result is onnxruntime's up
to fp32 rounding; other levels, and 2 bits, multiply A as it is (docs/quantization.md#nbits).
A node this cannot expand is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper

from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.errors import CompileError
from onnx2bir.graph import Graph
from onnx2bir.op_traits import op_key
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention.decompose_build import Emitter, Unsupported
from onnx2bir.patterns.passes import PassResult, Statistic

MS_DOMAIN = "com.microsoft"
NBITS_VENDOR_OPS: frozenset[str] = frozenset({op_key("MatMulNBits", MS_DOMAIN)})
SUPPORTED_BITS = (2, 4, 8)  # what onnxruntime's CPU kernel computes (docs/quantization.md#nbits)
# accuracy_level 4 (int8 compute): the bit widths whose onnxruntime CPU kernel quantizes A for
# every block size (measured, docs/quantization.md#nbits); 2 bits only for some block sizes.
QUANTIZED_A_BITS = (4, 8)
INT8_COMPUTE = 4
_A, _B, _SCALES, _ZERO_POINTS, _G_IDX, _BIAS = range(6)


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [..., n] → uint8 [..., n · 8 / bits]: each byte's values, lowest bits first."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte).astype(np.uint8)


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of `unpack_bits` (the last axis a multiple of 8 / bits)."""
    per_byte = 8 // bits
    grouped = values.astype(np.uint8).reshape(*values.shape[:-1], -1, per_byte)
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    return np.bitwise_or.reduce(grouped << shifts, axis=-1).astype(np.uint8)


@dataclass(frozen=True)
class NBitsWeight:
    """One MatMulNBits weight as the expansion stores it."""

    values: np.ndarray  # uint8 [k_blocks, block_size, N]
    scales: np.ndarray  # [k_blocks, 1, N], A's dtype
    zero_points: np.ndarray  # [k_blocks, 1, N] or a scalar, A's dtype
    zero_point_kind: str  # "packed uint8", "float" or "default"
    k: int
    n: int
    bits: int
    block_size: int


def _const(graph: Graph, node: dict, index: int, what: str) -> np.ndarray | None:
    tensor = node["inputs"][index] if index < len(node["inputs"]) else ""
    if not tensor:
        return None
    value = graph.tensors[tensor].const
    if value is None:
        raise Unsupported(f"its {what} ({tensor!r}) is computed at run time, not an initializer")
    return np.asarray(value)


def read_weight(graph: Graph, node: dict) -> NBitsWeight:
    """B, scales and zero points of `node`, unpacked and checked (`Unsupported`: why not)."""
    attrs = node["attrs"]
    k, n = int(attrs.get("K", 0)), int(attrs.get("N", 0))
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 0))
    if bits not in SUPPORTED_BITS:
        raise Unsupported(f"bits={bits} (supported: {', '.join(map(str, SUPPORTED_BITS))})")
    if block < 16 or block & (block - 1):
        raise Unsupported(f"block_size={block} is not a power of two >= 16")
    if k <= 0 or n <= 0:
        raise Unsupported(f"attributes K={k}, N={n} are not positive")
    a_shape = graph.tensors[node["inputs"][_A]].shape
    if not a_shape or a_shape[-1] != k:
        raise Unsupported(f"A {list(a_shape)} does not end in K={k}")
    dtype = graph.tensors[node["inputs"][_A]].dtype
    if not dtype.is_float:
        raise Unsupported(f"A is {dtype}, not a float type")
    blocks = -(-k // block)
    blob = block * bits // 8
    packed = _const(graph, node, _B, "packed weight B")
    if packed is None or packed.dtype != np.uint8 or packed.shape != (n, blocks, blob):
        got = "absent" if packed is None else f"{packed.dtype} {list(packed.shape)}"
        raise Unsupported(
            f"B is {got}, expected uint8 [N, k_blocks, blob] = [{n}, {blocks}, {blob}]"
        )
    scales = _const(graph, node, _SCALES, "scales")
    if scales is None or scales.size != n * blocks:
        got = "absent" if scales is None else str(list(scales.shape))
        raise Unsupported(f"scales are {got}, expected N · k_blocks = {n * blocks} values")
    g_idx = _const(graph, node, _G_IDX, "g_idx")
    if g_idx is not None and not np.array_equal(g_idx.ravel(), np.arange(k) // block):
        raise Unsupported("g_idx reorders the weight's rows into blocks (act-order), not supported")
    # [N, k_blocks, blob] → [N, k_blocks · block_size] → [k_blocks, block_size, N]
    values = unpack_bits(packed, bits).reshape(n, blocks, block).transpose(1, 2, 0)
    zero_points, kind = _zero_points(graph, node, n, blocks, bits)
    as_blocks = lambda v: np.ascontiguousarray(v.reshape(n, blocks).T[:, None, :])  # noqa: E731
    return NBitsWeight(
        np.ascontiguousarray(values),
        as_blocks(scales).astype(dtype.numpy),
        (as_blocks(zero_points) if zero_points.ndim else zero_points).astype(dtype.numpy),
        kind,
        k,
        n,
        bits,
        block,
    )


def _zero_points(graph: Graph, node: dict, n: int, blocks: int, bits: int):
    zero = _const(graph, node, _ZERO_POINTS, "zero points")
    if zero is None:
        return np.asarray(1 << (bits - 1), np.float32), "default"
    per_row = -(-blocks * bits // 8)
    if zero.dtype == np.uint8 and zero.size == n * per_row:
        unpacked = unpack_bits(zero.reshape(n, per_row), bits)[:, :blocks]
        return unpacked.astype(np.float32), "packed uint8"
    if zero.dtype.kind == "f" and zero.size == n * blocks:
        return zero.astype(np.float32).reshape(n, blocks), "float"
    raise Unsupported(
        f"zero points are {zero.dtype} {list(zero.shape)}: expected uint8 packed "
        f"[{n * per_row}] or the scales' type [{n * blocks}]"
    )


def expand(em: Emitter, node: dict) -> NBitsWeight:
    """Stage the expansion of `node` (module docstring) in `em`."""
    weight = read_weight(em.graph, node)
    blocks, block, n = weight.values.shape
    a = node["inputs"][_A]
    dtype = em.info(a).dtype
    q = em.const("weight_q", weight.values)
    w = em.node(
        "Cast",
        "weight_cast",
        [q],
        weight.values.shape,
        dtype,
        to=helper.np_dtype_to_tensor_dtype(dtype.numpy),
    )
    w = em.binary("Sub", "weight_centred", w, em.const("zero_point", weight.zero_points))
    w = em.binary("Mul", "weight_scaled", w, em.const("scale", weight.scales))
    w = em.reshape("weight_rows", w, (blocks * block, n))
    if blocks * block != weight.k:  # the last block is padding past K
        bounds = [
            em.const(f"weight_{what}", np.asarray([value], np.int64))
            for what, value in (("starts", 0), ("ends", weight.k), ("axes", 0))
        ]
        w = em.node("Slice", "weight", [w, *bounds], (weight.k, n))
    if _quantizes_a(node, weight):
        a = quantize_a(em, a, weight.k, block)
    y = em.matmul("matmul", a, w)
    bias = node["inputs"][_BIAS] if len(node["inputs"]) > _BIAS else ""
    if bias:
        y = em.binary("Add", "bias", y, bias)
    em.finish(y, node["outputs"][0])
    return weight


def _quantizes_a(node: dict, weight: NBitsWeight) -> bool:
    level = int(node["attrs"].get("accuracy_level", 0))
    return level == INT8_COMPUTE and weight.bits in QUANTIZED_A_BITS


def quantize_a(em: Emitter, a: str, k: int, block: int) -> str:
    """A as accuracy_level 4 multiplies it (module docstring): quantized to int8 per block of
    K, symmetric, and dequantized, on chip. Zeros pad a last partial block (they change no
    block's max); a block of zeros divides by the smallest normal instead of 0."""
    shape = em.shape(a)
    dtype = em.info(a).dtype
    blocks = -(-k // block)
    x = a
    if blocks * block != k:
        pads = [0] * (2 * len(shape))
        pads[-1] = blocks * block - k
        padding = em.const("a_pads", np.asarray(pads, np.int64))
        x = em.node("Pad", "a_padded", [x, padding], (*shape[:-1], blocks * block))
    x = em.reshape("a_blocks", x, (*shape[:-1], blocks, block))
    amax = em.reduce("ReduceMax", "a_amax", em.unary("Abs", "a_abs", x))
    scale = em.binary("Div", "a_scale", amax, em.scalar("a_int8_max", 127.0, dtype))
    tiny = em.scalar("a_tiny", float(np.finfo(dtype.numpy).tiny), dtype)
    divisor = em.binary("Max", "a_divisor", scale, tiny)
    q = em.unary("Round", "a_q", em.binary("Div", "a_scaled", x, divisor))
    x = em.binary("Mul", "a_dequantized", q, scale)
    x = em.reshape("a_rows", x, (*shape[:-1], blocks * block))
    if blocks * block != k:
        bounds = [
            em.const(f"a_{what}", np.asarray([value], np.int64))
            for what, value in (("starts", 0), ("ends", k), ("axes", -1))
        ]
        x = em.node("Slice", "a_int8", [x, *bounds], (*shape[:-1], k))
    return x


@dataclass(frozen=True)
class ExpandMatMulNBits:
    name: str = "ExpandMatMulNBits"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        available = frozenset(GENERIC_LOWERINGS)
        findings: list[dict] = []
        for name in graph.topological_order():
            data = graph.node(name)
            if op_key(data["op_type"], data["domain"]) not in NBITS_VENDOR_OPS:
                continue
            em = Emitter(graph, name, available, remove=[name], stage="")
            try:
                weight = expand(em, data)
                missing = em.missing_ops()
                if missing:
                    raise Unsupported(f"needs {', '.join(missing)}, which have no lowering")
            except Unsupported as why:
                raise CompileError(f"MatMulNBits node {name!r}: {why}") from None
            em.commit()
            findings.append(
                {
                    "nodes": [name],
                    "op": "MatMulNBits",
                    "bits": weight.bits,
                    "block_size": weight.block_size,
                    "K": weight.k,
                    "N": weight.n,
                    "zero_points": weight.zero_point_kind != "default",
                    "zero_point_kind": weight.zero_point_kind,
                    "bias": len(data["inputs"]) > _BIAS and bool(data["inputs"][_BIAS]),
                    "accuracy_level": int(data["attrs"].get("accuracy_level", 0)),
                    "a_quantized_int8": _quantizes_a(data, weight),
                }
            )
        stats = [
            Statistic(
                self.name,
                "matmul_nbits_expanded",
                "Number of MatMulNBits expanded into a dequantization and a MatMul",
                len(findings),
            )
        ]
        return PassResult(bool(findings), stats, findings)
