"""What a model must satisfy before any work is done on it: the file-level contracts.

Each check raises `UserError` with one line naming the node, tensor, attribute or field concerned
(exit 2). The contracts, and which check enforces each, are listed in
`docs/input_contracts.md#model`. This module holds the ones that need no shapes:

- `check_text`: every string in the model is valid UTF-8 (protobuf hands undecodable names
  over as bytes, which no later step expects);
- `check_versions`: the IR version and each opset version are ones the installed onnx knows
  (what onnxruntime refuses: opset 99 "under development");
- `check_graph_outputs`: the graph lists at least one output, each named and produced by a
  node, an input or an initializer;
- `check_ops`: every node of a standard domain resolves to a schema at the model's opset;
- `check_external_data`: offsets and lengths are non-negative integers inside their file.

The node checks that need static shapes (attributes, channels, constant indices) are in
`onnx2bir.frontend.node_contracts`, the byte-size checks in `onnx2bir.frontend.memory_contracts`.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from onnx2bir.errors import UserError
from onnx2bir.op_traits import STANDARD_DOMAINS

# The smallest IR version whose models carry opset_import (IR 3, onnx 1.0).
MIN_IR_VERSION = 3


def _domain_label(domain: str) -> str:
    return domain or "ai.onnx"


def known_opset(domain: str) -> int | None:
    """The newest opset of `domain` the installed onnx has schemas for (None: not an onnx
    domain)."""
    if domain in STANDARD_DOMAINS:
        return onnx.defs.onnx_opset_version()
    newest = None
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == domain:
            newest = max(newest or 0, schema.since_version)
    return newest


def _first_bad_string(message: Message, where: str) -> str | None:
    for field, value in message.ListFields():
        label = f"{where}.{field.name}"
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:  # protobuf before 5
            repeated = field.label == FieldDescriptor.LABEL_REPEATED
        values = value if repeated else [value]
        if field.type == FieldDescriptor.TYPE_STRING:
            for item in values:
                if isinstance(item, bytes):
                    return label
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for index, item in enumerate(values):
                found = _first_bad_string(item, f"{label}[{index}]" if len(values) > 1 else label)
                if found:
                    return found
    return None


def check_text(model: onnx.ModelProto, source: str) -> None:
    bad = _first_bad_string(model, "model")
    if bad:
        raise UserError(f"{source}: {bad} is not valid UTF-8 text")


def check_versions(model: onnx.ModelProto) -> None:
    if not MIN_IR_VERSION <= model.ir_version <= onnx.IR_VERSION:
        raise UserError(
            f"the model's IR version {model.ir_version} is outside what onnx "
            f"{onnx.__version__} reads ({MIN_IR_VERSION} to {onnx.IR_VERSION})"
        )
    seen: set[str] = set()
    for entry in model.opset_import:
        domain = "" if entry.domain == "ai.onnx" else entry.domain
        if domain in seen:
            raise UserError(f"the model imports domain {_domain_label(domain)!r} twice")
        seen.add(domain)
        newest = known_opset(domain)
        if newest is None:
            continue  # a vendor domain: its ops are refused as unsupported if nothing lowers them
        if not 1 <= entry.version <= newest:
            raise UserError(
                f"the model imports {_domain_label(domain)} opset {entry.version}; onnx "
                f"{onnx.__version__} knows opsets 1 to {newest} of that domain"
            )
    if "" not in seen and any(node.domain in STANDARD_DOMAINS for node in model.graph.node):
        raise UserError("the model uses ai.onnx ops but imports no ai.onnx opset")


def node_label(node: onnx.NodeProto, index: int) -> str:
    return f"node {node.name or f'#{index}'!r} ({node.op_type})"


def check_ops(model: onnx.ModelProto) -> None:
    opsets = {("" if e.domain == "ai.onnx" else e.domain): e.version for e in model.opset_import}
    for index, node in enumerate(model.graph.node):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if known_opset(domain) is None:
            continue
        version = opsets.get(domain)
        if version is None:
            raise UserError(
                f"{node_label(node, index)}: the model imports no {_domain_label(domain)} opset"
            )
        try:
            onnx.defs.get_schema(node.op_type, version, domain)
        except onnx.defs.SchemaError:
            raise UserError(
                f"{node_label(node, index)}: no {_domain_label(domain)} op {node.op_type!r} "
                f"exists at opset {version}"
            ) from None


def check_graph_outputs(model: onnx.ModelProto) -> None:
    graph = model.graph
    if not graph.output:
        raise UserError("the graph lists no outputs: there is nothing to compute")
    known = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    known |= {name for node in graph.node for name in node.output if name}
    for position, value in enumerate(graph.output):
        if not value.name:
            raise UserError(f"graph output #{position} has no name")
        if value.name not in known:
            raise UserError(f"graph output {value.name!r} is produced by no node")


def _int_field(tensor: onnx.TensorProto, key: str, text: str, path: Path) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UserError(
            f"{path}: tensor {tensor.name!r} external-data {key} {text[:40]!r} is not an integer"
        ) from None
    if value < 0:
        raise UserError(f"{path}: tensor {tensor.name!r} external-data {key} {value} is negative")
    return value


def check_external_fields(tensor: onnx.TensorProto, path: Path) -> dict[str, int]:
    """Offset and length of one tensor's external data are non-negative integers."""
    fields = {entry.key: entry.value for entry in tensor.external_data}
    return {
        key: _int_field(tensor, key, fields[key], path)
        for key in ("offset", "length")
        if key in fields
    }


def check_external_data(tensor: onnx.TensorProto, target: Path, path: Path) -> None:
    """Offset and length of one tensor's external data lie inside `target`."""
    fields = check_external_fields(tensor, path)
    size = target.stat().st_size
    offset, length = fields.get("offset", 0), fields.get("length")
    if offset > size or (length is not None and offset + length > size):
        end = "the end" if length is None else offset + length
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        raise UserError(
            f"{path}: tensor {tensor.name!r} reads external data bytes {offset} to {end} of "
            f"{location!r}, a file of {size} bytes"
        )
