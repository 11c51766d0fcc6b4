"""Models older than the oracle can run, upgraded with `onnx.version_converter`.

onnxruntime 1.32 has no kernels for opsets below 7 (AveragePool-1, BatchNormalization-6,
Mul-6 are gone), and the emulating oracle's exact roundings need Where and IsNaN (opset 9;
runtime/oracle/emulating.py). Old model-zoo files and onnx's own PyTorch-converted suites are
opset 3-8, so such a model is converted to `OLDEST_OPSET` before anything reads it: the
compiler and onnxruntime then see the same, upgraded model, and a `note:` says so
(docs/input_contracts.md#old-opsets). The converter's adapters are onnx's; a model it cannot
convert is refused with its reason (exit 1) when onnxruntime cannot run it as it is
(opset < 7), and kept as it is otherwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.shape_inference
import onnx.version_converter

from onnx2bir.errors import CompileError

OLDEST_OPSET = 9
ONNXRUNTIME_OLDEST_OPSET = 7  # below it onnxruntime 1.32 runs nothing: conversion must succeed


def default_opset(model: onnx.ModelProto) -> int:
    """The model's ai.onnx opset (0 when it imports none)."""
    return next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), 0)


def upgrade_old_opset(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """`model` converted to `OLDEST_OPSET` when its opset is older (else itself), with the
    note that says from which opset to which."""
    opset = default_opset(model)
    if not 0 < opset < OLDEST_OPSET:
        return model, None
    if opset < 7:
        model = _prelu_slopes_per_channel(model)
    # The converter reads an initializer only when it is also a graph input (IR 3's rule):
    # list the others for the conversion and unlist them after.
    listed = {value.name for value in model.graph.input}
    unlisted = [init for init in model.graph.initializer if init.name not in listed]
    if unlisted:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        copy.graph.input.extend(
            onnx.helper.make_tensor_value_info(i.name, i.data_type, i.dims) for i in unlisted
        )
        model = copy
    try:
        upgraded = onnx.version_converter.convert_version(model, OLDEST_OPSET)
    except Exception as exc:  # the converter raises RuntimeError/ValueError with the adapter
        if opset >= ONNXRUNTIME_OLDEST_OPSET:
            return model, None  # onnxruntime runs it as it is; only the roundings need 9
        reason = " ".join(str(exc).split())[:300]
        raise CompileError(
            f"the model's opset {opset} is older than onnxruntime and the oracle run "
            f"(opset {OLDEST_OPSET}), and onnx.version_converter cannot upgrade it: {reason}"
        ) from exc
    # The converter keeps the IR version; an opset-9 model needs IR 4 at least (IR 3 reads
    # initializers only as inputs' defaults, which onnxruntime and the checker treat alike).
    upgraded.ir_version = max(upgraded.ir_version, 4)
    if unlisted:
        names = {init.name for init in unlisted}
        kept = [value for value in upgraded.graph.input if value.name not in names]
        del upgraded.graph.input[:]
        upgraded.graph.input.extend(kept)
    note = (
        f"opset {opset} upgraded to opset {OLDEST_OPSET} with onnx.version_converter "
        "(onnxruntime has no kernels below opset 7; the oracle's roundings need opset 9): "
        "both the compiler and onnxruntime read the upgraded model"
    )
    return upgraded, note


def oracle_source(model: str | Path | onnx.ModelProto | bytes, upgraded_from: int | None):
    """What onnxruntime runs for `model`: the upgraded copy when the import upgraded it."""
    if upgraded_from is None:
        return model
    from onnx2bir.frontend.importer import read_model

    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    return upgrade_old_opset(read_model(model))[0]


def _prelu_slopes_per_channel(model: onnx.ModelProto) -> onnx.ModelProto:
    """Before opset 7 a PRelu slope of shape [C] applies per channel (axis 1); from opset 7 it
    broadcasts as numpy does (against the last axis), and the converter keeps the shape. A
    [C] slope of an input of rank > 2 is reshaped to [C, 1, ...] by a Reshape node before
    the PRelu, which means the same in both (a copy of the model)."""
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {
        value.name: [d.dim_value for d in value.type.tensor_type.shape.dim]
        for value in [*inferred.graph.input, *inferred.graph.value_info]
    }
    for init in model.graph.initializer:
        shapes.setdefault(init.name, list(init.dims))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for index, node in enumerate(copy.graph.node):
        if node.op_type == "PRelu" and len(node.input) == 2:
            x_shape, slope_shape = shapes.get(node.input[0], []), shapes.get(node.input[1])
            if len(x_shape) > 2 and slope_shape == [x_shape[1]] and x_shape[1] > 0:
                channel = [x_shape[1]] + [1] * (len(x_shape) - 2)
                stem = f"{node.name or f'PRelu_{index}'}/per_channel"
                copy.graph.initializer.append(
                    numpy_helper.from_array(np.array(channel, np.int64), f"{stem}_shape")
                )
                nodes.append(
                    onnx.helper.make_node(
                        "Reshape", [node.input[1], f"{stem}_shape"], [stem], name=stem
                    )
                )
                node.input[1] = stem
        nodes.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
