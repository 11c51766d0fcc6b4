"""The emulating oracle's plain run computes the model's tensors first, its allowances only when
read: the same arrays, to the bit, as one run asked for everything (validation/run.py)."""

from __future__ import annotations

import numpy as np
from validation_helpers import SMALL_CNN

from onnx2bir.options import CompileOptions
from onnx2bir.runtime.oracle.emulating import (
    ACCUMULATION_SUFFIX,
    accumulates,
    round_weights,
    run_emulating,
)
from onnx2bir.runtime.oracle.ort import synthesize_inputs
from onnx2bir.validation.prepared import prepare
from onnx2bir.validation.run import PlainEmulation, oracle_runner


def _asked(prepared) -> list[str]:
    """What the verdict asks of the plain run: outputs, probes and their allowances."""
    graph, plan = prepared.pristine, prepared.compilation.cast_plan
    probes = [t for t in plan.probes if t in graph.tensors]
    tensors = list(dict.fromkeys([*graph.outputs, *probes]))
    return tensors + [t + ACCUMULATION_SUFFIX for t in tensors if accumulates(graph, t)]


def test_the_plain_run_reads_allowances_only_when_asked_and_gets_the_same_bits():
    prepared = prepare(str(SMALL_CNN), CompileOptions())
    feeds = synthesize_inputs(prepared.pristine, 0)
    wanted = _asked(prepared)
    allowances = [t for t in wanted if t.endswith(ACCUMULATION_SUFFIX)]
    assert allowances and len(wanted) > len(prepared.pristine.outputs) + len(allowances)
    plain = oracle_runner(prepared, feeds)({}, wanted)
    assert isinstance(plain, PlainEmulation)
    assert not any(dict.__contains__(plain, t) for t in allowances)  # not computed yet
    plan = prepared.compilation.cast_plan
    rounded = round_weights(prepared.folded, prepared.weights, plan)
    whole = run_emulating(
        prepared.folded, prepared.pristine, prepared.weights, plan, feeds, {}, wanted, rounded
    )
    for name in wanted:  # an allowance read makes the second run
        assert plain[name].tobytes() == whole[name].tobytes(), name
    assert plain.get("no such tensor") is None and "no such tensor" not in plain


def test_a_resynchronised_run_and_a_run_without_probes_are_made_at_once():
    prepared = prepare(str(SMALL_CNN), CompileOptions())
    feeds = synthesize_inputs(prepared.pristine, 0)
    runner = oracle_runner(prepared, feeds)
    graph = prepared.pristine
    outputs = list(graph.outputs)
    summed = [t + ACCUMULATION_SUFFIX for t in outputs if accumulates(graph, t)]
    only_outputs = runner({}, [*outputs, *summed])
    assert not isinstance(only_outputs, PlainEmulation) and all(t in only_outputs for t in summed)
    probe = next(
        t
        for t in prepared.compilation.cast_plan.probes
        if t in graph.tensors and accumulates(graph, t)
    )
    value = np.asarray(runner({}, [probe])[probe])
    fed = runner({probe: value}, [*outputs, probe + ACCUMULATION_SUFFIX])
    assert not isinstance(fed, PlainEmulation) and probe + ACCUMULATION_SUFFIX in fed
