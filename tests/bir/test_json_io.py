"""BIR JSON round trip, determinism, schema conformance and the constants sidecar."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import ml_dtypes
import numpy as np
import pytest

from onnx2bir.bir import json_io
from onnx2bir.bir.enums import (
    ActFunc,
    DepKind,
    Dtype,
    Engine,
    MemoryKind,
    MemoryType,
    Opcode,
)
from onnx2bir.bir.ir import (
    AccessPattern,
    Dependency,
    Function,
    Instruction,
    Loop,
    MemoryLocation,
    Module,
    Origin,
)
from onnx2bir.bir.json_io import module_from_json, module_to_json, read_module, write_module

SCHEMA = json.loads((resources.files("onnx2bir.bir") / "schema.json").read_text())


def _dram(name: str, kind: MemoryKind, dtype: Dtype, shape: tuple[int, ...]) -> MemoryLocation:
    return MemoryLocation(name, MemoryType.DRAM, kind, dtype, shape)


def _tile(name: str, memory: MemoryType, dtype: Dtype, parts: int, address: int, nbytes: int):
    shape = (parts, nbytes // dtype.itemsize)
    return MemoryLocation(name, memory, MemoryKind.INTERNAL, dtype, shape, parts, address, nbytes)


def build_module() -> Module:
    """A small module touching every kind of location, a loop and a scope region."""
    fn = Function("main", inputs=["x"], outputs=["y"])
    for loc in (
        _dram("x", MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (4, 8)),
        _dram("scale", MemoryKind.EXTERNAL_INPUT_PARAMETER, Dtype.FP32, (1,)),
        _dram("w", MemoryKind.CONST, Dtype.BF16, (4, 4)),
        _dram("idx", MemoryKind.CONST, Dtype.INT64, (3,)),
        _dram("bias", MemoryKind.CONST, Dtype.FP32, (4, 1)),
        _dram("y", MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32, (4, 8)),
        _dram("stats", MemoryKind.EXTERNAL_OUTPUT_PARAMETER, Dtype.FP32, (4,)),
        _tile("xs", MemoryType.SB, Dtype.BF16, 4, 0, 16),
        _tile("ws", MemoryType.SB, Dtype.BF16, 4, 64, 8),
        _tile("ys", MemoryType.SB, Dtype.FP32, 4, 128, 32),
        _tile("acc", MemoryType.PSUM, Dtype.FP32, 4, 0, 32),
    ):
        fn.add_memory_location(loc)
    origin = Origin("/fc/MatMul", "generic.matmul")
    load_x = Instruction(
        Opcode.DMA_COPY,
        Engine.DMA,
        AccessPattern("xs", ((1, 8),), num_partitions=4),
        {"in": AccessPattern("x", ((8, 4), (1, 8)))},
        {"queue": 0},
        origin,
        id=0,
    )
    load_w = Instruction(
        Opcode.DMA_COPY,
        Engine.DMA,
        AccessPattern("ws", ((1, 4),), num_partitions=4),
        {"in": AccessPattern("w", ((4, 4), (1, 4)))},
        {"queue": np.int64(1)},
        origin,
        id=1,
    )
    matmul = Instruction(
        Opcode.MATMULT,
        Engine.PE,
        AccessPattern("acc", ((1, 4),), offset_terms=(("j", 4),), num_partitions=4),
        {
            "stationary": AccessPattern("ws", ((1, 4),), num_partitions=4),
            "moving": AccessPattern("xs", ((1, 4),), offset_terms=(("j", 4),), num_partitions=4),
        },
        {"accumulate": np.bool_(False)},
        origin,
        id=2,
        loopnest=("j",),
        deps=[Dependency(0, DepKind.FLOW), Dependency(1, DepKind.FLOW)],
    )
    relu = Instruction(
        Opcode.ACTIVATION,
        Engine.ACT,
        AccessPattern("ys", ((1, 8),), num_partitions=4),
        {"in": AccessPattern("acc", ((1, 8),), num_partitions=4)},
        {"func": ActFunc.RELU, "scale": np.float32(0.5), "bias_value": 0.0},
        Origin("/fc/Relu", "generic.unary"),
        id=3,
        loopnest=("scope0",),
        deps=[Dependency(2, DepKind.FLOW)],
    )
    fill = Instruction(
        Opcode.MEMSET,
        Engine.POOL,
        AccessPattern("xs", ((1, 8),), num_partitions=4),
        {},
        {"value": -np.inf},
        Origin("/fc/Relu", "generic.unary"),
        id=4,
        loopnest=("scope0",),
        deps=[Dependency(2, DepKind.ANTI)],
    )
    store = Instruction(
        Opcode.DMA_COPY,
        Engine.DMA,
        AccessPattern("y", ((8, 4), (1, 8))),
        {"in": AccessPattern("ys", ((1, 8),), num_partitions=4)},
        {"queue": 0, "note": ("é", None, [1, 2.5])},
        Origin("/fc/Relu", "store"),
        id=5,
        deps=[Dependency(3, DepKind.FLOW), Dependency(4, DepKind.ORDERED)],
    )
    loop = Loop("j", 0, 2, parallel=True)
    loop.body.items.append(matmul)
    scope = Loop("scope0", 0, 1, no_reorder=True)
    scope.body.items += [relu, fill]
    fn.entry.items += [load_x, load_w, loop, scope, store]
    constants = {
        "w": (np.arange(16, dtype=np.float32).reshape(4, 4) / 3).astype(ml_dtypes.bfloat16),
        "idx": np.array([2, -1, 2**40], dtype=np.int64),
        "bias": np.linspace(-1, 1, 4, dtype=np.float32).reshape(4, 1),
    }
    metadata = {"source": "tiny.onnx", "opset": np.int64(17), "input_shape": (4, 8)}
    return Module("tiny", [fn], constants, metadata)


def test_round_trip_gives_equal_document_and_constants(tmp_path):
    module = build_module()
    json_path, consts_path = write_module(module, tmp_path, "tiny")
    assert (json_path.name, consts_path.name) == ("tiny.bir.json", "tiny.consts.bin")
    loaded = read_module(json_path)
    assert module_to_json(loaded) == module_to_json(module)
    assert json_path.read_text() == json_io.dumps(
        module_to_json(loaded, constants_file="tiny.consts.bin")
    )
    assert sorted(loaded.constants) == sorted(module.constants)
    for name, array in module.constants.items():
        assert loaded.constants[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded.constants[name], array)


def test_in_memory_round_trip_keeps_structure():
    module = build_module()
    doc = module_to_json(module)
    loaded = module_from_json(json.loads(json_io.dumps(doc)), module.constants)
    assert module_to_json(loaded) == doc
    loop, scope = loaded.functions[0].entry.items[2:4]
    assert (loop.axis, loop.parallel, loop.no_reorder) == ("j", True, False)
    assert loop.body.name == "block0" and loaded.functions[0].entry.name == "Block1"
    assert (scope.trip_count, scope.no_reorder) == (1, True)
    matmul = loop.body.items[0]
    assert matmul.dst.offset_terms == (("j", 4),)
    assert matmul.deps == [Dependency(0, DepKind.FLOW), Dependency(1, DepKind.FLOW)]
    assert matmul.origin == Origin("/fc/MatMul", "generic.matmul")
    assert loaded.functions[0].memory_locations == module.functions[0].memory_locations


def test_attribute_values_become_plain_json():
    doc = module_to_json(build_module())
    items = doc["functions"][0]["entry"]["items"]
    relu, fill = items[3]["body"]["items"]
    assert relu["attrs"] == {"bias_value": 0.0, "func": "relu", "scale": 0.5}
    assert type(relu["attrs"]["func"]) is str
    assert fill["attrs"] == {"value": {"$float": "-inf"}}
    assert items[4]["attrs"]["note"] == ["é", None, [1, 2.5]]
    assert doc["metadata"] == {"input_shape": [4, 8], "opset": 17, "source": "tiny.onnx"}
    loaded = module_from_json(doc)
    relu_back, fill_back = loaded.functions[0].entry.items[3].body.items
    assert relu_back.attrs["func"] == ActFunc.RELU and type(relu_back.attrs["func"]) is str
    assert fill_back.attrs["value"] == -np.inf


def test_unwritable_attribute_is_rejected():
    module = build_module()
    module.functions[0].entry.items[0].attrs["queue"] = object()
    with pytest.raises(ValueError, match="instruction 0"):
        module_to_json(module)


def test_two_writes_are_byte_identical(tmp_path):
    first = write_module(build_module(), tmp_path / "a", "tiny")
    second = write_module(build_module(), tmp_path / "b", "tiny")
    again = write_module(build_module(), tmp_path / "a", "tiny")
    for a, b, c in zip(first, second, again, strict=True):
        assert a.read_bytes() == b.read_bytes() == c.read_bytes()
    text = first[0].read_bytes()
    assert text.endswith(b"\n") and text.isascii()
    # Atomic writes leave no temporary files behind.
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "tiny.bir.json",
        "tiny.consts.bin",
    ]


def test_sidecar_layout_is_sorted_aligned_little_endian(tmp_path):
    module = build_module()
    json_path, consts_path = write_module(module, tmp_path, "tiny")
    entries = json.loads(json_path.read_text())["constants"]["entries"]
    assert [e["loc"] for e in entries] == ["bias", "idx", "w"]
    blob = consts_path.read_bytes()
    for entry in entries:
        assert entry["offset"] % 64 == 0
        array = module.constants[entry["loc"]]
        little = array.astype(array.dtype.newbyteorder("<"))
        assert blob[entry["offset"] : entry["offset"] + entry["nbytes"]] == little.tobytes()
        assert (entry["dtype"], entry["shape"]) == (str(array.dtype), list(array.shape))


def test_emitted_documents_validate_against_schema(tmp_path):
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    json_path, _ = write_module(build_module(), tmp_path, "tiny")
    validator.validate(json.loads(json_path.read_text()))
    validator.validate(module_to_json(build_module()))
    validator.validate(module_to_json(Module("empty")))


def test_schema_is_strict():
    validator = jsonschema.Draft202012Validator(SCHEMA)
    doc = module_to_json(build_module())
    doc["functions"][0]["entry"]["items"][0]["colour"] = "red"
    assert not validator.is_valid(doc)
    doc = module_to_json(build_module())
    doc["functions"][0]["entry"]["items"][0]["engine"] = "GPU"
    assert not validator.is_valid(doc)


def test_schema_enums_equal_python_enums():
    defs = SCHEMA["$defs"]
    for key, enum_class in (
        ("opcode", Opcode),
        ("engine", Engine),
        ("memoryType", MemoryType),
        ("memoryKind", MemoryKind),
        ("depKind", DepKind),
        ("dtype", Dtype),
    ):
        assert defs[key]["enum"] == [member.value for member in enum_class], key


def test_tampered_sidecar_is_rejected(tmp_path):
    json_path, consts_path = write_module(build_module(), tmp_path, "tiny")
    blob = bytearray(consts_path.read_bytes())
    blob[-1] ^= 0x01
    consts_path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="sha256"):
        read_module(json_path)


def test_truncated_sidecar_is_rejected(tmp_path):
    json_path, consts_path = write_module(build_module(), tmp_path, "tiny")
    consts_path.write_bytes(consts_path.read_bytes()[:-8])
    with pytest.raises(ValueError, match="past the end"):
        read_module(json_path)


def test_missing_sidecar_is_rejected(tmp_path):
    json_path, consts_path = write_module(build_module(), tmp_path, "tiny")
    consts_path.unlink()
    with pytest.raises(ValueError, match="missing"):
        read_module(json_path)


def test_constant_of_wrong_dtype_is_rejected():
    module = build_module()
    module.constants["bias"] = module.constants["bias"].astype(np.float64)
    with pytest.raises(ValueError, match="'bias' is float64"):
        module_to_json(module)


def test_constant_without_location_is_rejected():
    module = build_module()
    module.constants["ghost"] = np.zeros(2, dtype=np.float32)
    with pytest.raises(ValueError, match="no Const or parameter memory location"):
        module_to_json(module)


def test_foreign_document_is_rejected():
    doc = module_to_json(build_module())
    with pytest.raises(ValueError, match="format"):
        module_from_json({**doc, "format": "other"})
    with pytest.raises(ValueError, match="schema_version"):
        module_from_json({**doc, "schema_version": 2})
    del doc["functions"][0]["entry"]
    with pytest.raises(ValueError, match="malformed"):
        module_from_json(doc)


def test_stem_must_be_a_plain_name(tmp_path):
    with pytest.raises(ValueError, match="stem"):
        write_module(build_module(), tmp_path, "sub/tiny")


def test_loop_carried_edges_round_trip_and_plain_edges_keep_two_keys():
    module = build_module()
    loop = module.functions[0].entry.items[2]
    matmul = loop.body.items[0]
    matmul.deps.append(Dependency(matmul.id, DepKind.OUTPUT, loop.axis, 1))
    doc = module_to_json(module)
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    written = doc["functions"][0]["entry"]["items"][2]["body"]["items"][0]["deps"]
    assert written[0] == {"source": 0, "kind": "Flow"}
    assert written[-1] == {"source": matmul.id, "kind": "Output", "carried_by": "j", "distance": 1}
    loaded = module_from_json(json.loads(json_io.dumps(doc)), module.constants)
    assert loaded.functions[0].entry.items[2].body.items[0].deps == matmul.deps
    # a distance without its loop (or 0) is not a valid document
    written[-1]["distance"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    del written[-1]["carried_by"]
    written[-1]["distance"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(doc)
