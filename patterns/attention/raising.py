"""LowerToCustomNativeKernel (docs/attention.md#attention-raise): raise the eligible matmul →
softmax → matmul attention blocks to an attention kernel CustomCall.

In: a Graph and the CompileOptions. Out: each block found by `attention_match.find_blocks`
(the pattern table and its check; re-exported here) that passes the gates replaced by one
CustomCall with the block's q, kᵀ, v and extra inputs, its score steps as JSON, and Casts
around it when the cast policy casts; a finding per block, raised or not, with the reason.

Gates, in the reference's order: the master flag `enable_native_kernel_attention` and the target
("sunda"); dtype eligibility (bf16/fp16 always, fp32 only with a valid cast policy — always
valid here, the options reject anything else); `enable_native_kernel_attention_bf16` (off:
only tensors already in bf16 match; on: any dtype, intermediates forced to the cast type);
query sequence > 1007, head dim ≤ 128, SBUF bytes ≤ 196608.

Target (INFERRED, the reference does not spell out the decision): a score mask that is the causal
triangle — a folded constant, or a subgraph that computes one, read structurally
(patterns/attention/causal.py, docs/attention.md#structural-causality) — selects
CausalAttentionMMSoftmaxMMWithoutSwap, the mask step becomes the kernel's own causal masking and
the mask's subgraph leaves the graph; otherwise query and key lengths equal (self-attention) select
AttentionMMSoftmaxMMWithoutSwap, and unequal lengths AttentionMMSoftmaxMM, whose first matmul
swaps the operand roles so the longer sequence streams as the moving operand.

SBUF bytes: `sb_shape(seq_q, seq_k, causal, dtype, cast_matmult)` (kernels/attention/plan.py,
the reference's signature) gives the tile sizes and the bytes per partition the flash-style
kernel reserves; with `matmult-to-…` the scores stay fp32, 2 bytes more per key column than
with `all-to-…`. The gate adds the `dynamic-dma-sbuf-bytes` option (bytes per partition kept
free for dynamic DMA) before comparing with 196608 (docs/attention_kernel.md#sbuf-reservation).

Fused attention ops (onnx.Attention, the com.microsoft attention ops) are blocks too
(`attention_fused`): listed with their variant, gated the same way, raised with their
packaging when the kernel takes their form, left for DecomposeAttention otherwise.

Logging (`--verbose`): "Found match (<nodes> with params N: …) for native kernel <target>"
per raise, " Casting <what> to <type> for native kernel " when the policy casts, and the
reference's warning when the pass runs with the kernel disabled.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.graph import Graph, TensorInfo
from onnx2bir.kernels.attention import (
    ATTENTION,
    ATTENTION_WITHOUT_SWAP,
    CAUSAL_ATTENTION_WITHOUT_SWAP,
)
from onnx2bir.kernels.attention.plan import sb_shape
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention.causal import drop_replaced_masks
from onnx2bir.patterns.attention.fused import raise_fused, read_fused
from onnx2bir.patterns.attention.layout import plan_layout
from onnx2bir.patterns.attention.match import MAX_SCORE_STEPS as MAX_SCORE_STEPS
from onnx2bir.patterns.attention.match import PATTERNS as PATTERNS
from onnx2bir.patterns.attention.match import AttentionBlock, _is_causal_step, find_blocks
from onnx2bir.patterns.attention.match import _is_causal_mask as _is_causal_mask
from onnx2bir.patterns.attention.match import check_block as check_block
from onnx2bir.patterns.attention.padding import (
    build_padding,
    no_key_rows,
    split_steps,
    uniform_average,
)
from onnx2bir.patterns.findings import BlockFinding, Idiom
from onnx2bir.patterns.passes import PassResult, Statistic

log = logging.getLogger("onnx2bir.LowerToCustomNativeKernel")
logging.getLogger("onnx2bir").addHandler(logging.NullHandler())  # shown only with --verbose

MIN_SEQUENCE = 1007  # the raise fires for sequence > 0x3ef
MAX_HEAD_DIM = 128
MAX_SB_BYTES = 196608  # 0x30000
PSUM_SHAPE = (128, 512)  # one PSUM bank of scores: 128 query rows x 512 keys
_CAST_DTYPES = {"bf16": Dtype.BF16, "fp16": Dtype.FP16}


# --- gates and target ------------------------------------------------------------------------
def block_sb_shape(block, options: CompileOptions) -> tuple[int, int, int]:
    """(query rows, keys per tile, bytes per partition) the kernel reserves for `block`."""
    return sb_shape(
        block.seq_q,
        block.seq_k,
        block.causal,
        storage_dtype(block, options),
        options.what_to_cast == "matmult",
    )


def sb_bytes(block, options: CompileOptions) -> int:
    return block_sb_shape(block, options)[2] + options.dynamic_dma_sbuf_bytes


def gate(block, options: CompileOptions) -> tuple[str | None, str | None]:
    """(target, None) when the block is raised, else (None, the reason)."""
    if not options.enable_native_kernel_attention:
        return None, "enable-native-kernel-attention is off"
    if options.target != "sunda":
        return None, f"target {options.target!r} is not 'sunda'"
    if block.dtype not in (Dtype.BF16, Dtype.FP16, Dtype.FP32):
        return None, f"dtype {block.dtype} is not eligible"
    if not options.enable_native_kernel_attention_bf16 and block.dtype is not Dtype.BF16:
        return None, (
            f"tensors are {block.dtype}, not bfloat16, and "
            "enable-native-kernel-attention-bf16 is off"
        )
    if block.seq_q <= MIN_SEQUENCE:
        return None, f"sequence {block.seq_q} <= {MIN_SEQUENCE}"
    if block.head_dim > MAX_HEAD_DIM:
        return None, f"head dim {block.head_dim} > {MAX_HEAD_DIM}"
    if sb_bytes(block, options) > MAX_SB_BYTES:
        return None, (
            f"SBUF bytes {sb_bytes(block, options)} (with {options.dynamic_dma_sbuf_bytes} "
            f"for dynamic DMA) > {MAX_SB_BYTES}"
        )
    if block.causal:
        return CAUSAL_ATTENTION_WITHOUT_SWAP, None
    if block.seq_q == block.seq_k:
        return ATTENTION_WITHOUT_SWAP, None
    return ATTENTION, None


def storage_dtype(block, options: CompileOptions) -> Dtype:
    """The cast policy: bf16/fp16 storage for the matmul operands (accumulation stays fp32)."""
    if block.dtype in (Dtype.BF16, Dtype.FP16):
        return block.dtype
    return _CAST_DTYPES[options.cast_type]


# --- the rewrite -------------------------------------------------------------------------------
def raise_block(graph: Graph, block: AttentionBlock, target: str, options: CompileOptions) -> None:
    """Replace the block by one CustomCall and its packaging: each operand reshaped into the
    kernel's batch layout, q, kᵀ and v transposed into its operand layout (the identity
    permutation unless a grouped K is read untransposed) and cast when the policy casts, the
    output reshaped back (docs/attention_kernel.md#packaging). Identity Reshapes and
    Transposes cost nothing: the code generator drops them."""
    storage = storage_dtype(block, options)
    block, no_key = split_padding(graph, block)
    steps = list(block.steps)
    dropped: list[str] = []
    if target == CAUSAL_ATTENTION_WITHOUT_SWAP:
        # The kernel masks causally itself: the triangle's Add or Where becomes that step, and
        # the mask, read by nothing else, is never computed
        # (docs/attention.md#structural-causality).
        for i, step in enumerate(steps):
            if step["op"] in ("add", "masked_fill") and _is_causal_step(
                graph, step, block.extras[step["input"]], block
            ):
                steps[i] = {"op": "causal"}
        steps, _, dropped = drop_replaced_masks(steps, list(block.extras))
    layout, reason = plan_layout(graph, block)
    if layout is None:  # check_block lays every block out before it is gated
        raise AssertionError(f"attention block at {block.match['pv']!r}: {reason}")
    anchor = block.match["pv"]
    for node in block.nodes:
        graph.remove_node(node)
    laid = [(o, shape) for o, shape in layout.operands if o.source not in dropped]
    read = {operand.source for operand, _ in laid}
    # What the kernel no longer reads: the repeat of a grouped-query K or V, a causal mask
    # the kernel computes itself. Never computed.
    unread = [t for t in (block.q, block.kt, block.v, *block.extras) if t not in read]
    operands, laid_as = [], {}
    for operand, shape in laid:
        tensor = _reshape(graph, operand.source, shape, f"{anchor}/layout_{operand.role}")
        if operand.role in ("q", "kt", "v"):
            rank = len(shape)
            perm = list(range(rank))
            if operand.swap:
                perm[-2:] = [rank - 1, rank - 2]
            tensor = _transpose(graph, tensor, perm, f"{anchor}/layout_{operand.role}")
            tensor = _cast(graph, tensor, storage, f"{anchor}/cast_{operand.role}")
        operands.append(tensor)
        laid_as.setdefault(operand.source, (tensor, shape))
        laid_as.setdefault(operand.role, (tensor, shape))
    output = block.output
    kernel_out = f"{output}@kernel"
    graph.tensors[kernel_out] = TensorInfo(kernel_out, layout.output_shape, storage)
    config = backend_config(block, target, options)
    graph.add_node(
        anchor,
        "CustomCall",
        operands,
        [kernel_out],
        {
            "custom_call_target": target,
            "backend_config": json.dumps(config),
            "api_version": 1,
            "steps": json.dumps(steps),
            "post_steps": json.dumps(block.post_steps),
            "storage_dtype": str(storage),
        },
        domain="onnx2bir",
    )
    graph.remove_dead_producers(unread)
    out_info = graph.tensors[output]
    if no_key:
        _fix_rows_without_keys(graph, block, no_key, laid_as, kernel_out, storage, options)
        return
    if out_info.dtype is storage:
        _reshape(graph, kernel_out, out_info.shape, f"{anchor}/layout_out", into=output)
        return
    viewed = _reshape(graph, kernel_out, out_info.shape, f"{anchor}/layout_out")
    graph.add_node(
        f"{anchor}/cast_out", "Cast", [viewed], [output], {"to": _onnx_type(out_info.dtype)}
    )


def split_padding(
    graph: Graph, block: AttentionBlock
) -> tuple[AttentionBlock, list[tuple[str, str]]]:
    """The block with each causal-and-padding mask step split in two
    (docs/attention.md#padding-split): the padding step on a [B, 1, 1, Sk] operand built
    beside the mask, then the kernel's causal step. The mask is then read by no step, and the
    raise drops it with the subgraph that computed it. Also, per split whose rows that keep no
    key the model spreads over all keys, (the [..., Sq, 1] condition of those rows, the padding
    operand it is laid out as)."""
    if not block.splits:
        return block, []
    no_key = []
    steps, extras, spaces = [], list(block.extras), list(block.extra_spaces)
    for index, step in enumerate(block.steps):
        split = block.splits.get(index)
        if split is None:
            steps.append(step)
            continue
        mask = block.extras[step["input"]]
        extras.append(build_padding(graph, split, mask))
        spaces.append(block.extra_spaces[step["input"]])
        steps.extend(split_steps(split, step, len(extras) - 1))
        if split.uniform_rows:
            rows = no_key_rows(graph, split, mask, block.seq_q, block.seq_k)
            no_key.append((rows, extras[-1]))
    block = replace(block, steps=steps, extras=extras, extra_spaces=spaces, splits={})
    return block, no_key


def _fix_rows_without_keys(
    graph: Graph,
    block: AttentionBlock,
    no_key: list[tuple[str, str]],
    laid_as: dict[str, tuple[str, tuple[int, ...]]],
    kernel_out: str,
    storage: Dtype,
    options: CompileOptions,
) -> None:
    """The block's output with the rows that keep no key replaced by the mean of V, the model's
    answer there (docs/attention.md#padding-split): `Where(no key, mean of V, O)` in the
    kernel's layout — the condition laid out as the padding operand is (its batch dims, then
    [Sq, 1]), the mean of V as V is (a grouped V once per group) — in the output's dtype, then
    viewed as the block's output. Every other row is the kernel's, untouched."""
    anchor = block.match["pv"]
    out_info = graph.tensors[block.output]
    laid_shape = tuple(graph.tensors[kernel_out].shape)
    result = kernel_out
    if out_info.dtype is not storage:
        result = f"{kernel_out}@{out_info.dtype}"
        graph.tensors[result] = TensorInfo(result, laid_shape, out_info.dtype)
        to = _onnx_type(out_info.dtype)
        graph.add_node(f"{anchor}/cast_out", "Cast", [kernel_out], [result], {"to": to})
    rank = len(laid_shape)
    conditions = []
    for index, (rows, padding) in enumerate(no_key):
        # Laid out as the padding operand (its own shape when no step reads it).
        lead = laid_as.get(padding, (rows, graph.tensors[rows].shape))[1][:-2]
        shape = _fit_rank((*lead, block.seq_q, 1), rank)
        conditions.append(_reshape(graph, rows, shape, f"{anchor}/no_key{index}"))
    condition = conditions[0]
    for index, other in enumerate(conditions[1:], 1):
        shape = np.broadcast_shapes(graph.tensors[condition].shape, graph.tensors[other].shape)
        either = f"{anchor}/no_key_or{index}"
        graph.tensors[either] = TensorInfo(either, tuple(shape), Dtype.BOOL)
        graph.add_node(either, "Or", [condition, other], [either])
        condition = either
    v = laid_as["v"][0]
    round_storage = options.what_to_cast == "all"
    name = f"{anchor}/no_key_mean"
    mean = uniform_average(graph, v, block.seq_k, storage, out_info.dtype, round_storage, name)
    mean = _reshape(graph, mean, _fit_rank(graph.tensors[mean].shape, rank), name)
    fixed = f"{anchor}/no_key_fixed"
    graph.tensors[fixed] = TensorInfo(fixed, laid_shape, out_info.dtype)
    graph.add_node(f"{anchor}/no_key_where", "Where", [condition, mean, result], [fixed])
    _reshape(graph, fixed, out_info.shape, f"{anchor}/layout_out", into=block.output)


def _fit_rank(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """`shape` with leading unit dims dropped or added to `rank` dims: it broadcasts to a
    tensor of that rank as before, and the result keeps that rank."""
    shape = tuple(shape)
    while len(shape) > rank and shape[0] == 1:
        shape = shape[1:]
    if len(shape) > rank:
        raise AssertionError(f"{list(shape)} broadcasts beyond rank {rank}")
    return (1,) * (rank - len(shape)) + shape


def _reshape(
    graph: Graph, tensor: str, shape: tuple[int, ...], name: str, into: str | None = None
) -> str:
    """Reshape(tensor, shape) into a new tensor (or `into`); an identity when the shape is
    the tensor's own."""
    info = graph.tensors[tensor]
    out = into or f"{name}/reshaped"
    graph.tensors.setdefault(out, TensorInfo(out, tuple(shape), info.dtype))
    target = f"{name}/shape"
    value = np.asarray(shape, dtype=np.int64)
    graph.tensors[target] = TensorInfo(target, value.shape, Dtype.INT64, value)
    graph.add_node(f"{name}/reshape", "Reshape", [tensor, target], [out])
    return out


def _transpose(graph: Graph, tensor: str, perm: list[int], name: str) -> str:
    info = graph.tensors[tensor]
    out = f"{name}/transposed"
    shape = tuple(info.shape[p] for p in perm)
    graph.tensors[out] = TensorInfo(out, shape, info.dtype)
    graph.add_node(f"{name}/transpose", "Transpose", [tensor], [out], {"perm": perm})
    return out


def backend_config(block, target: str, options: CompileOptions) -> dict:
    """The five keys of the reference's serialized config."""
    return {
        "psum_shape": list(PSUM_SHAPE),
        "sb_shape": list(block_sb_shape(block, options)),
        "auto_cast": options.what_to_cast,
        "auto_cast_type": options.cast_type,
        "kernel_name": target,
    }


def _onnx_type(dtype: Dtype) -> int:
    import onnx

    return onnx.helper.np_dtype_to_tensor_dtype(dtype.numpy)


def _cast(graph: Graph, tensor: str, dtype: Dtype, name: str) -> str:
    if graph.tensors[tensor].dtype is dtype:
        return tensor
    cast = f"{tensor}@{dtype}"
    if cast not in graph.tensors:
        graph.tensors[cast] = TensorInfo(cast, graph.tensors[tensor].shape, dtype)
        graph.add_node(name, "Cast", [tensor], [cast], {"to": _onnx_type(dtype)})
    return cast


# --- the pass ----------------------------------------------------------------------------------
DISABLED_WARNING = "LowerToCustomNativeKernel pass is enabled but none of the kernels is enabled."


@dataclass(frozen=True)
class LowerToCustomNativeKernel:
    """Raise matmul-softmax-matmul attention to a native attention kernel
    (docs/attention.md#gates)."""

    name: str = "LowerToCustomNativeKernel"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        if not options.enable_native_kernel_attention:
            log.warning(DISABLED_WARNING)
        findings, raised, fused = [], 0, 0
        blocks = find_blocks(graph)
        for block, match, reason in blocks:
            if block is None:
                findings.append(
                    {
                        "nodes": list(match.values()),
                        "variant": None,
                        "target": None,
                        "reason": f"not an attention block the kernel takes: {reason}",
                        "is_attention": False,
                        "status": "refused",
                    }
                )
                continue
            entry = _entry(block, "MatMul-Softmax-MatMul", ", ".join(block.variant) or "plain")
            entry["pattern"] = block.pattern
            target, why = gate(block, options)
            if target is not None:
                before = set(graph.nx)
                raise_block(graph, block, target, options)
                self._raised(entry, graph, before, block, target, options)
                raised += 1
            findings.append(_finish(entry, target, why))
        for node in graph.topological_order():
            if node not in graph.nx:
                continue
            block = read_fused(graph, node)
            if block is None:
                continue
            fused += 1
            entry = _entry(block, block.source, ", ".join(block.variant))
            target, why = (None, None) if block.heads is None else gate(block, options)
            if target is not None and block.problem:
                target, why = None, f"{block.problem} (DecomposeAttention expands it)"
            elif why is None and target is None:
                why = block.problem
            if target is not None:
                before = set(graph.nx)
                storage = storage_dtype(block, options)
                config = backend_config(block, target, options)
                raise_fused(graph, block, target, storage, config, frozenset(GENERIC_LOWERINGS))
                self._raised(entry, graph, before, block, target, options)
                raised += 1
            findings.append(_finish(entry, target, why))
        found = sum(1 for block, _, _ in blocks if block is not None) + fused
        findings = [BlockFinding.from_json(Idiom.ATTENTION, f) for f in findings]
        stats = [
            Statistic(
                self.name,
                "attention_blocks_found",
                "Number of attention blocks found (matched or fused ops)",
                found,
            ),
            Statistic(
                self.name,
                "attention_fused_ops_found",
                "Number of fused attention ops (onnx.Attention, com.microsoft) found",
                fused,
            ),
            Statistic(
                self.name,
                "attention_blocks_raised",
                "Number of attention blocks lowered to a native kernel",
                raised,
            ),
        ]
        return PassResult(raised > 0, stats, findings)

    @staticmethod
    def _raised(entry: dict, graph: Graph, before: set, block, target: str, options) -> None:
        storage = storage_dtype(block, options)
        new = set(graph.nx) - before
        entry["packaging"] = dict(
            sorted(Counter(graph.node(n)["op_type"] for n in new if n in graph.nx).items())
        )
        entry["packaging"].pop("CustomCall", None)
        shape = block_sb_shape(block, options)
        entry.update(storage_dtype=str(storage), sb_shape=list(shape), sb_bytes=shape[2])
        params = [block.seq_q, block.seq_k, block.head_dim, int(block.causal), str(storage)]
        log.info(
            "Found match (%s with params %d: %s) for native kernel %s",
            ", ".join(entry["nodes"]),
            len(params),
            ", ".join(map(str, params)),
            target,
        )
        if storage is not block.dtype:
            log.info(
                " Casting %s to %s for native kernel %s",
                options.what_to_cast,
                options.cast_type,
                target,
            )


def _entry(block, source: str, variant: str) -> dict:
    return {
        "nodes": list(block.nodes),
        "variant": variant,
        "target": None,
        "reason": None,
        "is_attention": True,
        "source": source,
        "seq_q": block.seq_q,
        "seq_k": block.seq_k,
        "head_dim": block.head_dim,
        "dtype": str(block.dtype),
    }


def _finish(entry: dict, target: str | None, why: str | None) -> dict:
    entry.update(target=target, reason=why, status="raised" if target else "refused")
    return entry
