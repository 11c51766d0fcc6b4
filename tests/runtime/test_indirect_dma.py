"""The indirect DMA (DmaGather): rows of a DRAM table picked by row numbers in an SBUF tile
(docs/neuroncore.md#dma, docs/device_time.md#dma).

Gather and GatherND with runtime indices lower to it and match onnxruntime (float and integer
tables, negative indices, several index components); an index outside the table is refused by
the machine with the index and the table named; its cost follows the rows gathered, not the
table's size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import Opcode
from onnx2bir.cli.commands import main
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.errors import MachineError
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import save_arrays
from onnx2bir.runtime.timing.cost import estimate


def _gather_model(rows: int, row: int, picks: tuple[int, ...], elem=TensorProto.FLOAT, axis=0):
    """y = Gather(table, ids): the table an initializer, the ids a graph input."""
    rng = np.random.default_rng(0)
    dtype = np.float32 if elem == TensorProto.FLOAT else np.int64
    table = (rng.standard_normal((rows, row)) * 100).astype(dtype)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=axis)],
        "gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, list(picks))],
        [helper.make_tensor_value_info("y", elem, None)],
        [numpy_helper.from_array(table, "table")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), table


def _compiled(model):
    return compile_graph(import_graph(model), CompileOptions(auto_cast="none"))


def _opcodes(compiled) -> set:
    return {inst.opcode for inst in compiled.module.functions[0].instructions()}


@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64], ids=["float", "int64"])
@pytest.mark.parametrize("picks", [(7,), (2, 150)], ids=["7", "2x150"])
def test_gather_with_runtime_indices_is_an_indirect_dma(elem, picks):
    model, table = _gather_model(1000, 24, picks, elem)
    compiled = _compiled(model)
    assert Opcode.DMA_GATHER in _opcodes(compiled)
    assert Opcode.MATMULT not in _opcodes(compiled)  # no one-hot over the table
    rng = np.random.default_rng(1)
    ids = rng.integers(-1000, 1000, picks).astype(np.int64)  # negatives count from the end
    got = assert_matches_onnxruntime(model, feeds={"ids": ids})
    location = "y" if "y" in got else "y:output"
    np.testing.assert_array_equal(got[location], table[ids])  # bit for bit: a copy


def test_gather_nd_folds_its_components_into_a_row():
    data = np.arange(4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3)
    graph = helper.make_graph(
        [helper.make_node("GatherND", ["data", "ids"], ["y"])],
        "gather_nd",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [6, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 3])],
        [numpy_helper.from_array(data, "data")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert Opcode.DMA_GATHER in _opcodes(_compiled(model))
    ids = np.array([[0, 0], [3, 4], [1, -1], [-4, 2], [2, 3], [3, 0]], np.int64)
    assert_matches_onnxruntime(model, feeds={"ids": ids})


def test_an_index_outside_the_table_is_refused(tmp_path: Path, capsys):
    model, _ = _gather_model(50, 8, (4,))
    compiled = _compiled(model)
    with pytest.raises(MachineError, match=r"index 50 \(partition 2\) is outside table"):
        run_function(compiled.module, {"ids": np.array([0, 1, 50, 3], np.int64)})
    # The same through `onnx2bir run`: the machine rejects the program, exit 1.
    onnx_path = tmp_path / "gather.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    assert main(["convert", str(onnx_path), "-o", str(tmp_path)]) == 0
    inputs = save_arrays(tmp_path / "bad.npz", {"ids": np.array([0, -51, 1, 2])}, "input")
    capsys.readouterr()
    assert main(["run", str(tmp_path / "gather.bir.json"), "--inputs", str(inputs)]) == 1
    err = capsys.readouterr().err
    assert "DMA-OOB: " in err and "outside table" in err


def test_its_cost_follows_the_rows_gathered_not_the_table():
    """128 tokens looked up in a 1,024-row and a 30,522-row embedding table (hidden 768):
    the same estimate within 5%; the one-hot selection it replaces grew with the table."""
    seconds = {}
    for rows in (1024, 30522):
        model, _ = _gather_model(rows, 768, (1, 128))
        seconds[rows] = estimate(_compiled(model).module).total_seconds
    assert seconds[30522] == pytest.approx(seconds[1024], rel=0.05)
    # A wrong model of its cost (the table's bytes moved) would be 30x apart.
    assert seconds[30522] < 2 * seconds[1024]
