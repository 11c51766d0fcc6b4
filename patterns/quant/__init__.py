"""Quantized models as onnxruntime's quantization tool writes them (docs/quantization.md).

Three passes, run before every other pass:

- `nbits.ExpandMatMulNBits`: com.microsoft MatMulNBits (4-bit blocks) as a dequantization of
  the packed weight and a MatMul;
- `qlinear_ops.ExpandQLinearOps`: the QOperator ops that are not matmuls (com.microsoft
  QLinearAdd, QLinearMul, QLinearSigmoid, QLinearConcat, QLinearGlobalAveragePool, …) and
  DynamicQuantizeLinear, as standard ops that compute what onnxruntime computes;
- `integer.RaiseIntegerMatmuls`: every convolution and matmul whose operands are 8-bit
  integers — DequantizeLinear → Conv/MatMul/Gemm (QDQ), QLinearConv, QLinearMatMul, QGemm,
  ConvInteger, MatMulInteger — rewritten to multiply the integers themselves on the PE array,
  exactly, and scale after.

`EXPANDED_VENDOR_OPS` names the vendor-domain ops these passes take, so the vendor-op check
(`patterns/vendor_ops.py`) lets them through to the passes.
"""

from onnx2bir.patterns.quant.integer import INTEGER_VENDOR_OPS
from onnx2bir.patterns.quant.nbits import NBITS_VENDOR_OPS
from onnx2bir.patterns.quant.qlinear_ops import QLINEAR_VENDOR_OPS

EXPANDED_VENDOR_OPS = frozenset(INTEGER_VENDOR_OPS | NBITS_VENDOR_OPS | QLINEAR_VENDOR_OPS)
