"""Shared pieces of the validation tests: the CLI runner, small models, the corruption hook.

The corruption hook is test-only and lives entirely outside the product code: it wraps the
entries of the interpreter's semantics table so that, after any instruction of one ONNX node
writes DRAM, the region it wrote is perturbed. It therefore hits every simulation the command
runs — the full model and the one-node re-run — exactly like a real kernel bug would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import MemoryType
from onnx2bir.cli.commands import main
from onnx2bir.runtime.machine import semantics

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"
SMALL_CNN_ORDER = [
    "node_conv2d",
    "node_relu",
    "node_conv2d_1",
    "node_relu_1",
    "node_conv2d_2",
    "node_relu_2",
    "node_conv2d_3",
    "node_add",
    "node_relu_3",
    "node_conv2d_4",
    "node_relu_4",
    "node_max_pool2d",
    "node_mean",
    "node_view",
    "node_linear",
]


def run(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv, capsys) -> tuple[int, dict]:
    code, out, err = run([*argv, "--json"], capsys)
    assert code in (0, 1), err
    return code, json.loads(out, parse_constant=_no_constant)


def _no_constant(name: str):
    raise AssertionError(f"the JSON holds {name}, which is not JSON")


def perturb(
    machine, ins, loop_values, node: str, mode: str, amount: float, memories=(MemoryType.DRAM,)
) -> None:
    """After an instruction of `node` writes one of `memories` (DRAM), change the region it
    wrote: `mode` "add" (`amount` added), "scale" (multiplied by `amount`), "noise" (normal
    noise of deviation `amount`), "zero" or "nan"."""
    if ins.origin.node != node or ins.dst is None:
        return
    if machine.locations[ins.dst.loc].memory not in memories:
        return
    view = machine.operands(ins)["dst"].view(loop_values)
    if mode == "nan":
        view[...] = np.nan
    elif mode == "zero":
        view[...] = 0
    elif mode == "scale":
        view *= np.asarray(amount, view.dtype)
    elif mode == "noise":
        noise = np.random.default_rng(0).standard_normal(view.shape) * amount
        view += noise.astype(view.dtype)
    else:
        view += np.asarray(amount, view.dtype)


def corrupt_node(
    monkeypatch, node: str, mode: str = "add", amount: float = 0.5, memories=(MemoryType.DRAM,)
) -> None:
    """Make every simulation perturb the results of `node` in `memories` (DRAM; test-only
    hook)."""
    for opcode, function in list(semantics.SEMANTICS.items()):

        def wrapped(machine, ins, loop_values, _function=function):
            _function(machine, ins, loop_values)
            perturb(machine, ins, loop_values, node, mode, amount, memories)

        monkeypatch.setitem(semantics.SEMANTICS, opcode, wrapped)


def observer_factory(node: str, mode: str = "add", amount: float = 0.5):
    """The same corruption as an observer for `localize.simulate(factories=...)`."""

    def factory(machine):
        return lambda ins, loop_values: perturb(machine, ins, loop_values, node, mode, amount)

    return factory


def model(nodes, inputs, outputs, initializers=None, opset=18) -> onnx.ModelProto:
    """A checked model; inputs/outputs are {name: (elem_type, shape)}."""
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in (initializers or {}).items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def save(proto: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(proto.SerializeToString())
    return path


F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
