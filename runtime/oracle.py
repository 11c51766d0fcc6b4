"""The oracle: onnxruntime on the same inputs the machine gets, plus input synthesis.

Inputs are seeded random values by dtype and shape (standard normal for floats, small
non-negative integers for integer inputs, fair coins for bool), or read from an .npz file.
onnxruntime runs the original model on the CPU with graph optimisations off, so every node
computes exactly what the ONNX spec says rather than a fused rewrite of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from onnx2bir.errors import UserError
from onnx2bir.graph import Graph

INTEGER_INPUT_HIGH = 8  # integer inputs are drawn from [0, 8)


def synthesize_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random values for every graph input, by dtype and shape."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        info = graph.tensors[name]
        dtype = info.dtype.numpy
        if info.dtype.is_float:
            value = rng.standard_normal(info.shape).astype(np.float32).astype(dtype)
        elif dtype == np.bool_:
            value = rng.integers(0, 2, info.shape).astype(np.bool_)
        else:
            value = rng.integers(0, INTEGER_INPUT_HIGH, info.shape).astype(dtype)
        feeds[name] = value
    return feeds


def load_inputs(path: str | Path, graph: Graph) -> dict[str, np.ndarray]:
    """Inputs from an .npz file; every graph input must be present with its shape."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            feeds = {key: archive[key] for key in archive.files}
    except Exception as exc:
        raise UserError(f"{path}: cannot read inputs as .npz ({type(exc).__name__})") from exc
    missing = [name for name in graph.inputs if name not in feeds]
    if missing:
        raise UserError(f"{path}: no array for input(s) {', '.join(missing)}")
    for name in graph.inputs:
        info = graph.tensors[name]
        if tuple(feeds[name].shape) != tuple(info.shape):
            raise UserError(
                f"{path}: input {name!r} has shape {tuple(feeds[name].shape)}, the model "
                f"expects {tuple(info.shape)}"
            )
        feeds[name] = feeds[name].astype(info.dtype.numpy)
    return {name: feeds[name] for name in graph.inputs}


def onnxruntime_session(model: onnx.ModelProto | str | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def run_onnxruntime(
    model: onnx.ModelProto | str | Path,
    inputs: dict[str, np.ndarray],
    outputs: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run `model` on `inputs`; returns the requested (default: all) outputs by name."""
    try:
        session = onnxruntime_session(model)
        names = outputs or [out.name for out in session.get_outputs()]
        results = session.run(names, inputs)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserError(f"onnxruntime could not run the model: {first_line}") from exc
    return dict(zip(names, results, strict=True))
