"""Convolution kernel selection (TransformConvOp): the canonical conv, the registries, their
predicates and the rewrite to a NativeKernel."""
