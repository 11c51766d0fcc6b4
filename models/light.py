"""Seeded random weights for the ONNX "light" backend-test models.

The onnx package ships nine classic CNNs as ``onnx/backend/test/data/light/light_<file>.onnx``
with the graph but not the weights: each weight is made at run time by a ``ConstantOfShape``
node that fills it with 0.02, and a few biases and batch-norm tensors are initializers.

In:  a model name (short name such as ``"alexnet"``, file name such as ``"bvlc_alexnet"``, or
     ``"light_bvlc_alexnet"``) and an integer seed.
Out: ``randomized_light_model`` returns an ``onnx.ModelProto`` in which every weight is a
     seeded random initializer with the original shape and dtype. The ``ConstantOfShape`` nodes
     and their shape tensors are gone, the only graph input is the data input, the opset is
     unchanged (9) and the IR version is raised to 4 so that initializers need not be graph
     inputs. ``light_model_path`` writes that model once to
     ``models/.cache/light_<short>_s<seed>.onnx`` and returns the path.

Values come from ``numpy.random.default_rng(seed)``, drawn in graph order, and depend on how
the tensor is used:

* Conv / Gemm / MatMul weights: He init, ``normal * sqrt(2 / fan_in)``, where ``fan_in`` is
  ``prod(shape[1:])`` for Conv and for Gemm with ``transB=1``, ``shape[0]`` for Gemm with
  ``transB=0`` and ``shape[-2]`` for MatMul, taken on the shape the op reads (inception_v1
  reshapes a 1x1x1000x1024 weight to 1000x1024 before its Gemm).
* Biases (Conv, Gemm, batch-norm bias, an operand of Add / Sum / Sub): ``uniform(-0.1, 0.1)``.
* Batch-norm scale and an operand of Mul: ``uniform(0.8, 1.2)``; batch-norm mean
  ``uniform(-0.1, 0.1)`` and variance ``uniform(0.8, 1.2)`` (but see calibration below).
* Anything else: ``uniform(-0.1, 0.1)``.

A tensor that only passes through Unsqueeze, Reshape, Squeeze, Flatten, Transpose, Identity or
Cast takes the role of the op that finally reads it. Integer initializers (Reshape target
shapes) are kept; initializers that no node reads are dropped.

Batch-norm calibration (``calibrate=True``, the default): with random running statistics a
batch norm does not normalize, and in resnet50 and shufflenet the activations then grow block
after block until the softmax is one-hot (logits std about 2e3 and 3e4). So each
BatchNormalization's running mean and variance are then set to the per-channel mean and
variance of its input for one seeded N(0, 1) input, measured in a single onnxruntime run.
This applies to densenet121, inception_v2, resnet50 and shufflenet; the others have no batch
norms and need only onnx and numpy. Nothing here imports torch.

Script: ``python models/light.py squeezenet [more names] [--seed N] [--cache-dir DIR]
[--force] [--check]`` writes the models and prints their paths; ``--check`` also runs
onnx.checker and onnxruntime on a random input. ``python models/light.py --list`` prints the
names.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Short name -> name of the file in onnx/backend/test/data/light, minus "light_" and ".onnx".
LIGHT_MODELS: dict[str, str] = {
    "alexnet": "bvlc_alexnet",
    "densenet121": "densenet121",
    "inception_v1": "inception_v1",
    "inception_v2": "inception_v2",
    "resnet50": "resnet50",
    "shufflenet": "shufflenet",
    "squeezenet": "squeezenet",
    "vgg19": "vgg19",
    "zfnet512": "zfnet512",
}

DEFAULT_CACHE_DIR = Path(__file__).resolve().parent / ".cache"

# Ops that pass a weight on unchanged in value (only their first input carries the data).
_PASS_THROUGH = frozenset({"Unsqueeze", "Reshape", "Squeeze", "Flatten", "Transpose", "Identity"})
_PASS_THROUGH_ANY_DTYPE = frozenset({"Cast"})
_FLOAT_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
)
_BN_ROLES = {1: "scale", 2: "bias", 3: "mean", 4: "var"}


def light_data_dir() -> Path:
    """Folder of the light models inside the installed onnx package."""
    return Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "light"


def short_name(name: str) -> str:
    """Turn a short name, a file name, or a ``light_`` file name into the short name."""
    key = name.removesuffix(".onnx").removeprefix("light_")
    if key in LIGHT_MODELS:
        return key
    for short, file_name in LIGHT_MODELS.items():
        if key == file_name:
            return short
    known = ", ".join(sorted(LIGHT_MODELS))
    raise ValueError(f"unknown light model {name!r}; known models: {known}")


def light_source_path(name: str) -> Path:
    """Path of the original ``light_<file>.onnx`` for a model name."""
    return light_data_dir() / f"light_{LIGHT_MODELS[short_name(name)]}.onnx"


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, tensor in enumerate(node.input):
            if tensor:
                uses.setdefault(tensor, []).append((node, index))
    return uses


def _attr(node: onnx.NodeProto, name: str, default: float, kind: type = int) -> Any:
    for attribute in node.attribute:
        if attribute.name == name:
            return kind(helper.get_attribute_value(attribute))
    return kind(default)


def _role(name: str, uses: dict[str, list[tuple[onnx.NodeProto, int]]]) -> tuple[str, str, str]:
    """Return (role, fan-in rule, tensor the op reads) for a weight from its first real user."""
    pending, seen = [name], set()
    while pending:
        tensor = pending.pop(0)
        if tensor in seen:
            continue
        seen.add(tensor)
        for node, index in uses.get(tensor, []):
            op = node.op_type
            if index == 0 and (op in _PASS_THROUGH or op in _PASS_THROUGH_ANY_DTYPE):
                pending.extend(node.output)
            elif op in ("Conv", "ConvTranspose"):
                return ("weight", "rows_out", tensor) if index == 1 else ("bias", "", tensor)
            elif op == "Gemm":
                if index == 2:
                    return "bias", "", tensor
                trans = _attr(node, "transB" if index == 1 else "transA", 0)
                # B without transB and A with transA have the reduced (fan-in) axis first.
                rows_in = (index == 1 and not trans) or (index == 0 and trans)
                return "weight", "rows_in" if rows_in else "rows_out", tensor
            elif op == "MatMul":
                return "weight", "matmul", tensor
            elif op == "BatchNormalization" and index in _BN_ROLES:
                return _BN_ROLES[index], "", tensor
            elif op == "Mul":
                return "scale", "", tensor
            elif op in ("Add", "Sum", "Sub"):
                return "bias", "", tensor
            else:
                return "other", op, tensor
    return "unused", "", name


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Shapes from ONNX shape inference (unknown dimensions are None); {} if it fails."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is only a refinement; callers fall back to other shapes
        return {}
    graph = inferred.graph
    shapes: dict[str, tuple[int | None, ...]] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor_type = value.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[value.name] = tuple(
                d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim
            )
    return shapes


def _fan_in(shape: Sequence[int], rule: str) -> int:
    if rule == "rows_in" and len(shape) >= 1:
        fan = shape[0]
    elif rule == "matmul" and len(shape) >= 2:
        fan = shape[-2]
    else:
        fan = math.prod(shape[1:])
    return max(int(fan), 1)


def _random_tensor(
    rng: np.random.Generator, shape: Sequence[int], dtype: np.dtype, role: str, fan_in: int
) -> np.ndarray:
    if role == "weight":
        # Draw in float32 unless the weight is float64: vgg19's fc6 has 103M values.
        draw = np.float64 if dtype == np.float64 else np.float32
        values = rng.standard_normal(shape, dtype=draw) * draw(math.sqrt(2.0 / fan_in))
    elif role in ("scale", "var"):
        values = rng.uniform(0.8, 1.2, size=shape)
    else:  # bias, mean, other
        values = rng.uniform(-0.1, 0.1, size=shape)
    return np.asarray(values).astype(dtype)


def _fill_dtype(node: onnx.NodeProto) -> int:
    for attribute in node.attribute:
        if attribute.name == "value":
            return attribute.t.data_type
    return TensorProto.FLOAT  # the ConstantOfShape default


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Return a copy of ``model`` whose weights are seeded random initializers (see module doc).

    Weights are the outputs of ``ConstantOfShape`` nodes whose shape is an initializer, and
    floating-point initializers. Their random values are drawn in graph order.
    """
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    uses = _consumers(graph)

    # name -> (shape, ONNX dtype), in the order the graph mentions them.
    weights: dict[str, tuple[tuple[int, ...], int]] = {}
    dropped_nodes: set[int] = set()
    for position, node in enumerate(graph.node):
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in initializers:
            shape = numpy_helper.to_array(initializers[node.input[0]])
            weights[node.output[0]] = (tuple(int(d) for d in shape), _fill_dtype(node))
            dropped_nodes.add(position)
    for tensor in graph.initializer:
        if tensor.data_type in _FLOAT_TYPES:
            weights[tensor.name] = (tuple(tensor.dims), tensor.data_type)

    nodes = [node for position, node in enumerate(graph.node) if position not in dropped_nodes]
    used = {tensor for node in nodes for tensor in node.input if tensor}
    used.update(output.name for output in graph.output)

    shapes = _inferred_shapes(model)
    rng = np.random.default_rng(seed)
    new_initializers: list[TensorProto] = []
    for name, (shape, data_type) in weights.items():
        if name not in used:
            continue
        role, rule, view = _role(name, uses)
        # The op may read a reshaped view (inception_v1 reshapes a 4-D FC weight to 2-D).
        view_shape = shapes.get(view)
        if not view_shape or None in view_shape or math.prod(view_shape) != math.prod(shape):
            view_shape = shape
        dtype = helper.tensor_dtype_to_np_dtype(data_type)
        values = _random_tensor(rng, shape, dtype, role, _fan_in(view_shape, rule))
        new_initializers.append(numpy_helper.from_array(values, name))
    for tensor in graph.initializer:
        if tensor.name not in weights and tensor.name in used:
            new_initializers.append(tensor)  # integer constants such as Reshape shapes

    constant_names = {tensor.name for tensor in new_initializers}
    gone = (set(weights) | set(initializers)) - constant_names
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = max(model.ir_version, 4)
    new_graph = out.graph
    del new_graph.node[:]
    new_graph.node.extend(nodes)
    del new_graph.initializer[:]
    new_graph.initializer.extend(new_initializers)
    inputs = [value for value in graph.input if value.name not in constant_names | gone]
    del new_graph.input[:]
    new_graph.input.extend(inputs)
    value_info = [value for value in graph.value_info if value.name not in gone | constant_names]
    del new_graph.value_info[:]
    new_graph.value_info.extend(value_info)
    return out


def calibrate_batchnorm(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Set each BatchNormalization's running mean and variance to its input's statistics.

    The statistics are measured for one ``default_rng((seed, 1))`` N(0, 1) input in a single
    onnxruntime run of a rewritten copy of the graph, in which every batch norm normalizes with
    the mean and variance of its own input. A batch norm whose mean or variance is not an
    initializer of its own, or whose input rank is unknown, keeps its values. Returns a copy.
    The probe uses the attribute forms of ReduceMean and Unsqueeze, hence opset < 13 (the
    light models are opset 9).
    """
    import onnxruntime as ort  # only needed when the model has batch norms

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= 13:
        raise ValueError(f"calibrate_batchnorm handles opset < 13 only, not {opset}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    uses = _consumers(graph)
    ranks = {name: len(shape) for name, shape in _inferred_shapes(model).items()}

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.node[:]
    stats: dict[str, tuple[str, str]] = {}  # name prefix -> (mean initializer, var initializer)
    for position, node in enumerate(graph.node):
        rank = ranks.get(node.input[0], 0) if node.op_type == "BatchNormalization" else 0
        own_stats = node.op_type == "BatchNormalization" and all(
            name in initializers and len(uses[name]) == 1 for name in node.input[3:5]
        )
        if not own_stats or rank < 2 or len(node.output) != 1:
            probe.graph.node.append(node)
            continue
        x, scale, bias = node.input[:3]
        dtype = helper.tensor_dtype_to_np_dtype(initializers[node.input[3]].data_type)
        eps = np.array(_attr(node, "epsilon", 1e-5, float), dtype=dtype)
        p = f"__calib{position}_"
        axes = [0, *range(2, rank)]
        channel_axes = list(range(1, rank - 1))
        probe.graph.initializer.append(numpy_helper.from_array(eps, p + "eps"))
        probe.graph.node.extend(
            [
                helper.make_node("ReduceMean", [x], [p + "mean"], axes=axes, keepdims=1),
                helper.make_node("Sub", [x, p + "mean"], [p + "centered"]),
                helper.make_node("Mul", [p + "centered", p + "centered"], [p + "square"]),
                helper.make_node("ReduceMean", [p + "square"], [p + "var"], axes=axes, keepdims=1),
                helper.make_node("Add", [p + "var", p + "eps"], [p + "var_eps"]),
                helper.make_node("Sqrt", [p + "var_eps"], [p + "std"]),
                helper.make_node("Div", [p + "centered", p + "std"], [p + "normed"]),
                helper.make_node("Unsqueeze", [scale], [p + "scale"], axes=channel_axes),
                helper.make_node("Unsqueeze", [bias], [p + "bias"], axes=channel_axes),
                helper.make_node("Mul", [p + "normed", p + "scale"], [p + "scaled"]),
                helper.make_node("Add", [p + "scaled", p + "bias"], [node.output[0]]),
            ]
        )
        for stat in ("mean", "var"):
            probe.graph.output.append(helper.make_empty_tensor_value_info(p + stat))
        stats[p] = (node.input[3], node.input[4])
    if not stats:
        return out

    replaced = {name for pair in stats.values() for name in pair}
    kept = [tensor for tensor in probe.graph.initializer if tensor.name not in replaced]
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        probe.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (data,) = session.get_inputs()
    shape = [d if isinstance(d, int) else 1 for d in data.shape]
    feed = np.random.default_rng((seed, 1)).standard_normal(shape).astype(np.float32)
    names = [p + stat for p in stats for stat in ("mean", "var")]
    results = dict(zip(names, session.run(names, {data.name: feed}), strict=True))
    for p, (mean_name, var_name) in stats.items():
        for stat, name in (("mean", mean_name), ("var", var_name)):
            old = initializers[name]
            values = results[p + stat].reshape(tuple(old.dims))
            dtype = helper.tensor_dtype_to_np_dtype(old.data_type)
            old.CopyFrom(numpy_helper.from_array(values.astype(dtype), name))
    return out


def randomized_light_model(name: str, seed: int = 0, calibrate: bool = True) -> onnx.ModelProto:
    """Load ``light_<name>.onnx`` from the onnx package and give it seeded random weights.

    With ``calibrate`` the batch-norm running statistics are then measured (see the
    module docstring); it needs onnxruntime and only matters for models with batch norms.
    """
    model = onnx.load_model(light_source_path(name))
    out = randomize_weights(model, seed)
    if calibrate and any(node.op_type == "BatchNormalization" for node in out.graph.node):
        out = calibrate_batchnorm(out, seed)
    out.doc_string = f"{light_source_path(name).name} from onnx {onnx.__version__}, seed {seed}"
    onnx.checker.check_model(out)
    return out


def light_model_path(name: str, seed: int = 0, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the randomized model, written once to ``<cache_dir>/light_<short>_s<seed>.onnx``.

    ``cache_dir`` defaults to ``models/.cache``. An existing file is reused as is; the file is
    written to a temporary name in the same folder and then renamed, so readers never see a
    partial file.
    """
    folder = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    path = folder / f"light_{short_name(name)}_s{seed}.onnx"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    data = randomized_light_model(name, seed).SerializeToString()
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        os.chmod(temporary, 0o644)  # mkstemp creates 0600 files
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def check_model_file(path: Path, seed: int = 0) -> str:
    """Run onnx.checker and onnxruntime on a random input; return a one-line summary.

    Raises ``AssertionError`` if the output is constant or not finite.
    """
    import onnxruntime as ort  # only needed for the check

    onnx.checker.check_model(str(path), full_check=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (data,) = session.get_inputs()
    shape = [d if isinstance(d, int) else 1 for d in data.shape]
    feed = np.random.default_rng(seed + 1).standard_normal(shape).astype(np.float32)
    (result,) = session.run(None, {data.name: feed})
    std = float(np.std(result))
    assert np.all(np.isfinite(result)), f"{path.name}: output is not finite"
    assert std > 0, f"{path.name}: output is constant"
    return (
        f"checker ok; input {data.name} {shape}; output {list(result.shape)} "
        f"std={std:.3g} max={float(np.max(result)):.3g}"
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="light model names (see --list)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--force", action="store_true", help="rewrite an existing cached file")
    parser.add_argument("--check", action="store_true", help="run onnx.checker and onnxruntime")
    parser.add_argument("--list", action="store_true", help="print the known names and exit")
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.list:
        for short, file_name in LIGHT_MODELS.items():
            print(f"{short:14s} light_{file_name}.onnx")
        return 0
    if not args.names:
        parser.error("give at least one model name (see --list)")
    for name in args.names:
        if args.force:
            folder = args.cache_dir if args.cache_dir is not None else DEFAULT_CACHE_DIR
            (Path(folder) / f"light_{short_name(name)}_s{args.seed}.onnx").unlink(missing_ok=True)
        path = light_model_path(name, args.seed, args.cache_dir)
        print(path)
        if args.check:
            print(f"  {check_model_file(path, args.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
