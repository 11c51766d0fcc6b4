"""A loop marked `parallel` means its iterations may run in any order (docs/dependencies.md
#parallel-loops): the verifier refuses one whose iterations conflict, `random:SEED` schedules
permute the iterations of the others, and every shipped model computes the same bits under
them. A hand-marked loop that accumulates into PSUM is the case the check exists for: refused
by `onnx2bir run`, and, with the check bypassed, wrong under a permutation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.bir.ir import Loop, all_loops
from onnx2bir.bir.parallel import RULE, parallel_hazards
from onnx2bir.bir.verify import verify_module
from onnx2bir.cli.commands import main
from onnx2bir.compiler import compile_model
from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.program import unroll
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import save_arrays, synthesize_inputs

ROOT = Path(__file__).resolve().parents[2]
BERT = ROOT / "models" / "bert.onnx"
LONG_ATTENTION = ROOT / "models" / "long_attention.onnx"
MODELS = sorted((ROOT / "models").glob("*.onnx"))


def _sequential_loops(fn) -> list[Loop]:
    return [loop for loop in all_loops(fn.entry) if not loop.parallel and loop.trip_count >= 2]


def _accumulating(fn) -> list[Loop]:
    """The sequential loops whose body accumulates a matmul into PSUM."""
    return [
        loop
        for loop in _sequential_loops(fn)
        if any(
            i.opcode == "Matmult" and i.attrs.get("accumulate") for i in loop.body.instructions()
        )
    ]


def test_every_sequential_loop_marked_parallel_is_refused():
    fn = compile_model(BERT, CompileOptions()).module.functions[0]
    loops = _sequential_loops(fn)
    assert loops
    assert not parallel_hazards(fn)
    for loop in loops:
        loop.parallel = True
        hazards = parallel_hazards(fn)
        assert [h.axis for h in hazards] == [loop.axis]
        loop.parallel = False


def test_run_refuses_a_hand_marked_accumulating_loop(tmp_path, capsys):
    assert main(["convert", str(LONG_ATTENTION), "-o", str(tmp_path)]) == 0
    program = tmp_path / "long_attention.bir.json"
    module = compile_model(LONG_ATTENTION, CompileOptions()).module
    feeds = synthesize_inputs(import_model(LONG_ATTENTION), 0)
    inputs = save_arrays(tmp_path / "in.npz", feeds, "input")
    assert main(["run", str(program), "--inputs", str(inputs)]) == 0  # as written, it runs

    axis = _accumulating(module.functions[0])[0].axis
    doc = json.loads(program.read_text())
    for loop in _json_loops(doc["functions"][0]["entry"]):
        if loop["axis"] == axis:
            loop["parallel"] = True
    program.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["run", str(program), "--inputs", str(inputs)]) == 1  # a hardware rule
    message = capsys.readouterr().err
    assert RULE in message and repr(axis) in message


def _json_loops(block: dict):
    for item in block["items"]:
        if "body" in item:
            yield item
            yield from _json_loops(item["body"])


def test_a_permutation_changes_what_a_wrongly_parallel_loop_computes():
    """With the check bypassed, a permuted order sums the accumulation in another order and
    the answer changes: the check refuses exactly what a reordering scheduler would break."""
    module = compile_model(LONG_ATTENTION, CompileOptions()).module
    feeds = synthesize_inputs(import_model(LONG_ATTENTION), 0)
    reference = run_function(module, feeds)
    changed = []
    for loop in _accumulating(module.functions[0]):
        loop.parallel = True
        assert any(RULE in problem for problem in verify_module(module))  # refused ...
        for seed in (1, 2, 3):
            run = run_scheduled(module, feeds, parse_schedule(f"random:{seed}"), False)
            changed.append(any(not np.array_equal(v, reference[k]) for k, v in run.outputs.items()))
        loop.parallel = False
    assert any(changed)  # ... for good reason


def test_random_schedules_permute_parallel_iterations():
    # (bert's head loops; unet's parallel loops of more than two trips were the layout
    # transposes of its conv kernels, which are now folded into the kernels)
    fn = compile_model(ROOT / "models" / "bert.onnx", CompileOptions()).module.functions[0]
    parallel = [loop.axis for loop in all_loops(fn.entry) if loop.parallel and loop.trip_count > 2]
    assert parallel
    plain = unroll(fn)
    permuted = unroll(fn, permute=np.random.default_rng([1, 1]))
    assert len(plain) == len(permuted)

    def values(program, axis):
        return [v[axis] for v in program.loop_values if axis in v]

    assert any(values(plain, a) != values(permuted, a) for a in parallel)
    for axis in parallel:  # the same iterations, another order
        assert sorted(values(plain, axis)) == sorted(values(permuted, axis))


@pytest.mark.parametrize("model", MODELS, ids=lambda p: p.stem)
def test_every_model_is_bit_identical_under_permuted_schedules(model):
    module = compile_model(model, CompileOptions()).module
    feeds = synthesize_inputs(import_model(model), 0)
    reference = run_function(module, feeds)
    for seed in (1, 2):
        run = run_scheduled(module, feeds, parse_schedule(f"random:{seed}"), True)
        assert run.races == []
        for name, value in run.outputs.items():
            assert np.array_equal(value, reference[name], equal_nan=True), (name, seed)
