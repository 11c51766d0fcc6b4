"""ONNX model → static `Graph`.

In: a path or an `onnx.ModelProto`, optional fixed input shapes (`--input-shape`) and symbol
values (`--dim`). Out: a `Graph` in which every tensor has a static shape and every value
that can be computed at compile time (constants, shape arithmetic: Shape, Gather on shapes,
ConstantOfShape, Range, Concat of shapes, …) is a constant in the tensor table.

The work is done by onnx itself: the checker, shape inference with data propagation, and the
reference evaluator run on one node at a time for folding (`onnx2bir.frontend.folding`, whose
`fold_constants` and `normalize_pool_ceil_mode` are re-exported here). Every failure becomes a
`UserError` with one line that names the file, node or tensor concerned.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from onnx2bir.bir.enums import Dtype
from onnx2bir.errors import CompileError, UserError
from onnx2bir.frontend import (
    contracts,
)
from onnx2bir.frontend import (
    memory_contracts as contracts_memory,
)
from onnx2bir.frontend import (
    node_contracts as contracts_nodes,
)
from onnx2bir.frontend.attributes import attr_value
from onnx2bir.frontend.folding import (
    WEIGHT_ELEMENTS,
    drop_dead_nodes,
    drop_identity_nodes,
    drop_zero_adds,
    fold_constants,
    normalize_pool_ceil_mode,
    static_shapes,
)
from onnx2bir.frontend.function_expansion import expand_functions, expansion_note
from onnx2bir.frontend.input_values import pin_input_values
from onnx2bir.frontend.opset_upgrade import default_opset, upgrade_old_opset
from onnx2bir.frontend.packed_projections import split_packed_projections
from onnx2bir.frontend.sequences import rewrite_static_sequences
from onnx2bir.frontend.symbols import is_unnamed, propagate_symbols, unset_message
from onnx2bir.frontend.view_chains import collapse_view_chains
from onnx2bir.graph import Graph, TensorInfo


def read_model(source: str | Path | onnx.ModelProto, weights: bool = True) -> onnx.ModelProto:
    """Read a model (and its external data, which must live inside the model's folder).

    With `weights=False` the external data is checked but its large tensors are not read:
    each keeps its reference, the location made absolute, so that `external_array` maps it
    and `load_external_weights` reads it wherever a piece of the model travels (the skeleton
    `validate --segments` plans with, docs/validation.md#segments)."""
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        return model
    path = Path(source)
    if not str(source).strip():
        raise UserError("the model path is empty")
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path}: is a folder, not an ONNX model file")
    if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block or never end
        raise UserError(f"{path}: not a regular file")
    if info.st_size == 0:
        raise UserError(f"{path}: the file is empty")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several types for garbage or truncation
        raise UserError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from exc
    if model.ir_version == 0 or not model.HasField("graph"):
        raise UserError(f"{path}: not an ONNX model (no IR version or no graph)")
    contracts.check_text(model, str(path))
    _load_external_data(model, path.parent, path, weights)
    return model


def split_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Move large initializers out of `model` (in place) into arrays; they become typed graph
    inputs of the remaining skeleton.

    The checker and shape inference serialise the whole model, several times; without the
    weights they run in milliseconds instead of seconds on a large CNN, and they only need a
    weight's type and shape. Weights stay constants for everything after the import.
    """
    weights: dict[str, np.ndarray] = {}
    kept = []
    listed = {value.name for value in model.graph.input}
    for init in model.graph.initializer:
        if np.prod(init.dims, dtype=np.int64) < WEIGHT_ELEMENTS:
            kept.append(init)
            continue
        try:
            if external_data_helper.uses_external_data(init):  # a skeleton's: read_model
                weights[init.name] = external_array(init)
            else:
                weights[init.name] = numpy_helper.to_array(init)
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"initializer {init.name!r} cannot be read: {exc}") from exc
        if init.name not in listed:
            model.graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    if weights:
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
    return weights


def check_model(model: onnx.ModelProto, full: bool = False) -> None:
    """The file-level contracts (`onnx2bir.frontend.contracts`), then onnx's checker; `full` adds
    strict shape inference, so contradictions between shapes and types are refused (run once
    the input shapes are fixed and ceil-mode pools agree with onnx's shape formula)."""
    contracts.check_versions(model)
    contracts.check_graph_outputs(model)
    contracts.check_ops(model)
    _fill_output_shapes(model)
    try:
        onnx.checker.check_model(_without_shapeless_outputs(model), full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise UserError(f"the model fails the ONNX checker: {_inference_message(exc)}") from exc


def _without_shapeless_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model, or a copy without the graph outputs declared with no shape that inference
    cannot shape yet (a Reshape to a size computed from the input's shape, before the input
    sizes are fixed and folded): onnx's checker requires an output's shape, onnxruntime does
    not, and the folded model gives every output one."""
    shapeless = {
        out.name
        for out in model.graph.output
        if out.type.HasField("tensor_type") and not out.type.tensor_type.HasField("shape")
    }
    if not shapeless:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [out for out in copy.graph.output if out.name not in shapeless]
    del copy.graph.output[:]
    copy.graph.output.extend(kept)
    return copy


def load_model(source: str | Path | onnx.ModelProto, weights: bool = True) -> onnx.ModelProto:
    """Read and check a model; external data must live inside the model's folder
    (`weights`: as in `read_model`)."""
    model = read_model(source, weights)
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    split_weights(skeleton)
    check_model(skeleton)
    return model


def _fill_output_shapes(model: onnx.ModelProto) -> None:
    """Give graph outputs declared without a shape the shape onnx infers for them.

    onnxruntime runs such models, but onnx's checker rejects a graph output with no shape.
    """
    missing = [
        out
        for out in model.graph.output
        if out.type.HasField("tensor_type") and not out.type.tensor_type.HasField("shape")
    ]
    if not missing:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    shapes = {value.name: value for value in [*inferred.graph.value_info, *inferred.graph.output]}
    for out in missing:
        known = shapes.get(out.name)
        if known is not None and known.type.tensor_type.HasField("shape"):
            out.type.tensor_type.shape.CopyFrom(known.type.tensor_type.shape)
            continue
        try:  # no shape: strict inference says which node contradicts itself
            onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        except Exception as exc:
            raise UserError(f"shape inference failed: {_inference_message(exc)}") from None
        # else its shape depends on values not known yet: left to the folded model


def _inference_message(exc: Exception) -> str:
    """onnx's inference error in one line: the node and the reason, without the prefixes."""
    lines = str(exc).strip().splitlines()  # the checker adds context lines after the first
    text = " ".join(lines[0].split()) if lines else type(exc).__name__
    return text.replace("[ShapeInferenceError] Inference error(s): ", "")


def _load_external_data(model: onnx.ModelProto, base_dir: Path, path: Path, weights: bool) -> None:
    root = base_dir.resolve()
    referenced = []
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        contracts.check_external_fields(tensor, path)
        info = external_data_helper.ExternalDataInfo(tensor)
        target = (base_dir / info.location).resolve()
        if not target.is_relative_to(root):
            raise UserError(
                f"{path}: tensor {tensor.name!r} points to external data {info.location!r} "
                f"outside the model's folder; refusing to read it"
            )
        if not target.is_file():
            raise UserError(
                f"{path}: external data file {info.location!r} of tensor {tensor.name!r} is missing"
            )
        contracts.check_external_data(tensor, target, path)
        referenced.append((tensor, target))
    if not weights:
        initializers = model.graph.initializer
        large = {init.name for init in initializers if _elements(init) >= WEIGHT_ELEMENTS}
        for tensor, target in referenced:
            _set_location(tensor, str(target))
            if tensor.name not in large:  # small ones are read now: shapes and constants
                _read_external(tensor)
        return
    try:
        external_data_helper.load_external_data_for_model(model, str(base_dir))
    except Exception as exc:
        raise UserError(f"{path}: could not read external data ({exc})") from exc


def _elements(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims, dtype=np.int64))


def _set_location(tensor: onnx.TensorProto, location: str) -> None:
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location


def _external_span(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    info = external_data_helper.ExternalDataInfo(tensor)
    length = info.length if info.length else None
    return info.location, int(info.offset or 0), length


def _read_external(tensor: onnx.TensorProto) -> None:
    """Read one tensor's external bytes (its location absolute, as `read_model(...,
    weights=False)` leaves it) into the tensor itself."""
    location, offset, length = _external_span(tensor)
    try:
        with open(location, "rb") as data:
            data.seek(offset)
            raw = data.read(-1 if length is None else length)
    except OSError as exc:
        raise UserError(f"tensor {tensor.name!r}: cannot read its external data ({exc})") from exc
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = raw


def load_external_weights(model: onnx.ModelProto) -> int:
    """Read the external data of every initializer of `model` that still refers to it (a
    skeleton's piece: only its own weights); returns the bytes read."""
    read = 0
    for tensor in model.graph.initializer:
        if external_data_helper.uses_external_data(tensor):
            _read_external(tensor)
            read += len(tensor.raw_data)
    return read


def external_array(tensor: onnx.TensorProto) -> np.ndarray:
    """A read-only array of an initializer still in its external-data file: memory-mapped
    when its elements are whole bytes (float32, bfloat16, int8, ...), else read (int4)."""
    location, offset, length = _external_span(tensor)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    shape = tuple(int(d) for d in tensor.dims)
    if length is None or length == _elements(tensor) * dtype.itemsize:
        try:
            return np.memmap(location, dtype=dtype, mode="r", offset=offset, shape=shape)
        except (OSError, ValueError) as exc:
            message = f"tensor {tensor.name!r}: cannot map its external data ({exc})"
            raise UserError(message) from exc
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    _read_external(copy)
    return numpy_helper.to_array(copy)


@dataclass
class Imported:
    """The import's results: the folded ONNX skeleton (large weights as typed inputs), the
    weights held aside, and the graph built from them."""

    folded: onnx.ModelProto
    weights: dict[str, np.ndarray]
    graph: Graph
    # Inputs fixed by --input-value, by name: onnxruntime, running the original model, is fed
    # them beside the program's inputs.
    pinned: dict[str, np.ndarray] = field(default_factory=dict)


def import_parts(
    source: str | Path | onnx.ModelProto,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    dims: dict[str, int] | None = None,
    input_values: dict[str, object] | None = None,
) -> Imported:
    """Load, check, fix input values and symbolic dimensions, fold compile-time values, build
    the Graph; keep the folded skeleton and the weights for tools that run onnxruntime on the
    same values."""
    model = read_model(source)
    name_nodes(model.graph)
    accept_ir3_initializers(model)
    source_opset = default_opset(model)
    model, upgrade_note = upgrade_old_opset(model)
    initializers = {init.name for init in model.graph.initializer}
    weights = split_weights(model)
    check_model(model)
    declared = strip_declared_outputs(model)
    pinned = pin_input_values(
        model, input_values or {}, runtime_inputs(model, weights), input_shapes
    )
    model = fix_input_shapes(model, input_shapes or {}, dims or {}, weights)
    sequences = rewrite_static_sequences(model)
    expansion = expansion_note(expand_functions(model))
    model = normalize_pool_ceil_mode(model)
    check_model(model, full=True)
    refuse_unsupported_types(model)
    model = fold_constants(model, weights)  # large folded values join `weights`
    check_folded(model, weights)
    model = drop_dead_nodes(drop_zero_adds(model, weights))
    model = split_packed_projections(model, weights)
    model = drop_identity_nodes(collapse_view_chains(model))
    shapes = static_shapes(model)
    notes = [note for note in (upgrade_note, sequences, expansion) if note]
    notes += declared_output_notes(declared, shapes)
    restore_declared_outputs(model, declared, shapes)
    graph = build_graph(model, _model_name(source, model), weights)
    graph.parameters = frozenset(name for name in initializers if name in graph.tensors)
    graph.pinned_inputs = pinned
    graph.import_notes = tuple(notes)
    graph.upgraded_from = source_opset if upgrade_note else None
    graph.import_rewrites = tuple(
        kind
        for kind, note in (("static sequences", sequences), ("function bodies", expansion))
        if note
    )
    return Imported(model, weights, graph, pinned)


def accept_ir3_initializers(model: onnx.ModelProto) -> None:
    """An IR-3 model whose initializers are not all graph inputs: the checker refuses it (IR
    3 reads an initializer only as an input's default), onnxruntime runs it as IR 4 would,
    with the initializers as constants. Read the same way (in place)."""
    listed = {value.name for value in model.graph.input}
    if model.ir_version < 4 and any(i.name not in listed for i in model.graph.initializer):
        model.ir_version = 4


def strip_declared_outputs(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Remove the graph outputs' declared shapes (in place), keeping their types; return them
    by output name (None for an unknown dim: a symbol, or -1).

    onnxruntime warns about a declared output shape that contradicts the computed one and
    runs; onnx's strict inference refuses it. Exporters get these wrong (torch 1.9 declares a
    rank-2 output that a Reshape makes rank 3; paddle2onnx writes -1 for unknown sizes), and
    whether they contradict is often known only once the input sizes are fixed and folded:
    `declared_output_notes` compares them then."""
    declared = {}
    produced = {name for node in model.graph.node for name in node.output}
    for out in model.graph.output:
        tensor_type = out.type.tensor_type
        if out.name not in produced:  # a graph input or weight published as an output
            continue
        if out.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            declared[out.name] = [
                d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None
                for d in tensor_type.shape.dim
            ]
            tensor_type.ClearField("shape")
    return declared


def declared_output_notes(
    declared: dict[str, list[int | None]], shapes: dict[str, tuple[int, ...]]
) -> list[str]:
    """A sentence per graph output whose declared shape contradicts its computed one (another
    rank, another fixed size): the computed shape is the one used."""
    notes = []
    for name, mine in declared.items():
        theirs = shapes.get(name)
        if theirs is None:
            continue
        if len(theirs) != len(mine) or any(
            a is not None and a != b for a, b in zip(mine, theirs, strict=True)
        ):
            notes.append(
                f"graph output {name!r} is declared {_dims_text(mine)} but computed as "
                f"{_dims_text(list(theirs))}; the computed shape is used, as onnxruntime does"
            )
    return notes


def restore_declared_outputs(
    model: onnx.ModelProto,
    declared: dict[str, list[int | None]],
    shapes: dict[str, tuple[int, ...]],
) -> None:
    """Give back its declared shape (in place) to each graph output that inference leaves
    without a static one (a Loop's scan outputs) and that the model declares fully static."""
    for out in model.graph.output:
        mine = declared.get(out.name)
        if out.name in shapes or mine is None or None in mine:
            continue
        dims = out.type.tensor_type.shape.dim
        del dims[:]
        for size in mine:
            dims.add().dim_value = size


def _dims_text(dims: list) -> str:
    if not dims:
        return "a scalar"
    return "x".join("?" if d is None else str(d) for d in dims)


def name_nodes(graph: onnx.GraphProto) -> None:
    """Name every unnamed top-level node `<op type>_<index>`, its index in the file (in
    place), so messages and reports point at the node as the user's file numbers it."""
    used = {node.name for node in graph.node if node.name}
    for index, node in enumerate(graph.node):
        if not node.name:
            node.name = _unique_name(node, index, used)


def check_folded(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> None:
    """The contracts that need static shapes: node attributes and constant indices
    (`onnx2bir.frontend.node_contracts`), every tensor's bytes
    (`onnx2bir.frontend.memory_contracts`)."""
    shapes = static_shapes(model)
    shapes.update({name: tuple(value.shape) for name, value in weights.items()})
    contracts_nodes.check_nodes(model, shapes, weights)
    contracts_memory.check_tensor_sizes(contracts_memory.tensor_bytes(model, shapes, weights))


def import_model(
    source: str | Path | onnx.ModelProto,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    dims: dict[str, int] | None = None,
    input_values: dict[str, object] | None = None,
) -> Graph:
    """The Graph of a model (see `import_parts`)."""
    return import_parts(source, input_shapes, dims, input_values).graph


def _model_name(source, model: onnx.ModelProto) -> str:
    if isinstance(source, (str, Path)):
        return Path(source).name.removesuffix(".onnx")
    return model.graph.name or "model"


def runtime_inputs(model: onnx.ModelProto, weights=()) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are fed at run time (not initializers, not weights held aside)."""
    constants = {init.name for init in model.graph.initializer} | set(weights)
    return [value for value in model.graph.input if value.name not in constants]


def _declared_static(value: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """The input's declared shape when every dim is a number, else None."""
    dims = value.type.tensor_type.shape.dim
    if all(dim.HasField("dim_value") for dim in dims):
        return tuple(dim.dim_value for dim in dims)
    return None


def fix_input_shapes(
    model: onnx.ModelProto,
    input_shapes: dict[str, tuple[int, ...]],
    dims: dict[str, int],
    weights=(),
) -> onnx.ModelProto:
    """Return a copy of `model` whose runtime inputs all have static shapes."""
    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    inputs = runtime_inputs(model_copy, weights)
    names = [value.name for value in inputs]
    unknown = sorted(set(input_shapes) - set(names))
    if unknown:
        raise UserError(
            f"--input-shape names {', '.join(unknown)}, but the model's inputs are: "
            f"{', '.join(names)}"
        )
    symbols = {
        dim.dim_param
        for value in inputs
        for dim in value.type.tensor_type.shape.dim
        if dim.HasField("dim_param") and not is_unnamed(dim.dim_param)
    }
    strays = sorted(set(dims) - symbols)
    if strays:
        raise UserError(
            f"--dim {', '.join(strays)}: the model's inputs have no symbolic dimension of that "
            f"name (their symbols: {', '.join(sorted(symbols)) or 'none'})"
        )
    dims = propagate_symbols(inputs, input_shapes, dims)
    if any(
        _declared_static(value) not in (None, tuple(input_shapes[value.name]))
        for value in inputs
        if value.name in input_shapes
    ):
        # Shapes recorded for the old input shapes would contradict the new ones: let shape
        # inference recompute them (graph outputs keep their rank, not their sizes).
        del model_copy.graph.value_info[:]
        for out in model_copy.graph.output:
            for index, dim in enumerate(out.type.tensor_type.shape.dim):
                dim.dim_param = f"{out.name}_d{index}"
    unset: dict[str, list[str]] = {}  # symbol (or "" for an unnamed dim) → where it is used
    for value in inputs:
        shape = value.type.tensor_type.shape
        if value.name in input_shapes:
            wanted = input_shapes[value.name]
            del shape.dim[:]
            for size in wanted:
                shape.dim.add().dim_value = size
            continue
        for index, dim in enumerate(shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            symbol = dim.dim_param if dim.HasField("dim_param") else ""
            symbol = "" if is_unnamed(symbol) else symbol
            if symbol and symbol in dims:
                dim.dim_value = dims[symbol]
                continue
            key = symbol or f"{value.name}:{index}"
            unset.setdefault(key, []).append(f"input '{value.name}' dim {index}")
    if unset:
        raise UserError(unset_message(unset))
    return model_copy


def _opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 1


def build_graph(
    model: onnx.ModelProto, name: str, weights: dict[str, np.ndarray] | None = None
) -> Graph:
    """Turn a folded, fully shaped model (and the weights held aside) into a Graph."""
    onnx_graph = model.graph
    shapes = static_shapes(model)
    dtypes = _dtypes(model)
    weights = weights or {}
    tensors: dict[str, TensorInfo] = {
        tensor: TensorInfo(tensor, value.shape, _dtype(tensor, value.dtype), value)
        for tensor, value in weights.items()
    }
    for init in onnx_graph.initializer:
        value = numpy_helper.to_array(init)
        tensors[init.name] = TensorInfo(
            init.name, value.shape, _dtype(init.name, value.dtype), value
        )
    graph = Graph(
        name=name,
        nx=nx.MultiDiGraph(),
        tensors=tensors,
        inputs=[value.name for value in runtime_inputs(model, weights)],
        outputs=[value.name for value in onnx_graph.output],
        opset=_opset(model),
    )
    used_names: set[str] = set()
    consumed = {name for node in onnx_graph.node for name in node.input}
    consumed.update(_subgraph_reads(onnx_graph))  # a Loop body reads enclosing tensors by name
    consumed.update(graph.outputs)
    for index, node in enumerate(onnx_graph.node):
        # An output nobody reads (Dropout's mask, say) is dropped rather than shaped.
        outputs = [tensor if tensor in consumed else "" for tensor in node.output]
        for tensor in outputs:
            if not tensor or tensor in tensors:
                continue
            if tensor not in shapes:
                # Every input's shape is fixed by now: the size depends on values computed
                # at run time (Unique, NonZero, a shape read from data), which a static
                # program cannot hold. The model is valid: it does not compile (exit 1).
                raise CompileError(
                    f"could not infer a static shape for tensor {tensor!r}, output of node "
                    f"{node.name or index!r} ({node.op_type}): its size depends on values "
                    f"computed at run time{_compile_time_hint(model)}"
                )
            tensors[tensor] = TensorInfo(tensor, shapes[tensor], _dtype(tensor, dtypes[tensor]))
        graph.add_node(
            _unique_name(node, index, used_names),
            node.op_type,
            list(node.input),
            outputs,
            {a.name: attr_value(a) for a in node.attribute},
            node.domain,
        )
    for tensor in graph.inputs:
        tensors[tensor] = TensorInfo(tensor, shapes[tensor], _dtype(tensor, dtypes[tensor]))
    for tensor in graph.outputs:
        if tensor not in tensors:
            raise UserError(f"graph output {tensor!r} is produced by no node")
    graph.imported = frozenset(tensors)
    return graph


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name an input of a node inside a subgraph attribute (at any depth)."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            bodies = list(attr.graphs)
            if attr.type == onnx.AttributeProto.GRAPH:
                bodies.append(attr.g)
            for body in bodies:
                names.update(name for inner in body.node for name in inner.input)
                names.update(_subgraph_reads(body))
    return names


def _compile_time_hint(model: onnx.ModelProto) -> str:
    from onnx2bir.frontend.compile_time_inputs import compile_time_inputs

    needed = compile_time_inputs(model)
    fixes = " ".join(f"--input-value {name}=V" for name in needed)
    return (
        f" (read at compile time from input {', '.join(map(repr, needed))}: {fixes})"
        if (needed)
        else ""
    )


def refuse_unsupported_types(model: onnx.ModelProto, inputs_only: bool = False) -> None:
    """Every tensor type the machine has no dtype for (float64, uint64, the 4-bit types,
    strings) and every non-tensor value (a sequence, an optional, a map), listed at once as
    a reason the model does not compile (exit 1): the model is valid, onnx2bir lacks them.
    `inputs_only`: the graph inputs as declared (before input files are read)."""
    if inputs_only:
        graph = model.graph
        values, initializers = list(graph.input), []
    else:
        graph = onnx.shape_inference.infer_shapes(model).graph
        values = [*graph.input, *graph.value_info, *graph.output]
        initializers = list(graph.initializer)
    found: dict[str, list[str]] = {}
    for value in values:
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            label = kind.removesuffix("_type") + " values" if kind else "untyped values"
            found.setdefault(label, []).append(value.name)
            continue
        elem = value.type.tensor_type.elem_type
        if elem and _machine_dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) is None:
            found.setdefault(onnx.TensorProto.DataType.Name(elem).lower(), []).append(value.name)
    for init in initializers:
        if _machine_dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)) is None:
            label = onnx.TensorProto.DataType.Name(init.data_type).lower()
            found.setdefault(label, []).append(init.name)
    if not found:
        return
    listing = "; ".join(
        f"{label} ({', '.join(repr(n) for n in dict.fromkeys(names[:4]))}"
        f"{', ...' if len(set(names)) > 4 else ''})"
        for label, names in found.items()
    )
    raise CompileError(
        f"the model uses types the machine has no dtype for: {listing} (machine dtypes: "
        f"{', '.join(d.value for d in Dtype if not d.autocast_only)})"
    )


def _machine_dtype(dtype: np.dtype) -> Dtype | None:
    try:
        return Dtype.from_numpy(dtype)
    except ValueError:
        return None


def _dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    result = {}
    graph = model.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        elem_type = value.type.tensor_type.elem_type
        if elem_type:
            result[value.name] = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    return result


def _dtype(tensor: str, dtype: np.dtype) -> Dtype:
    try:
        return Dtype.from_numpy(dtype)
    except ValueError as exc:
        raise UserError(
            f"tensor {tensor!r} has dtype {dtype}, which onnx2bir does not support"
        ) from exc


def _unique_name(node: onnx.NodeProto, index: int, used: set[str]) -> str:
    base = node.name or f"{node.op_type}_{index}"
    name, suffix = base, 1
    while name in used:
        name, suffix = f"{base}_{suffix}", suffix + 1
    used.add(name)
    return name
