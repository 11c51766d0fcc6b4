"""Integers as the device has them (docs/neuroncore.md#integers): no int64 datapath, VectorE in
fp32, GpSimd in exact int32, and every int64 tensor narrowed to int32 with a proof or a note.

- `onnx2bir run` refuses a program with an int64 SBUF tile (INT64-DATAPATH, exit 1); the same
  program with the tile int32 runs, and computes 2^24 + 1 exactly on GpSimd and rounded on
  VectorE.
- A model whose index arithmetic passes 2^24 with a bound the interval analysis proves (flat
  positions p · 4096 + q) is narrowed with that proof and validates exactly: VectorE's fp32
  would round its odd values, so exactness shows the arithmetic ran on GpSimd.
- A model that does arithmetic on an int64 input is reported "may overflow int32" (report and
  `note:`); inside int32 it validates, beyond int32 validation fails — never silently exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from run_program import run_program

from onnx2bir.bir.enums import DepKind, Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    Dependency,
    Function,
    Instruction,
    MemoryLocation,
    Module,
    Origin,
)
from onnx2bir.bir.rules import RULES
from onnx2bir.cli.commands import main
from onnx2bir.runtime.oracle.ort import save_arrays

ORIGIN = Origin("add", "test")


def _program(tile_dtype: Dtype, engine: Engine) -> Module:
    """y = a + b for two int64 DRAM vectors of 4, through SBUF tiles of `tile_dtype`."""
    locations = [
        MemoryLocation(n, MemoryType.DRAM, kind, Dtype.INT64, (1, 4))
        for n, kind in (
            ("a", MemoryKind.EXTERNAL_INPUT),
            ("b", MemoryKind.EXTERNAL_INPUT),
            ("y", MemoryKind.EXTERNAL_OUTPUT),
        )
    ] + [
        MemoryLocation(n, MemoryType.SB, MemoryKind.INTERNAL, tile_dtype, (1, 4), 1, at, 64)
        for n, at in (("sa", 0), ("sb", 64), ("sy", 128))
    ]

    def tile(name):
        return AccessPattern(name, ((1, 4),), 0, (), 0, 1)

    def dram(name):
        return AccessPattern(name, ((1, 4),))

    items = [
        Instruction(
            Opcode.DMA_COPY, Engine.DMA, tile("sa"), {"in": dram("a")}, {"queue": 0}, ORIGIN
        ),
        Instruction(
            Opcode.DMA_COPY, Engine.DMA, tile("sb"), {"in": dram("b")}, {"queue": 1}, ORIGIN
        ),
        Instruction(
            Opcode.TENSOR_TENSOR,
            engine,
            tile("sy"),
            {"in0": tile("sa"), "in1": tile("sb")},
            {"op": "add"},
            ORIGIN,
        ),
        Instruction(
            Opcode.DMA_COPY, Engine.DMA, dram("y"), {"in": tile("sy")}, {"queue": 0}, ORIGIN
        ),
    ]
    for number, inst in enumerate(items):
        inst.id = number
        inst.deps = [Dependency(source, DepKind.FLOW) for source in range(number)]
    fn = Function(
        "main", {loc.name: loc for loc in locations}, ["a", "b"], ["y"], BasicBlock("Block1")
    )
    fn.entry.items = items
    return Module("ints", [fn])


A = np.array([[2**24 + 1, 2**24 + 1, 7, -(2**30)]], np.int64)
B = np.array([[0, 2, -9, 5]], np.int64)


def _run(tmp_path: Path, module: Module, capsys) -> tuple[int, str, np.ndarray | None]:
    code, err, outputs = run_program(tmp_path, module, {"a": A, "b": B}, capsys)
    return code, err, outputs.get("y")


def test_an_int64_tile_is_refused_and_int32_runs(tmp_path, capsys):
    code, err, _ = _run(tmp_path, _program(Dtype.INT64, Engine.POOL), capsys)
    assert code == 1, err
    assert "INT64-DATAPATH: " in err and RULES["INT64-DATAPATH"].fact in err
    assert [rule for rule in RULES if f"{rule}: " in err] == ["INT64-DATAPATH"]
    code, err, y = _run(tmp_path, _program(Dtype.INT32, Engine.POOL), capsys)
    assert code == 0, err
    assert y.tolist() == (A + B).tolist()  # GpSimd: exact int32


def test_vector_engine_rounds_integers_through_fp32(tmp_path, capsys):
    code, err, y = _run(tmp_path, _program(Dtype.INT32, Engine.DVE), capsys)
    assert code == 0, err
    # 2^24 + 1 arrives as 2^24: sums 2^24 and 2^24 + 2 where GpSimd gives 2^24 + 1 and + 3;
    # -2^30 + 5 rounds back to -2^30 (fp32 steps are 128 there).
    assert y.tolist() == [[2**24, 2**24 + 2, -2, -(2**30)]]


# ---- models ------------------------------------------------------------------------------------


def _save(tmp_path: Path, nodes, inputs, outputs, initializers=()) -> str:
    graph = helper.make_graph(nodes, "ints", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "ints.onnx"
    onnx.save(model, path)
    return str(path)


def _const(name: str, value) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(value, np.int64), name)


def _flat_positions_model(tmp_path: Path) -> str:
    """flat = argmax(a, 1) · 4096 + argmax(b, 1): positions in [0, 4999 · 4096 + 4095]."""
    nodes = [
        helper.make_node("ArgMax", ["a"], ["p"], axis=1, keepdims=0),
        helper.make_node("ArgMax", ["b"], ["q"], axis=1, keepdims=0),
        helper.make_node("Mul", ["p", "stride"], ["row"]),
        helper.make_node("Add", ["row", "q"], ["flat"]),
    ]
    return _save(
        tmp_path,
        nodes,
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [6, 5000]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [6, 4096]),
        ],
        [helper.make_tensor_value_info("flat", TensorProto.INT64, [6])],
        [_const("stride", 4096)],
    )


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_index_arithmetic_past_2_24_is_narrowed_with_a_proof_and_exact(tmp_path, capsys):
    path = _flat_positions_model(tmp_path)
    assert main(["report", path, "--json"]) == 0
    doc = _json(capsys)
    flat = next(n for n in doc["int64"] if n["tensor"] == "flat")
    assert flat["proven"] and flat["range"] == [0, 4999 * 4096 + 4095]
    assert not [note for note in doc["notes"] if note["flag"] == "int64"]
    # Odd positions past 2^24, which fp32 cannot hold: the maxima sit at 4100 and 4095.
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 5000)), rng.standard_normal((6, 4096))
    a[:, 4100], b[:, 4095] = 100.0, 100.0
    feeds = save_arrays(
        tmp_path / "feeds.npz", {"a": a.astype(np.float32), "b": b.astype(np.float32)}, "input"
    )
    assert main(["validate", path, "--inputs", str(feeds), "--json"]) == 0
    doc = _json(capsys)
    assert doc["passed"], doc


def _arithmetic_on_input_model(tmp_path: Path) -> str:
    """y = x · 3 + 1 on an int64 input: nothing bounds x."""
    nodes = [
        helper.make_node("Mul", ["x", "three"], ["x3"]),
        helper.make_node("Add", ["x3", "one"], ["y"]),
    ]
    return _save(
        tmp_path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.INT64, [8])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [8])],
        [_const("three", 3), _const("one", 1)],
    )


def test_arithmetic_on_an_int64_input_is_reported_and_never_silently_exact(tmp_path, capsys):
    path = _arithmetic_on_input_model(tmp_path)
    assert main(["report", path]) == 0
    text = capsys.readouterr().out
    assert "note: int64: 'x' may overflow int32" in text
    assert main(["report", path, "--json"]) == 0
    doc = _json(capsys)
    doubtful = {n["tensor"]: n["root"] for n in doc["int64"] if not n["proven"]}
    assert doubtful == {"x": "x", "x3": "x", "y": "x"}

    def validate(x: np.ndarray) -> dict:
        feeds = save_arrays(tmp_path / "x.npz", {"x": x}, "input")
        main(["validate", path, "--inputs", str(feeds), "--json"])
        return _json(capsys)

    # Past 2^24, inside int32 (|3x + 1| < 2^31): exact on GpSimd.
    inside = np.arange(8, dtype=np.int64) * 99_991 + 2**24 + 1
    assert validate(inside)["passed"]
    # Past int32: the narrowed program wraps, and validation says so.
    beyond = inside + 2**40
    assert not validate(beyond)["passed"]


def test_a_constant_outside_int32_is_reported(tmp_path, capsys):
    nodes = [helper.make_node("Max", ["x", "floor"], ["y"])]
    path = _save(
        tmp_path,
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.INT64, [8])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [8])],
        [_const("floor", -(2**40))],
    )
    assert main(["report", path, "--json"]) == 0
    doc = _json(capsys)
    floor = next(n for n in doc["int64"] if n["tensor"] == "floor")
    assert not floor["proven"] and "outside int32" in floor["reason"]
    assert any("'floor'" in note["message"] for note in doc["notes"] if note["flag"] == "int64")


INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


def _slice_model(tmp_path: Path, starts, ends, steps, also_max: bool = False) -> str:
    """y = x[:, starts:ends:steps] with constant bounds; `also_max` reads `ends` in a Max as
    well (an int64 output e = max(n, ends) of an int64 input n), so it is no longer only a
    Slice bound."""
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])]
    width = len(range(8)[starts:ends:steps])  # Python's slice clamps as ONNX's does
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, width])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])]
    if also_max:
        nodes.append(helper.make_node("Max", ["n", "ends"], ["e"]))
        inputs.append(helper.make_tensor_value_info("n", TensorProto.INT64, [1]))
        outputs.append(helper.make_tensor_value_info("e", TensorProto.INT64, [1]))
    return _save(
        tmp_path,
        nodes,
        inputs,
        outputs,
        [
            _const("starts", [starts]),
            _const("ends", [ends]),
            _const("axes", [1]),
            _const("steps", [steps]),
        ],
    )


def test_slice_bounds_past_int32_are_clamped_not_overflows(tmp_path, capsys):
    """The "slice to the end" idiom (ends INT64_MAX, or INT64_MIN going backwards, or any value
    past the axis): Slice clamps it to the axis (ONNX spec), so it fits int32 and no note is
    printed; the slices validate."""
    for starts, ends, steps in ((1, INT64_MAX, 1), (-1, INT64_MIN, -1), (2**40, -(2**40), -2)):
        path = _slice_model(tmp_path, starts, ends, steps)
        assert main(["report", path, "--json"]) == 0
        doc = _json(capsys)
        assert not [note for note in doc["notes"] if note["flag"] == "int64"], doc["notes"]
        records = {n["tensor"]: n for n in doc["int64"]}
        for name, value in (("starts", starts), ("ends", ends)):
            if abs(value) < 2**31:
                continue
            record = records[name]
            assert record["proven"] and "clamped" in record["reason"], record
            assert -1 <= record["range"][0] <= record["range"][1] <= 8
        assert main(["validate", path]) == 0
        text = capsys.readouterr().out
        assert text.startswith("PASS") and "may overflow int32" not in text


def test_a_slice_bound_read_by_arithmetic_too_is_still_reported(tmp_path, capsys):
    path = _slice_model(tmp_path, 0, INT64_MAX, 1, also_max=True)
    assert main(["report", path, "--json"]) == 0
    doc = _json(capsys)
    ends = next(n for n in doc["int64"] if n["tensor"] == "ends")
    assert not ends["proven"] and "outside int32" in ends["reason"]
    assert any(
        "'ends' may overflow int32" in note["message"]
        for note in doc["notes"]
        if note["flag"] == "int64"
    )
