"""DynamicFor and DoWhile loops on the machine, in the verifier and in the JSON schema.

Hand-built modules: a counter in DRAM incremented by the body (DMA to SBUF, add 1 on VectorE,
DMA back) so the number of trips is read off the result; expected counts follow from the loop
definitions (docs/loops.md), not from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from onnx2bir.bir.enums import Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    DoWhile,
    DynamicLoop,
    Function,
    Instruction,
    MemoryLocation,
    Module,
    Origin,
    RuntimeValue,
)
from onnx2bir.bir.json_io import module_from_json, module_to_json
from onnx2bir.bir.verify import verify_module
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine import interpreter
from onnx2bir.runtime.machine.interpreter import run_function

SCHEMA = json.loads((Path(__file__).parents[2] / "onnx2bir" / "bir" / "schema.json").read_text())
_ids = iter(range(10**6))


def dram(name, kind, dtype=Dtype.INT64, shape=(1,)):
    return MemoryLocation(name, MemoryType.DRAM, kind, dtype, shape)


def ins(opcode, engine, dst, srcs=None, **attrs):
    return Instruction(opcode, engine, dst, srcs or {}, attrs, Origin("n", "test"), next(_ids))


def d_ap(name):
    return AccessPattern(name, ((1, 1),))


SB = AccessPattern("acc", ((1, 1),), 0, (), 0, 1)


def count_body(extra=()):
    """count += 1 (through an SBUF tile), then whatever `extra` adds."""
    return BasicBlock(
        "block0",
        [
            ins(Opcode.DMA_COPY, Engine.DMA, SB, {"in": d_ap("count")}, queue=0),
            ins(Opcode.TENSOR_SCALAR, Engine.DVE, SB, {"in": SB}, op0="add", imm0=1),
            ins(Opcode.DMA_COPY, Engine.DMA, d_ap("count"), {"in": SB}, queue=0),
            *extra,
        ],
    )


def counting_module(loop, extra_locs=()):
    locs = [
        dram("count", MemoryKind.EXTERNAL_OUTPUT),
        dram("n", MemoryKind.EXTERNAL_INPUT),
        MemoryLocation("acc", MemoryType.SB, MemoryKind.INTERNAL, Dtype.INT32, (1, 1), 1, 0, 4),
        *extra_locs,
    ]
    zero = ins(Opcode.MEMSET, Engine.POOL, SB, value=0)
    store = ins(Opcode.DMA_COPY, Engine.DMA, d_ap("count"), {"in": SB}, queue=0)
    fn = Function("main", {loc.name: loc for loc in locs}, ["n"], ["count"])
    fn.entry.items = [zero, store, loop]
    return Module("m", [fn])


def trips(module, n) -> int:
    return int(run_function(module, {"n": np.array([n], np.int64)})["count"][0])


@pytest.mark.parametrize("bound", [0, 1, 5])
def test_dynamic_for_reads_its_bound_at_entry(bound):
    loop = DynamicLoop("i", 0, 1, 1, body=count_body(), stop_value=RuntimeValue("n"))
    module = counting_module(loop)
    assert not verify_module(module)
    assert trips(module, bound) == bound


def test_dynamic_for_with_start_and_step():
    loop = DynamicLoop("i", 2, 5, 3, body=count_body(), stop_value=RuntimeValue("n"))
    # axis = 2, 5, 8 below 10: three trips.
    assert trips(counting_module(loop), 10) == 3


def _while_module(is_do_while: bool):
    """count += 1 while count < n: the condition location is recomputed by the body."""
    cond = AccessPattern("flag", ((1, 1),), 0, (), 0, 1)
    bound = AccessPattern("bound", ((1, 1),), 0, (), 0, 1)
    extra = [
        ins(Opcode.DMA_COPY, Engine.DMA, bound, {"in": d_ap("n")}, queue=1),
        ins(Opcode.TENSOR_TENSOR, Engine.DVE, cond, {"in0": SB, "in1": bound}, op="is_lt"),
        ins(Opcode.DMA_COPY, Engine.DMA, d_ap("go"), {"in": cond}, queue=1),
    ]
    loop = DoWhile(
        "w",
        0,
        1,
        1,
        body=count_body(extra),
        continue_condition=RuntimeValue("go"),
        is_do_while=is_do_while,
    )
    locs = [
        dram("go", MemoryKind.INTERNAL, Dtype.INT32),
        MemoryLocation("flag", MemoryType.SB, MemoryKind.INTERNAL, Dtype.INT32, (1, 1), 1, 64, 4),
        MemoryLocation("bound", MemoryType.SB, MemoryKind.INTERNAL, Dtype.INT32, (1, 1), 1, 128, 4),
    ]
    module = counting_module(loop, locs)
    # Before the loop: go = 0 < n, computed like the body does.
    head = [
        ins(Opcode.DMA_COPY, Engine.DMA, bound, {"in": d_ap("n")}, queue=1),
        ins(Opcode.TENSOR_TENSOR, Engine.DVE, cond, {"in0": SB, "in1": bound}, op="is_lt"),
        ins(Opcode.DMA_COPY, Engine.DMA, d_ap("go"), {"in": cond}, queue=1),
    ]
    entry = module.functions[0].entry.items
    entry[2:2] = head
    return module


@pytest.mark.parametrize("n", [0, 1, 4])
def test_do_while_tests_before_or_after(n):
    before, after = _while_module(False), _while_module(True)
    assert not verify_module(before) and not verify_module(after)
    assert trips(before, n) == n  # a while loop: no trip when n == 0
    assert trips(after, n) == max(n, 1)  # a do-while loop: always one trip


def test_constant_condition_and_endless_loop_guard(monkeypatch):
    never = DoWhile("w", 0, 1, 1, body=count_body(), continue_condition=False, is_do_while=True)
    assert trips(counting_module(never), 0) == 1
    forever = DoWhile("w", 0, 1, 1, body=count_body(), continue_condition=True)
    monkeypatch.setattr(interpreter, "MAX_RUNTIME_TRIPS", 10)
    with pytest.raises(MachineError, match="still running after 10 trips"):
        trips(counting_module(forever), 0)


def test_loop_locals_die_with_the_region():
    local = dram("scratch", MemoryKind.INTERNAL, Dtype.FP32)
    out = dram("after", MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32)
    write = ins(Opcode.DMA_COPY, Engine.DMA, d_ap("scratch"), {"in": d_ap("count")}, queue=2)
    loop = DynamicLoop(
        "i",
        0,
        1,
        1,
        body=count_body([write]),
        stop_value=RuntimeValue("n"),
        local_locations=("scratch",),
    )
    module = counting_module(loop, [local, out])
    fn = module.functions[0]
    read_after = ins(Opcode.DMA_COPY, Engine.DMA, d_ap("after"), {"in": d_ap("scratch")}, queue=2)
    fn.entry.items.append(read_after)
    fn.outputs.append("after")
    problems = verify_module(module)
    assert any("lives only inside function 'main': DynamicLoop 'i'" in p for p in problems), (
        problems
    )
    # On the machine the read after the region sees the sentinel (NaN), not the last value.
    got = run_function(module, {"n": np.array([3], np.int64)})
    assert np.isnan(got["after"][0]) and got["count"][0] == 3


def test_verifier_checks_runtime_values():
    bad = DynamicLoop("i", 0, 1, 1, body=count_body(), stop_value=RuntimeValue("acc"))
    problems = verify_module(counting_module(bad))
    assert any("bound names 'acc', not a DRAM location" in p for p in problems), problems
    far = DynamicLoop("i", 0, 1, 1, body=count_body(), stop_value=RuntimeValue("n", 3))
    problems = verify_module(counting_module(far))
    assert any("offset 3 outside 'n'" in p for p in problems), problems


def test_runtime_loops_in_json_follow_the_schema():
    modules = [
        counting_module(DynamicLoop("i", 0, 1, 1, body=count_body(), stop_value=RuntimeValue("n"))),
        _while_module(True),
    ]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for module in modules:
        doc = module_to_json(module)
        validator.validate(doc)
        again = module_from_json(doc)
        assert module_to_json(again) == doc
        assert trips(again, 4) == trips(module, 4)
