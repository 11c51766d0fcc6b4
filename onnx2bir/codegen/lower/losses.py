"""The training losses exported graphs keep: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.

Registered through `LOWERINGS`, which `onnx2bir.codegen.lower.GENERIC_LOWERINGS` merges.
"""

from __future__ import annotations

from collections.abc import Callable

LOWERINGS: dict[str, Callable] = {}
