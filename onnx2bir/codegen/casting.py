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
"""

from __future__ import annotations

from onnx2bir.bir.enums import Dtype, MemoryKind
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
    the autocast dtype for an fp32 op, else `otherwise` (what the caller used before)."""
    target = cast_dtype(cg.options)
    if target is None or model_dtype is not Dtype.FP32:
        return otherwise
    return target


def storage_dtype(options: CompileOptions, kind: MemoryKind, model_dtype: Dtype) -> Dtype:
    """Dtype of the DRAM location of a tensor of the model: the cast dtype for an fp32
    intermediate under `--auto-cast all`, else the tensor's own dtype. (A tensor a pass
    made, such as a conv kernel's channel-last output, keeps its dtype: the driver asks only
    for the model's own tensors.)"""
    if options.auto_cast != "all" or kind is not MemoryKind.INTERNAL:
        return model_dtype
    if model_dtype is not Dtype.FP32:
        return model_dtype
    return AUTO_CAST_DTYPES[options.auto_cast_type]
