"""Attention: the raise to the native kernel (LowerToCustomNativeKernel), the fused attention
ops, and DecomposeAttention back to plain ONNX."""
