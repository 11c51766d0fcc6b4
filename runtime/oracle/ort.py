"""The oracle: onnxruntime on the same inputs the machine gets; input synthesis, loading, saving.

Synthesis (`synthesize_inputs`, seeded, one numpy Generator drawn in graph-input order). Each
input gets the first rule that applies (`input_rules` says which, for the report):

1. **gather indices**: an input that reaches the indices operand of a Gather or
   GatherElements directly or through index-preserving ops (Cast, Unsqueeze, Squeeze,
   Reshape, Flatten, Identity, Expand, Transpose) is drawn uniformly from [0, N), N the size
   of the gathered table along the gather axis (the smallest N when several gathers read it).
   Token ids, position ids and embedding lookups then stay in range.
2. **one-hot codes**: an integer input compared by Equal with a constant of more than two
   distinct integers (the one-hot idiom `x[..., None] == arange(N)` that tf2onnx and jax2tf
   write; magika's byte values against 0..256) is drawn uniformly from the constant's range,
   so every code is hit as real data would (a {0, 1} draw makes one-hot rows constant and a
   LayerNorm over them divides by the rounding noise of a zero variance).
3. **attention mask**: an input whose name contains "mask" (not "masked", so
   masked_lm_positions is not one), or that reaches mask arithmetic through those same ops —
   the `1 − mask` Sub, the condition of a Where, Not, And/Or, Equal with a constant, or a Mul
   by a constant of magnitude ≥ 1e4 (mask·−10000) — is drawn from {0, 1} in its dtype, and
   the first position of every row (last axis) is 1, so no query row is masked out entirely
   (a fully masked row is NaN or uniform depending on the implementation, not a bug).
4. otherwise by dtype: standard normal for floats (drawn in fp32, then rounded to the input's
   dtype), integers in [0, 8) for integer inputs, fair coins for bool.

Loading (`load_inputs`): an .npz file keyed by input name, or an ONNX test-data folder —
`test_data_set_N/` with `input_K.pb` TensorProtos (matched by the tensor's name when it names a
graph input, else by K in graph-input order); a model folder holding several data sets uses
test_data_set_0, and a folder without input files is the empty feed of a model without graph
inputs. Arrays may hold the ml_dtypes types of ONNX tensors (bfloat16, float8, int4, ...).
Saving (`save_arrays`): .npz when the path ends in .npz, else such a folder.

onnxruntime runs the original model on the CPU with graph optimisations off, so every node
computes exactly what the ONNX spec says rather than a fused rewrite of it; a MatMulInteger
runs in an exact form of its own (`exact_integers`), since onnxruntime's kernel saturates on
some CPUs. Inputs and outputs its Python API cannot exchange (those ml_dtypes types) cross it
in a carrier type (`ort_carrier`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from onnx2bir import output_paths
from onnx2bir.errors import OracleError, UserError
from onnx2bir.graph import Graph
from onnx2bir.runtime.oracle import exact_integers, input_files, ort_carrier

INTEGER_INPUT_HIGH = 8  # integer inputs are drawn from [0, 8)
GRAPH_OPTIMIZATION_LEVEL = "ORT_DISABLE_ALL"
# Ops an index or a mask passes through unchanged in value.
_TRANSPARENT = {
    "Cast",
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Flatten",
    "Identity",
    "Expand",
    "Transpose",
}
_MASK_NAME = re.compile(r"mask(?!ed)", re.IGNORECASE)
_MASK_SCALE = 1e4


def _reached_uses(graph: Graph, tensor: str):
    """(node data, input index) of every non-transparent use reached from `tensor`."""
    seen, stack = set(), [tensor]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for node, index in graph.consumers(name):
            data = graph.node(node)
            if data["op_type"] in _TRANSPARENT and index == 0:
                stack.extend(out for out in data["outputs"] if out)
            else:
                yield data, index


def gather_bound(graph: Graph, tensor: str) -> tuple[int, str] | None:
    """(N, the gather node) when `tensor` feeds gather indices; N the smallest table size."""
    best = None
    for data, index in _reached_uses(graph, tensor):
        if data["op_type"] not in ("Gather", "GatherElements") or index != 1:
            continue
        table = graph.tensors.get(data["inputs"][0])
        if table is None or not table.shape:
            continue
        axis = data["attrs"].get("axis", 0) % len(table.shape)
        size = int(table.shape[axis])
        if size > 0 and (best is None or size < best[0]):
            best = (size, data["name"])
    return best


def _const_equals(
    graph: Graph, tensor: str, value: float | None = None, min_magnitude: float | None = None
) -> bool:
    info = graph.tensors.get(tensor)
    if info is None or not info.is_const or info.const.size == 0:
        return False
    const = np.asarray(info.const).astype(np.float64)
    if value is not None:
        return bool(np.all(const == value))
    return bool(np.all(np.abs(const) >= min_magnitude))


def one_hot_range(graph: Graph, tensor: str) -> tuple[int, int, str] | None:
    """(lowest, highest, the Equal node) when integer `tensor` is compared with a constant of
    more than two distinct integers (module docstring, rule 2); else None."""
    info = graph.tensors.get(tensor)
    if info is None or info.dtype.is_float or info.dtype.numpy == np.bool_:
        return None
    for data, index in _reached_uses(graph, tensor):
        if data["op_type"] != "Equal":
            continue
        other = graph.tensors.get(data["inputs"][1 - index]) if len(data["inputs"]) == 2 else None
        if other is None or not other.is_const:
            continue
        codes = np.unique(np.asarray(other.const))
        if codes.size > 2 and codes.dtype.kind in "iu":
            return int(codes[0]), int(codes[-1]), data["name"]
    return None


def mask_reason(graph: Graph, tensor: str) -> str | None:
    """Why `tensor` is treated as an attention mask, or None."""
    if _MASK_NAME.search(tensor):
        return "name contains 'mask'"
    for data, index in _reached_uses(graph, tensor):
        op, inputs = data["op_type"], data["inputs"]
        other = [t for i, t in enumerate(inputs) if i != index and t]
        if op == "Sub" and index == 1 and _const_equals(graph, inputs[0], 1.0):
            return f"1 - x in {data['name']}"
        if op == "Where" and index == 0:
            return f"condition of {data['name']}"
        if op in ("Not", "And", "Or"):
            return f"{op} {data['name']}"
        if op == "Equal" and any(
            graph.tensors.get(t) is not None and graph.tensors[t].is_const for t in other
        ):
            return f"Equal with a constant in {data['name']}"
        if op == "Mul" and any(_const_equals(graph, t, min_magnitude=_MASK_SCALE) for t in other):
            return f"scaled by a large constant in {data['name']}"
    return None


def input_rules(graph: Graph) -> dict[str, str]:
    """The synthesis rule of every graph input (module docstring), for the report."""
    rules = {}
    for name in graph.inputs:
        info = graph.tensors[name]
        bound = gather_bound(graph, name)
        codes = None if bound else one_hot_range(graph, name)
        mask = None if bound or codes else mask_reason(graph, name)
        if bound:
            rules[name] = f"gather indices: integers in [0, {bound[0]}) (table of {bound[1]})"
        elif codes:
            rules[name] = f"one-hot codes: integers in [{codes[0]}, {codes[1]}] ({codes[2]})"
        elif mask:
            rules[name] = f"attention mask: {{0, 1}}, first of each row 1 ({mask})"
        elif info.dtype.is_float:
            rules[name] = "standard normal"
        elif info.dtype.numpy == np.bool_:
            rules[name] = "fair coin"
        else:
            rules[name] = f"integers in [0, {INTEGER_INPUT_HIGH})"
    return rules


def synthesize_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random values for every graph input (rules in the module docstring)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        info = graph.tensors[name]
        dtype = info.dtype.numpy
        bound = gather_bound(graph, name)
        codes = None if bound else one_hot_range(graph, name)
        if bound:
            value = rng.integers(0, bound[0], info.shape).astype(dtype)
        elif codes:
            value = rng.integers(codes[0], codes[1] + 1, info.shape).astype(dtype)
        elif mask_reason(graph, name):
            value = rng.integers(0, 2, info.shape)
            if value.ndim:
                value[..., 0] = 1
            value = (
                value.astype(np.float32).astype(dtype)
                if info.dtype.is_float
                else (value.astype(dtype))
            )
        elif info.dtype.is_float:
            value = rng.standard_normal(info.shape).astype(np.float32).astype(dtype)
        elif dtype == np.bool_:
            value = rng.integers(0, 2, info.shape).astype(np.bool_)
        else:
            value = rng.integers(0, INTEGER_INPUT_HIGH, info.shape).astype(dtype)
        feeds[name] = value
    return feeds


# --- loading and saving --------------------------------------------------------------------
def load_inputs(path: str | Path, graph: Graph) -> dict[str, np.ndarray]:
    """Inputs from an .npz file or a test_data_set folder; every graph input must be there.

    Arrays may hold the ml_dtypes types of ONNX tensors (bfloat16, float8, int4, ...;
    `input_files.ML_DTYPES`); a folder without input files is the empty feed of a model
    without graph inputs."""
    path = input_files.check_inputs_source(path)
    if path.is_dir():
        feeds = _read_test_data_set(path, graph)
    else:
        feeds = input_files.read_npz(
            path,
            {name: graph.tensors[name].shape for name in graph.inputs},
            {name: graph.tensors[name].dtype.numpy for name in graph.inputs},
        )
    missing = [name for name in graph.inputs if name not in feeds]
    if missing:
        raise UserError(f"{path}: no array for input(s) {', '.join(missing)}")
    result = {}
    for name in graph.inputs:
        info = graph.tensors[name]
        value = np.asarray(feeds[name])
        input_files.check_array(str(path), name, value.dtype)
        if tuple(value.shape) != tuple(info.shape):
            raise UserError(
                f"{path}: input {name!r} has shape {tuple(value.shape)}, the model "
                f"expects {tuple(info.shape)}"
            )
        want = info.dtype.numpy
        if value.dtype != want and input_files.is_float(value.dtype) and want.kind in "iub":
            raise UserError(
                f"{path}: input {name!r} is {value.dtype}, the model expects "
                f"{want}; refusing to truncate floats to integers"
            )
        result[name] = value.astype(want)
    return result


def load_reference(path: str | Path, graph: Graph) -> dict[str, np.ndarray]:
    """Outputs the user supplies (`validate --reference`): an .npz keyed by output name, or a
    test_data_set folder's output_K.pb (matched by name, else by K in graph-output order).
    Every graph output must be there, in its shape; floats are read as the output's dtype.
    Arrays may hold the ml_dtypes types of ONNX tensors, as `load_inputs`'s may."""
    path = input_files.check_inputs_source(path)
    if path.is_dir():
        files = _numbered(path, "output")
        if not files:
            sets = sorted(path.glob("test_data_set_*"), key=lambda p: _index(p.name))
            files = _numbered(sets[0], "output") if sets else []
        if not files:
            raise UserError(f"--reference {path}: no output_*.pb files (a test_data_set folder)")
        arrays: dict[str, np.ndarray] = {}
        for position, file in enumerate(files):
            name, value = _read_tensor_file(file)
            if name in graph.outputs:
                arrays[name] = value
            elif position < len(graph.outputs):
                arrays.setdefault(graph.outputs[position], value)
    else:
        arrays = input_files.read_npz(
            path,
            {name: graph.tensors[name].shape for name in graph.outputs},
            {name: graph.tensors[name].dtype.numpy for name in graph.outputs},
            role="output",
        )
    missing = [name for name in graph.outputs if name not in arrays]
    if missing:
        raise UserError(f"--reference {path}: no array for output(s) {', '.join(missing)}")
    result = {}
    for name in graph.outputs:
        info = graph.tensors[name]
        value = np.asarray(arrays[name])
        if tuple(value.shape) != tuple(info.shape):
            raise UserError(
                f"--reference {path}: output {name!r} has shape {tuple(value.shape)}, the model "
                f"gives {tuple(info.shape)}"
            )
        if not input_files.is_numeric(value.dtype):
            raise UserError(f"--reference {path}: output {name!r} is not numeric ({value.dtype})")
        result[name] = value.astype(info.dtype.numpy)
    return result


def _read_tensor_file(file: Path) -> tuple[str, np.ndarray]:
    """In: an input_K.pb / output_K.pb file. Out: (the tensor's name, its array; an ml_dtypes
    array for bfloat16, float8, int4, ...). A file that is not a TensorProto is bad input."""
    tensor = onnx.TensorProto()
    input_files.check_regular_file(file)
    try:
        tensor.ParseFromString(file.read_bytes())
        value = numpy_helper.to_array(tensor)
    except Exception as exc:
        raise UserError(f"{file}: not a readable TensorProto ({type(exc).__name__})") from exc
    return tensor.name, value


def _read_test_data_set(folder: Path, graph: Graph) -> dict[str, np.ndarray]:
    """The input_K.pb arrays of `folder` (or of its first test_data_set_N) by graph-input
    name: by the tensor's name when it names an input, else by K. A folder without input
    files is the empty feed of a model without graph inputs (onnx's test_constant)."""
    files = _numbered(folder, "input")
    if not files:
        sets = sorted(folder.glob("test_data_set_*"), key=lambda p: _index(p.name))
        if sets:
            folder, files = sets[0], _numbered(sets[0], "input")
    if not files and not graph.inputs:
        return {}
    if not files:
        raise UserError(f"{folder}: no input_*.pb files (an ONNX test_data_set folder)")
    feeds = {}
    for position, file in enumerate(files):
        name, value = _read_tensor_file(file)
        if name and name in graph.inputs:
            feeds[name] = value
        elif position < len(graph.inputs):
            feeds.setdefault(graph.inputs[position], value)
    return feeds


def _index(name: str) -> int:
    match = re.search(r"(\d+)(\.pb)?$", name)
    return int(match.group(1)) if match else 1 << 30


def _numbered(folder: Path, stem: str) -> list[Path]:
    return sorted(folder.glob(f"{stem}_*.pb"), key=lambda p: _index(p.name))


_TEST_DATA_FILE = re.compile(r"(input|output)_\d+\.pb")


def check_arrays_target(path: str | Path, stem: str) -> Path:
    """Refuse, before any work, a `save_arrays` target that cannot be written."""
    flag = f"--save-{stem}s"
    if str(path).endswith(".npz"):
        return output_paths.check_file(path, flag)
    folder = output_paths.check_folder(path, flag)
    if folder.is_dir():
        # A test_data_set folder holds only input_K.pb / output_K.pb: writing arrays into any
        # other folder (one of models, say) would scatter them among unrelated files.
        others = sorted(
            item.name for item in folder.iterdir() if not _TEST_DATA_FILE.fullmatch(item.name)
        )
        if others:
            raise UserError(
                f"{flag} {folder}: the folder holds other files ({', '.join(others[:3])}"
                f"{', ...' if len(others) > 3 else ''}), not a test_data_set; name a new "
                "folder or a .npz file"
            )
        for old in folder.glob(f"{stem}_*.pb"):  # the files it replaces must be regular
            output_paths.check_file(old, flag)
    return folder


def save_arrays(path: str | Path, arrays: dict[str, np.ndarray], stem: str) -> Path:
    """Write arrays atomically: .npz when `path` ends in .npz, else a test_data_set folder
    of `{stem}_K.pb` TensorProtos named after the arrays (`onnx2bir.output_paths` rules)."""
    path = check_arrays_target(path, stem)
    if path.suffix == ".npz":

        def write(staged: Path) -> None:
            with open(staged, "wb") as handle:
                np.savez(handle, **arrays)

        return output_paths.replace_file(path, write)
    stale = _numbered(path, stem) if path.is_dir() else []
    with output_paths.stage_folder(path) as staging:
        for index, (name, value) in enumerate(arrays.items()):
            tensor = numpy_helper.from_array(np.asarray(value), name)
            (staging / f"{stem}_{index}.pb").write_bytes(tensor.SerializeToString())
        for old in stale:  # a shorter list of arrays leaves no stale file behind
            if old.name not in {item.name for item in staging.iterdir()} and old.is_file():
                old.unlink()
    return path


# --- onnxruntime ---------------------------------------------------------------------------
# Threads of a session's intra-op pool; None: onnxruntime's default (one per core, spinning
# while idle). Processes that share the cores (`validate --segments`) set a share of them,
# without spinning, through `share_cores`.
_THREADS: int | None = None


def share_cores(threads: int) -> None:
    """Sessions made from now on in this process use `threads` threads and do not spin."""
    global _THREADS
    _THREADS = max(1, threads)


def onnxruntime_session(
    model: onnx.ModelProto | bytes | str | Path, external_data: Path | None = None
) -> ort.InferenceSession:
    """A CPU session with graph optimisations off; `model` may be serialised bytes.
    `external_data`: the folder of the external data files of a model given as a proto or
    bytes that was read without them. A model with a MatMulInteger runs it in its exact form
    (`exact_integers`: onnxruntime's own kernel saturates on CPUs without VNNI)."""
    model, folder = exact_integers.prepared(model)
    external_data = external_data or folder
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION_LEVEL)
    options.log_severity_level = 4  # errors come back as exceptions; we report them
    if _THREADS is not None:
        options.intra_op_num_threads = _THREADS
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if external_data is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(external_data)
        )
    if isinstance(model, onnx.ModelProto):
        source = model.SerializeToString()
    else:
        source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def oracle_info() -> dict:
    """What produced the reference values (docs/validation.md#oracle: pin and report the oracle)."""
    return {
        "name": "onnxruntime",
        "version": ort.__version__,
        "provider": "CPUExecutionProvider",
        "graph_optimization_level": GRAPH_OPTIMIZATION_LEVEL,
    }


def run_onnxruntime(
    model: onnx.ModelProto | bytes | str | Path,
    inputs: dict[str, np.ndarray],
    outputs: list[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run `model` on `inputs`; returns the requested (default: all) outputs by name.

    Inputs given shapes other than the static ones the model declares (`--input-shape`) run
    on a copy of the model whose input and output dims are left symbolic. Inputs and outputs
    of the types onnxruntime's Python API cannot exchange (bfloat16, float8, int4, ...) cross
    it in a carrier type (`ort_carrier`); the arrays keep their ml_dtypes types.
    """
    try:
        session = onnxruntime_session(model)
        if _shapes_differ(session, inputs):
            model = _relaxed(model, inputs)
            session = onnxruntime_session(model)
        names = outputs or [out.name for out in session.get_outputs()]
        boundary = ort_carrier.crossing(session, inputs, names)
        if boundary is not None:
            proto, folder = _proto(model)
            adapted = ort_carrier.adapt(proto, boundary)
            session = onnxruntime_session(adapted.model, folder)
            return ort_carrier.run(session, adapted, boundary, inputs, names)
        feeds = {
            value.name: inputs[value.name] for value in session.get_inputs() if value.name in inputs
        }
        results = session.run(names, feeds)
    except OracleError:
        raise
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise OracleError(f"onnxruntime could not run the model: {first_line}") from exc
    return dict(zip(names, results, strict=True))


def _proto(model: onnx.ModelProto | bytes | str | Path) -> tuple[onnx.ModelProto, Path | None]:
    """In: a model as `run_onnxruntime` takes it. Out: a proto that may be changed (a copy of
    one given) and, for a file, its folder: its external data is left on disk for
    onnxruntime to read from there rather than loaded into the proto."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return proto, None
    if isinstance(model, bytes):
        return onnx.load_from_string(model), None
    path = Path(model)
    return onnx.load(str(path), load_external_data=False), path.resolve().parent


def _shapes_differ(session, inputs: dict[str, np.ndarray]) -> bool:
    for value in session.get_inputs():
        declared = value.shape
        given = inputs.get(value.name)
        if given is None or len(declared) != given.ndim:
            continue
        if any(isinstance(d, int) and d != g for d, g in zip(declared, given.shape, strict=True)):
            return True
    return False


def _relaxed(model, inputs: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` with symbolic dims on the given inputs and on every output."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        proto = onnx.load(str(model))
    del proto.graph.value_info[:]
    for value in [*proto.graph.input, *proto.graph.output]:
        if value.name in inputs or value in proto.graph.output:
            for index, dim in enumerate(value.type.tensor_type.shape.dim):
                dim.dim_param = f"{value.name}_d{index}"
    return proto
