"""The API's shared pieces: how a model is given and how options are named.

Compile options are the fields of `CompileOptions`, named as the command-line flags with `-`
spelled `_`; an unknown name is refused with the valid ones listed.
"""

from __future__ import annotations

import dataclasses
import os

import onnx

from onnx2bir.options import CompileOptions

ModelSource = str | os.PathLike | onnx.ModelProto
OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CompileOptions))
DEFAULT_LOCALIZE_BUDGET_MB = 256.0  # --localize-budget


def compile_options(options: CompileOptions | None = None, **overrides) -> CompileOptions:
    """`options` (default: the defaults) with the named fields replaced; unknown names are
    refused with the valid ones listed."""
    unknown = sorted(set(overrides) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"unknown compile option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(OPTION_NAMES)}"
        )
    return dataclasses.replace(options or CompileOptions(), **overrides)


def model_label(model: ModelSource) -> str:
    return "<ModelProto>" if isinstance(model, onnx.ModelProto) else str(model)
