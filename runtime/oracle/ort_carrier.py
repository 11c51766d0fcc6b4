"""Values onnxruntime's Python API cannot exchange, carried across it in a wider type.

onnxruntime 1.32 runs bfloat16, float8 and int4 tensors inside a model, but its Python binding
cannot take or return numpy arrays of those ml_dtypes types: a bfloat16 feed fails with
"Numpy_type 256 can't be converted to MLDataType", an int4 result with "No corresponding Numpy
type for Tensor Type. Int4x2". So a model whose graph inputs or requested outputs have such a
type (`CARRIERS`) is run as an adapted copy:

- each such graph input `x` that is fed becomes an input `x__ort_carrier` of its carrier type
  (float32 for the float types, int8/uint8 for the 2- and 4-bit integers: every value of the
  narrow type is exactly a value of its carrier), followed by `Cast(to=<x's type>)` writing
  `x` itself, so every reader (subgraphs included) reads the tensor it read before, bit for
  bit; the float8 Casts have `saturate=0` so an infinity stays infinite;
- each such requested output `y` gets `Cast(to=<carrier>)` into a graph output
  `y__ort_carrier`, and `y` stays an ordinary tensor of the graph;
- feeds go in through `carry_in` (an exact widening of the ml_dtypes array) and results come
  back through `carry_out` (an exact narrowing back to the ml_dtypes type).

Every internal name is kept, so the emulating oracle's intermediates, added to its graph as
outputs and asked for by name, are adapted like any output; callers see the same
{name: array} as for any other model. `crossing` decides from the session's declared types
alone, so an ordinary model is neither re-read nor re-built. The Cast needs the model's
default-domain opset to take the type (bfloat16 from 13, float8 from 19, int4 from 21, ...);
a lower opset is an `OracleError` naming the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx2bir.errors import OracleError

SUFFIX = "__ort_carrier"
_FLOAT8 = {
    TensorProto.FLOAT8E4M3FN,
    TensorProto.FLOAT8E4M3FNUZ,
    TensorProto.FLOAT8E5M2,
    TensorProto.FLOAT8E5M2FNUZ,
}


@dataclass(frozen=True)
class Carrier:
    """How one ONNX type crosses the boundary: `elem_type` (the tensor's type) travels as
    `carrier`, and the Cast between them needs opset `opset` of the default domain."""

    elem_type: int
    carrier: int
    opset: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))

    @property
    def carrier_dtype(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.carrier))

    @property
    def name(self) -> str:
        return TensorProto.DataType.Name(self.elem_type).lower()


def _carriers() -> dict[str, Carrier]:
    """onnxruntime's type string -> Carrier, for the types this onnx defines."""
    table = {
        "BFLOAT16": ("FLOAT", 13),
        "FLOAT8E4M3FN": ("FLOAT", 19),
        "FLOAT8E4M3FNUZ": ("FLOAT", 19),
        "FLOAT8E5M2": ("FLOAT", 19),
        "FLOAT8E5M2FNUZ": ("FLOAT", 19),
        "INT4": ("INT8", 21),
        "UINT4": ("UINT8", 21),
        "FLOAT4E2M1": ("FLOAT", 23),
        "FLOAT8E8M0": ("FLOAT", 24),
        "INT2": ("INT8", 25),
        "UINT2": ("UINT8", 25),
    }
    return {
        f"tensor({name.lower()})": Carrier(
            getattr(TensorProto, name), getattr(TensorProto, carrier), opset
        )
        for name, (carrier, opset) in table.items()
        if hasattr(TensorProto, name)
    }


CARRIERS = _carriers()


@dataclass
class Boundary:
    """The graph inputs (fed) and requested outputs that cross in a carrier, by name."""

    inputs: dict[str, Carrier]
    outputs: dict[str, Carrier]


def crossing(session, feeds: dict, outputs: list[str]) -> Boundary | None:
    """In: an onnxruntime session, the feeds by name, the requested output names. Out: the
    inputs and outputs that need a carrier, from the session's declared types alone; None
    when there are none (the model runs as it is)."""
    inputs = {
        value.name: CARRIERS[value.type]
        for value in session.get_inputs()
        if value.type in CARRIERS and value.name in feeds
    }
    wanted = set(outputs)
    results = {
        value.name: CARRIERS[value.type]
        for value in session.get_outputs()
        if value.type in CARRIERS and value.name in wanted
    }
    return Boundary(inputs, results) if inputs or results else None


def _default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default (ai.onnx) domain; 0 when it imports none."""
    versions = [op.version for op in model.opset_import if op.domain in ("", "ai.onnx")]
    return max(versions, default=0)


def _names(graph: onnx.GraphProto, found: set[str]) -> set[str]:
    """Every tensor name of `graph` and of its subgraphs, added to `found`."""
    for value in [*graph.input, *graph.output, *graph.value_info]:
        found.add(value.name)
    found.update(init.name for init in graph.initializer)
    for node in graph.node:
        found.update(node.input)
        found.update(node.output)
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.HasField("g") else []
            for sub in [*subgraphs, *attr.graphs]:
                _names(sub, found)
    return found


def _fresh(name: str, taken: set[str]) -> str:
    """`name` + SUFFIX, numbered when the graph already holds that name."""
    candidate, index = name + SUFFIX, 1
    while candidate in taken:
        candidate, index = f"{name}{SUFFIX}{index}", index + 1
    taken.add(candidate)
    return candidate


def _check_opset(model: onnx.ModelProto, boundary: Boundary) -> None:
    """Refuse, naming the tensor, a carrier whose Cast the model's opset does not have."""
    opset = _default_opset(model)
    for role, table in (("input", boundary.inputs), ("output", boundary.outputs)):
        for name, carrier in table.items():
            if opset < carrier.opset:
                raise OracleError(
                    f"onnxruntime could not run the model: its {role} {name!r} is "
                    f"{carrier.name}, which onnxruntime's Python API cannot exchange, and "
                    f"carrying it as {TensorProto.DataType.Name(carrier.carrier).lower()} "
                    f"needs a Cast of opset {carrier.opset}; the model imports opset {opset}"
                )


@dataclass
class Adapted:
    """The adapted model and the boundary names: original name -> carrier name."""

    model: onnx.ModelProto
    feed_names: dict[str, str]
    fetch_names: dict[str, str]


def adapt(model: onnx.ModelProto, boundary: Boundary) -> Adapted:
    """In: the model (modified in place: pass a copy or a freshly loaded proto) and its
    boundary. Out: the model with a carrier input and Cast per adapted input, a Cast and
    carrier output per adapted output (module docstring). Raises OracleError when the
    model's opset has no such Cast."""
    _check_opset(model, boundary)
    graph = model.graph
    taken = _names(graph, set())
    feed_names = {name: _fresh(name, taken) for name in boundary.inputs}
    fetch_names = {name: _fresh(name, taken) for name in boundary.outputs}
    first, last = [], []
    for value in graph.input:
        carrier = boundary.inputs.get(value.name)
        if carrier is None:
            continue
        original, value.name = value.name, feed_names[value.name]
        value.type.tensor_type.elem_type = carrier.carrier
        saturate = {"saturate": 0} if carrier.elem_type in _FLOAT8 else {}
        first.append(
            helper.make_node(
                "Cast", [value.name], [original], name=value.name, to=carrier.elem_type, **saturate
            )
        )
    # A fed input's default value (an IR-3 initializer of the same name) is overridden anyway;
    # the Cast now writes that name.
    kept = [init for init in graph.initializer if init.name not in feed_names]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for value in graph.output:
        carrier = boundary.outputs.get(value.name)
        if carrier is None:
            continue
        original, value.name = value.name, fetch_names[value.name]
        value.type.tensor_type.elem_type = carrier.carrier
        last.append(
            helper.make_node("Cast", [original], [value.name], name=value.name, to=carrier.carrier)
        )
    nodes = [*first, *graph.node, *last]
    del graph.node[:]
    graph.node.extend(nodes)
    return Adapted(model, feed_names, fetch_names)


def carry_in(name: str, value: np.ndarray, carrier: Carrier) -> np.ndarray:
    """In: the feed of input `name`, an array of the input's ml_dtypes type. Out: the same
    values in the carrier type (exact: every value of the narrow type is one of the
    carrier's). Another dtype is refused as onnxruntime would refuse it."""
    value = np.asarray(value)
    if value.dtype != carrier.dtype:
        raise OracleError(
            f"onnxruntime could not run the model: input {name!r} is fed {value.dtype}, "
            f"the model takes {carrier.dtype}"
        )
    return value.astype(carrier.carrier_dtype)


def carry_out(value: np.ndarray, carrier: Carrier) -> np.ndarray:
    """In: an output as onnxruntime returned it, in the carrier type. Out: the output's own
    ml_dtypes type (exact: the carrier holds values Cast from that type)."""
    return np.asarray(value).astype(carrier.dtype)


def run(session, adapted: Adapted, boundary: Boundary, feeds: dict, names: list[str]) -> dict:
    """In: a session of `adapted.model`, the caller's feeds by graph-input name, the output
    names asked for. Out: {name: array} in the model's own dtypes, as for any model."""
    given = {value.name for value in session.get_inputs()}
    carried = {}
    for name, value in feeds.items():
        if name in adapted.feed_names:
            carried[adapted.feed_names[name]] = carry_in(name, value, boundary.inputs[name])
        elif name in given:
            carried[name] = value
    fetches = [adapted.fetch_names.get(name, name) for name in names]
    results = session.run(fetches, carried)
    return {
        name: carry_out(result, boundary.outputs[name]) if name in boundary.outputs else result
        for name, result in zip(names, results, strict=True)
    }
