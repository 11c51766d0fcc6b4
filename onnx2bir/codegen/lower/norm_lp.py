"""Lp norms and one-hot maxima: LpNormalization, LpPool, Hardmax, EyeLike.

Registered through `LOWERINGS`, which `onnx2bir.codegen.lower.GENERIC_LOWERINGS` merges.
"""

from __future__ import annotations

from collections.abc import Callable

LOWERINGS: dict[str, Callable] = {}
