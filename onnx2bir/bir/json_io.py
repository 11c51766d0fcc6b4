"""BIR to JSON and back: the on-disk form of a `bir.Module` and its constants sidecar.

In: a `Module`. Out: a document of plain JSON values (`module_to_json`) and, on disk
(`write_module`), two files: `<stem>.bir.json`, the document, and `<stem>.consts.bin`, the
raw little-endian bytes of every payload in `module.constants`, one per payload location (Const,
ExternalInputParameter or ExternalOutputParameter: the model's weights travel with it),
concatenated in sorted location-name order, each starting on a 64-byte boundary (zero padding
between). `module_from_json` and `read_module` rebuild the Module; the reader checks each
payload's sha256. The layout (schema_version 1; `schema.json` beside this file is the contract):

    {"format": "onnx2bir.bir", "schema_version": 1, "name", "metadata",
     "constants": {"file": "<stem>.consts.bin" | null,
                   "entries": [{"loc", "dtype", "shape", "offset", "nbytes", "sha256"}]},
     "functions": [{"name", "inputs", "outputs", "memory_locations": [location], "entry": block}]}
    location    = {"name", "memory", "kind", "dtype", "shape",
                   "num_partitions", "address", "bytes_per_partition"}
    block       = {"name", "items": [instruction | loop]}     entry "Block1", loop body "block0"
    loop        = {"axis", "start", "stop", "step", "parallel", "no_reorder", "body": block}
    dynamic     = {"kind": "DynamicFor", "axis", "start", "stop": runtime, "step", "parallel",
                   "no_reorder", "locals": [loc], "body": block}
    do_while    = {"kind": "DoWhile", "axis", "continue_condition": runtime | bool,
                   "is_do_while", "no_reorder", "locals": [loc], "body": block}
    runtime     = {"loc", "offset"}      an element of a DRAM location, loaded when tested
    instruction = {"id", "opcode", "engine", "dst": ap | null, "srcs": {role: ap}, "attrs",
                   "loopnest", "origin": {"node", "rule"},
                   "deps": [{"source", "kind"[, "carried_by", "distance"]}],
                   optional: "predicate": {"const", "terms": [[axis, coef]]},
                   "loop_mode": "Affine" | "Sequential" | "Dynamic", "can_read_uninit": true}
                   (written only when set, so modules without them are unchanged)
    ap          = {"loc", "partition_start", "num_partitions", "offset",
                   "offset_terms": [[axis, coef]], "pattern": [[stride, count]]}

Enums are written as their string values. Attribute and metadata values must be JSON-like:
None, bool, int, float, str, lists/tuples, str-keyed dicts, numpy scalars and arrays. A StrEnum
attribute (e.g. `ActFunc.RELU`) is written as its value and read back as a plain string; it
still compares equal (`"relu" == ActFunc.RELU`). Tuples and arrays come back as lists. JSON
has no spelling for non-finite floats (a -inf Memset is common), so they are written as
`{"$float": "inf" | "-inf" | "nan"}` and read back as floats.

Determinism: the same Module gives byte-identical files. Keys are emitted in a fixed order
built here (attrs, srcs and metadata sorted), then the text of `json.dumps` with indent=1,
fixed separators, ASCII only, no NaN tokens (`json_text.canonical_dumps` writes exactly that
text, faster), and a trailing newline. Files are written to a
temporary name in the target directory and moved into place with `os.replace`.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from onnx2bir.bir.enums import (
    PAYLOAD_KINDS,
    DepKind,
    Dtype,
    Engine,
    LoopMode,
    MemoryKind,
    MemoryType,
    Opcode,
)
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    Dependency,
    DoWhile,
    DynamicLoop,
    Function,
    Instruction,
    Loop,
    MemoryLocation,
    Module,
    Origin,
    Predicate,
    RuntimeValue,
)
from onnx2bir.bir.json_text import canonical_dumps

FORMAT = "onnx2bir.bir"
SCHEMA_VERSION = 1
JSON_SUFFIX = ".bir.json"
CONSTS_SUFFIX = ".consts.bin"
CONST_ALIGNMENT = 64
_FLOAT_TAG = "$float"
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def module_to_json(module: Module, *, constants_file: str | None = None) -> dict:
    """The JSON document of `module`; `constants_file` names the sidecar, if one is written."""
    return _document(module, constants_file)[0]


def module_from_json(doc: dict, constants: dict[str, np.ndarray] | None = None) -> Module:
    """Rebuild a Module from its document; `constants` become `module.constants` as given."""
    _check_header(doc)
    try:
        return Module(
            name=doc["name"],
            functions=[_function_from_json(fn) for fn in doc["functions"]],
            constants=dict(constants or {}),
            metadata=_decode_value(doc["metadata"]),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed BIR document: {type(exc).__name__}: {exc}") from exc


def dumps(doc: dict) -> str:
    """The canonical text of a document: what `write_module` puts in `<stem>.bir.json`."""
    return canonical_dumps(doc) + "\n"  # json.dumps's text, written faster (json_text.py)


def write_module(module: Module, directory: str | os.PathLike, stem: str) -> list[Path]:
    """Write `<stem>.bir.json` and `<stem>.consts.bin` into `directory`; return both paths."""
    if not stem or stem in (".", "..") or Path(stem).name != stem:
        raise ValueError(f"stem {stem!r} must be a plain file name without directories")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{stem}{JSON_SUFFIX}"
    consts_path = directory / f"{stem}{CONSTS_SUFFIX}"
    doc, blob = _document(module, consts_path.name)
    # Sidecar first: a reader that sees the new JSON must find the bytes it describes.
    _write_atomic(consts_path, blob)
    _write_atomic(json_path, dumps(doc).encode("ascii"))
    return [json_path, consts_path]


def read_module(json_path: str | os.PathLike) -> Module:
    """Load a module written by `write_module`, its constants checked against their sha256."""
    json_path = Path(json_path)
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    _check_header(doc)
    section = doc.get("constants")
    if not isinstance(section, dict):
        raise ValueError(f"{json_path}: no constants section")
    entries, file = section.get("entries", []), section.get("file")
    if file is None:
        if entries:
            raise ValueError(f"{json_path}: {len(entries)} constants but no sidecar file named")
        return module_from_json(doc, {})
    if not isinstance(file, str) or Path(file).name != file:
        raise ValueError(f"{json_path}: sidecar name {file!r} must be a plain file name")
    sidecar = json_path.parent / file
    if not sidecar.is_file():
        raise ValueError(f"{json_path}: constants sidecar {sidecar} is missing")
    return module_from_json(doc, _unpack_constants(entries, sidecar.read_bytes(), sidecar))


# ---- writing -------------------------------------------------------------------------------


def _document(module: Module, constants_file: str | None) -> tuple[dict, bytes]:
    entries, blob = _pack_constants(module)
    doc = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "name": module.name,
        "metadata": _encode_value(module.metadata, "module metadata"),
        "constants": {"file": constants_file, "entries": entries},
        "functions": [_function_to_json(fn) for fn in module.functions],
    }
    return doc, blob


def _function_to_json(fn: Function) -> dict:
    return {
        "name": fn.name,
        "inputs": list(fn.inputs),
        "outputs": list(fn.outputs),
        "memory_locations": [_location_to_json(loc) for loc in fn.memory_locations.values()],
        "entry": _block_to_json(fn.entry),
    }


def _location_to_json(loc: MemoryLocation) -> dict:
    return {
        "name": loc.name,
        "memory": str(loc.memory),
        "kind": str(loc.kind),
        "dtype": str(loc.dtype),
        "shape": [int(d) for d in loc.shape],
        "num_partitions": int(loc.num_partitions),
        "address": int(loc.address),
        "bytes_per_partition": int(loc.bytes_per_partition),
    }


def _block_to_json(block: BasicBlock) -> dict:
    items = []
    for item in block.items:
        if isinstance(item, DynamicLoop | DoWhile):
            items.append(_runtime_loop_to_json(item))
        else:
            items.append(_loop_to_json(item) if isinstance(item, Loop) else _inst_to_json(item))
    return {"name": block.name, "items": items}


def _runtime_value_to_json(value: RuntimeValue) -> dict:
    return {"loc": value.loc, "offset": int(value.offset)}


def _runtime_loop_to_json(loop: DynamicLoop | DoWhile) -> dict:
    """A DynamicFor or DoWhile loop; the static one-trip view is not written."""
    if isinstance(loop, DynamicLoop):
        return {
            "kind": "DynamicFor",
            "axis": loop.axis,
            "start": int(loop.start),
            "stop": _runtime_value_to_json(loop.stop_value),
            "step": int(loop.step),
            "parallel": bool(loop.parallel),
            "no_reorder": bool(loop.no_reorder),
            "locals": list(loop.local_locations),
            "body": _block_to_json(loop.body),
        }
    condition = loop.continue_condition
    return {
        "kind": "DoWhile",
        "axis": loop.axis,
        "continue_condition": (
            bool(condition) if isinstance(condition, bool) else _runtime_value_to_json(condition)
        ),
        "is_do_while": bool(loop.is_do_while),
        "no_reorder": bool(loop.no_reorder),
        "locals": list(loop.local_locations),
        "body": _block_to_json(loop.body),
    }


def _loop_to_json(loop: Loop) -> dict:
    return {
        "axis": loop.axis,
        "start": int(loop.start),
        "stop": int(loop.stop),
        "step": int(loop.step),
        "parallel": bool(loop.parallel),
        "no_reorder": bool(loop.no_reorder),
        "body": _block_to_json(loop.body),
    }


def _inst_to_json(inst: Instruction) -> dict:
    where = f"instruction {inst.id} ({inst.opcode})"
    return {
        "id": int(inst.id),
        "opcode": str(inst.opcode),
        "engine": str(inst.engine),
        "dst": None if inst.dst is None else _ap_to_json(inst.dst),
        "srcs": {role: _ap_to_json(inst.srcs[role]) for role in sorted(inst.srcs)},
        "attrs": _encode_value(dict(inst.attrs), f"{where} attrs"),
        "loopnest": list(inst.loopnest),
        "origin": {"node": inst.origin.node, "rule": inst.origin.rule},
        "deps": [_dep_to_json(d) for d in inst.deps],
        **_inst_extras_to_json(inst),
    }


def _inst_extras_to_json(inst: Instruction) -> dict:
    """The optional per-instruction stamps: predicate, loop mode, can_read_uninit."""
    extras: dict = {}
    if inst.predicate is not None:
        extras["predicate"] = {
            "const": int(inst.predicate.const),
            "terms": [[axis, int(coef)] for axis, coef in inst.predicate.terms],
        }
    if inst.loop_mode:
        extras["loop_mode"] = str(inst.loop_mode)
    if inst.can_read_uninit:
        extras["can_read_uninit"] = True
    return extras


def _dep_to_json(dep: Dependency) -> dict:
    doc = {"source": int(dep.source), "kind": str(dep.kind)}
    if dep.carried_by is not None:  # plain edges keep the two-key form
        doc["carried_by"] = dep.carried_by
        doc["distance"] = int(dep.distance)
    return doc


def _ap_to_json(ap: AccessPattern) -> dict:
    return {
        "loc": ap.loc,
        "partition_start": int(ap.partition_start),
        "num_partitions": int(ap.num_partitions),
        "offset": int(ap.offset),
        "offset_terms": [[axis, int(coef)] for axis, coef in ap.offset_terms],
        "pattern": [[int(stride), int(count)] for stride, count in ap.pattern],
    }


def _encode_value(value: object, where: str) -> object:
    """A JSON-ready copy of an attribute or metadata value."""
    if isinstance(value, enum.Enum):
        return _encode_value(value.value, where)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, np.ndarray):
        return _encode_value(value.tolist(), where)
    if isinstance(value, np.generic):
        return _encode_value(value.item(), where)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return {_FLOAT_TAG: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, list | tuple):
        return [_encode_value(v, where) for v in value]
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            raise ValueError(f"{where}: dict keys must be strings, got {list(value)!r}")
        if list(value) == [_FLOAT_TAG]:
            raise ValueError(f"{where}: a dict with the single key {_FLOAT_TAG!r} is reserved")
        return {str(k): _encode_value(value[k], f"{where}.{k}") for k in sorted(value)}
    raise ValueError(f"{where}: cannot write a {type(value).__name__} to JSON")


def _const_locations(module: Module) -> dict[str, MemoryLocation]:
    """Every payload location by name; one name used in several functions must agree."""
    found: dict[str, MemoryLocation] = {}
    for fn in module.functions:
        for loc in fn.memory_locations.values():
            if loc.kind not in PAYLOAD_KINDS:
                continue
            prior = found.setdefault(loc.name, loc)
            if (prior.dtype, tuple(prior.shape)) != (loc.dtype, tuple(loc.shape)):
                raise ValueError(f"{loc.kind} location {loc.name!r} differs between functions")
    return found


def _pack_constants(module: Module) -> tuple[list[dict], bytes]:
    locations = _const_locations(module)
    entries: list[dict] = []
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(module.constants):
        loc = locations.get(name)
        if loc is None:
            raise ValueError(f"constant {name!r} has no Const or parameter memory location")
        data = _constant_bytes(name, module.constants[name], loc)
        pad = -offset % CONST_ALIGNMENT
        chunks.append(b"\0" * pad)
        offset += pad
        entries.append(
            {
                "loc": name,
                "dtype": str(loc.dtype),
                "shape": [int(d) for d in loc.shape],
                "offset": offset,
                "nbytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        chunks.append(data)
        offset += len(data)
    return entries, b"".join(chunks)


def _constant_bytes(name: str, value: object, loc: MemoryLocation) -> bytes:
    dtype = Dtype(loc.dtype).numpy
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        # A silent cast would hide a codegen bug (float64 weights in an fp32 location).
        if array.dtype != dtype:
            raise ValueError(f"constant {name!r} is {array.dtype}, its location is {loc.dtype}")
    else:
        array = np.asarray(value, dtype=dtype)
    if array.shape != tuple(loc.shape):
        raise ValueError(f"constant {name!r} has shape {array.shape}, its location {loc.shape}")
    return np.ascontiguousarray(array, dtype=dtype.newbyteorder("<")).tobytes()


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp makes the file owner-only; outputs are ordinary, readable files.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---- reading -------------------------------------------------------------------------------


def _check_header(doc: object) -> None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a BIR document: format is not {FORMAT!r}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"BIR schema_version {doc.get('schema_version')!r} unsupported "
            f"(this reader knows {SCHEMA_VERSION})"
        )


def _function_from_json(doc: dict) -> Function:
    fn = Function(name=doc["name"], inputs=list(doc["inputs"]), outputs=list(doc["outputs"]))
    for loc in doc["memory_locations"]:
        fn.add_memory_location(
            MemoryLocation(
                name=loc["name"],
                memory=MemoryType(loc["memory"]),
                kind=MemoryKind(loc["kind"]),
                dtype=Dtype(loc["dtype"]),
                shape=tuple(loc["shape"]),
                num_partitions=loc["num_partitions"],
                address=loc["address"],
                bytes_per_partition=loc["bytes_per_partition"],
            )
        )
    fn.entry = _block_from_json(doc["entry"])
    return fn


def _block_from_json(doc: dict) -> BasicBlock:
    items: list[Instruction | Loop] = []
    for item in doc["items"]:
        if "kind" in item:
            items.append(_runtime_loop_from_json(item))
        else:
            items.append(_loop_from_json(item) if "body" in item else _inst_from_json(item))
    return BasicBlock(name=doc["name"], items=items)


def _runtime_value_from_json(doc: dict) -> RuntimeValue:
    return RuntimeValue(loc=doc["loc"], offset=doc["offset"])


def _runtime_loop_from_json(doc: dict) -> DynamicLoop | DoWhile:
    kind = doc["kind"]
    if kind == "DynamicFor":
        return DynamicLoop(
            axis=doc["axis"],
            start=doc["start"],
            stop=doc["start"] + doc["step"],
            step=doc["step"],
            parallel=doc["parallel"],
            no_reorder=doc["no_reorder"],
            body=_block_from_json(doc["body"]),
            stop_value=_runtime_value_from_json(doc["stop"]),
            local_locations=tuple(doc["locals"]),
        )
    if kind == "DoWhile":
        condition = doc["continue_condition"]
        return DoWhile(
            axis=doc["axis"],
            start=0,
            stop=1,
            no_reorder=doc["no_reorder"],
            body=_block_from_json(doc["body"]),
            continue_condition=(
                condition if isinstance(condition, bool) else _runtime_value_from_json(condition)
            ),
            is_do_while=doc["is_do_while"],
            local_locations=tuple(doc["locals"]),
        )
    raise ValueError(f"unknown loop kind {kind!r}")


def _loop_from_json(doc: dict) -> Loop:
    return Loop(
        axis=doc["axis"],
        start=doc["start"],
        stop=doc["stop"],
        step=doc["step"],
        parallel=doc["parallel"],
        no_reorder=doc["no_reorder"],
        body=_block_from_json(doc["body"]),
    )


def _inst_from_json(doc: dict) -> Instruction:
    return Instruction(
        opcode=Opcode(doc["opcode"]),
        engine=Engine(doc["engine"]),
        dst=None if doc["dst"] is None else _ap_from_json(doc["dst"]),
        srcs={role: _ap_from_json(ap) for role, ap in doc["srcs"].items()},
        attrs=_decode_value(doc["attrs"]),
        origin=Origin(node=doc["origin"]["node"], rule=doc["origin"]["rule"]),
        id=doc["id"],
        loopnest=tuple(doc["loopnest"]),
        deps=[
            Dependency(
                source=d["source"],
                kind=DepKind(d["kind"]),
                carried_by=d.get("carried_by"),
                distance=d.get("distance", 0),
            )
            for d in doc["deps"]
        ],
        predicate=_predicate_from_json(doc.get("predicate")),
        loop_mode=LoopMode(doc.get("loop_mode", "")),
        can_read_uninit=bool(doc.get("can_read_uninit", False)),
    )


def _predicate_from_json(doc: dict | None) -> Predicate | None:
    if doc is None:
        return None
    return Predicate(doc["const"], tuple((axis, coef) for axis, coef in doc["terms"]))


def _ap_from_json(doc: dict) -> AccessPattern:
    return AccessPattern(
        loc=doc["loc"],
        pattern=tuple((stride, count) for stride, count in doc["pattern"]),
        offset=doc["offset"],
        offset_terms=tuple((axis, coef) for axis, coef in doc["offset_terms"]),
        partition_start=doc["partition_start"],
        num_partitions=doc["num_partitions"],
    )


def _decode_value(value: object) -> object:
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    if isinstance(value, dict):
        if list(value) == [_FLOAT_TAG]:
            return _NON_FINITE[value[_FLOAT_TAG]]
        return {k: _decode_value(v) for k, v in value.items()}
    return value


def _unpack_constants(entries: list[dict], blob: bytes, sidecar: Path) -> dict[str, np.ndarray]:
    constants: dict[str, np.ndarray] = {}
    for entry in entries:
        name, offset, nbytes = entry["loc"], entry["offset"], entry["nbytes"]
        dtype = Dtype(entry["dtype"]).numpy
        shape = tuple(entry["shape"])
        if offset < 0 or offset + nbytes > len(blob):
            raise ValueError(
                f"{sidecar}: constant {name!r} bytes [{offset}, {offset + nbytes}) lie past "
                f"the end of the file ({len(blob)} bytes)"
            )
        if nbytes != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{sidecar}: constant {name!r} has {nbytes} bytes for {shape}")
        data = blob[offset : offset + nbytes]
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ValueError(f"{sidecar}: constant {name!r} fails its sha256 check")
        # astype copies, so the array owns writable memory rather than viewing `blob`.
        array = np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype)
        constants[name] = array.reshape(shape)
    return constants
