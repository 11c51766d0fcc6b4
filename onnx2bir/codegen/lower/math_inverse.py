"""Inverse trigonometric and hyperbolic functions, Tan and Swish.

Registered through `LOWERINGS`, which `onnx2bir.codegen.lower.GENERIC_LOWERINGS` merges.
"""

from __future__ import annotations

from collections.abc import Callable

LOWERINGS: dict[str, Callable] = {}
