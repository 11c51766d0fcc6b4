"""The general autocast in code generation: which dtype PE matmul operands are stored in.

`--auto-cast matmult` (and `all`) stores the operands of every PE matmul in `--auto-cast-type`
when the model computes them in fp32 (docs/autocast.md). Lowerings and kernels allocate their
stationary and moving SBUF tiles in `pe_operand_dtype(cg, model_dtype)`; the instruction that
fills such a tile — a DMA from DRAM or a TensorCopy out of PSUM — is the cast, visible in the
BIR as a write into a location of the cast dtype. PSUM stays fp32 (the PE array accumulates in
fp32 whatever its operands) and evictions write the model's dtype, so results read back in the
model's dtype. `--auto-cast all` also stores every fp32 intermediate tensor (an Internal DRAM
location) in the cast dtype (`storage_dtype`): the DMAs into and out of it are the casts; the
graph's inputs, outputs and constants keep their dtypes. The machine casts nothing by itself:
a Matmult whose operands the PE array cannot pair (fp32 with bf16, say) is refused.

`--auto-cast-exclude` keeps named nodes (or every node of an op type) out of it: their PE
operands stay fp32, and under `all` so does every tensor they read or write
(`resolve_exclusions`, docs/autocast.md#exclude).
"""

from __future__ import annotations

from onnx2bir.bir.enums import Dtype, MemoryKind
from onnx2bir.errors import UserError
from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions

AUTO_CAST_DTYPES = {
    "bf16": Dtype.BF16,
    "fp16": Dtype.FP16,
    "tf32": Dtype.TF32,
    "fp8_e4m3": Dtype.FP8_E4M3,
}


def cast_dtype(options: CompileOptions) -> Dtype | None:
    """The dtype the general autocast stores in; None under `--auto-cast none`."""
    if options.auto_cast == "none":
        return None
    return AUTO_CAST_DTYPES[options.auto_cast_type]


def pe_operand_dtype(cg, model_dtype: Dtype = Dtype.FP32, otherwise: Dtype = Dtype.FP32) -> Dtype:
    """Dtype of the SBUF tiles that feed the PE array for an op computing in `model_dtype`:
    the autocast dtype for an fp32 op, else `otherwise` (what the caller used before); also
    `otherwise` for a node `--auto-cast-exclude` keeps in fp32. bf16 for a conv or matmul
    that multiplies integers within ±256, which bf16 holds exactly, whatever the autocast
    (docs/quantization.md#exactness)."""
    if cg.origin.node in cg.graph.integer_operands:
        return Dtype.BF16
    target = cast_dtype(cg.options)
    if target is None or model_dtype is not Dtype.FP32 or cg.origin.node in cg.graph.keep_fp32:
        return otherwise
    return target


def storage_dtype(
    options: CompileOptions, kind: MemoryKind, model_dtype: Dtype, keep_fp32: bool = False
) -> Dtype:
    """Dtype of the DRAM location of a tensor of the model: the cast dtype for an fp32
    intermediate under `--auto-cast all`, else the tensor's own dtype — also for a tensor
    that a node kept in fp32 reads or writes (`keep_fp32`). (A tensor a pass made, such as a
    conv kernel's channel-last output, keeps its dtype: the driver asks only for the model's
    own tensors.)"""
    if options.auto_cast != "all" or kind is not MemoryKind.INTERNAL or keep_fp32:
        return model_dtype
    if model_dtype is not Dtype.FP32:
        return model_dtype
    return AUTO_CAST_DTYPES[options.auto_cast_type]


def check_exclusions(source: Graph, entries: tuple[str, ...]) -> None:
    """Refuse an `--auto-cast-exclude` entry that names no node and no op type of the model."""
    names = set(source.nx)
    op_types = {data["op_type"] for _, data in source.nodes()}
    unknown = [entry for entry in entries if entry not in names and entry not in op_types]
    if unknown:
        raise UserError(
            f"--auto-cast-exclude {', '.join(unknown)}: no node or op type of that name in the "
            f"model (its op types: {', '.join(sorted(op_types))})"
        )


def resolve_exclusions(
    source: Graph, compiled: Graph, hosts: dict[str, str], entries: tuple[str, ...]
) -> frozenset[str]:
    """The compiled nodes `--auto-cast-exclude` keeps in fp32: those of an excluded node of
    the model (by name, or by its op type) — the node itself, the nodes a pass made from it
    (named `<node>/...`) and the raised kernel hosting it (`hosts`: model node → kernel node;
    a kernel runs in one dtype, so one excluded member keeps the whole block in fp32)."""
    if not entries:
        return frozenset()
    wanted = set(entries)
    excluded = {
        name for name, data in source.nodes() if name in wanted or data["op_type"] in wanted
    }
    kept = set()
    for name in compiled.nx:
        prefixes = [name[:i] for i, char in enumerate(name) if char == "/"]
        if name in excluded or any(prefix in excluded for prefix in prefixes):
            kept.add(name)
    kept.update(host for member, host in hosts.items() if member in excluded)
    return frozenset(kept)


def excluded_model_nodes(source: Graph, entries: tuple[str, ...]) -> list[str]:
    """The model's nodes an `--auto-cast-exclude` list names, in model order."""
    wanted = set(entries)
    return [name for name, data in source.nodes() if name in wanted or data["op_type"] in wanted]
