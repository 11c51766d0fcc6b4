"""The robustness fuzzer: mutated models from `models/` and flag combinations, run through the
command line. No run may end in exit 3, hang, or show a traceback; a model onnxruntime refuses
to load must be refused too, unless `ACCEPTED_BY_DESIGN` says why it is not.

The slow test runs 2,400 examples with Hypothesis's fixed-seed (derandomized) generation and
prints its statistics (mutants by kind, outcomes); the default suite runs a smoke sample of a
few seconds. `python -m pytest tests/robustness/test_fuzz.py -m slow -s` shows the table.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort
import pytest
from fuzz_mutations import Kind, Mutant, Outcome, make_mutant, prepare_side_files, run_cli
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

# onnxruntime refuses these models but onnx2bir accepts them, on purpose: (pattern of
# onnxruntime's message, why onnx2bir's acceptance is right).
ACCEPTED_BY_DESIGN = [
    (
        r"Please load external data into raw data for tensor",
        "onnxruntime's own shape inference wants this initializer's bytes inside the model; "
        "onnx2bir reads external data that lies inside the model's folder",
    ),
    (
        r"Type Error: Type \(tensor\(int8\)\) of input parameter|"
        r"Type Error: Type \(tensor\(bool\)\) of input parameter",
        "an initializer converted to a dtype the op does not take that folding evaluated "
        "at compile time (the node is gone before onnxruntime's check would apply)",
    ),
    (
        r"NOT_IMPLEMENTED : Could not find an implementation for",
        "onnxruntime has no kernel for some old versions of an op (Less-1, Add-6 inside a Loop "
        "body at opset 6); the ONNX spec defines them, the model passes onnx's checker, and "
        "onnx2bir lowers them by their semantics",
    ),
    (
        r"two nodes with same node name",
        "node names are diagnostic in ONNX and onnx's checker accepts repeats; onnx2bir gives a "
        "repeated name a suffix (docs/input_contracts.md, rule 9)",
    ),
]


KEEP = os.environ.get("ONNX2BIR_FUZZ_KEEP")


@dataclass
class Stats:
    by_kind: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    by_kind_outcome: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    disagreements: list = field(default_factory=list)
    accepted_by_design: Counter = field(default_factory=Counter)

    def table(self) -> str:
        kinds = sorted(self.by_kind)
        columns = [o for o in Outcome if self.outcomes[o]]
        lines = [f"{'kind':<20}{'total':>7}" + "".join(f"{o.value:>11}" for o in columns)]
        for kind in kinds:
            lines.append(
                f"{kind:<20}{self.by_kind[kind]:>7}"
                + "".join(f"{self.by_kind_outcome[kind, o]:>11}" for o in columns)
            )
        lines.append(
            f"{'all':<20}{sum(self.by_kind.values()):>7}"
            + "".join(f"{self.outcomes[o]:>11}" for o in columns)
        )
        for reason, count in self.accepted_by_design.items():
            lines.append(f"accepted by design ({count}): {reason}")
        return "\n".join(lines)


def _onnxruntime_refuses(path: Path) -> str | None:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return " ".join(str(exc).split())[:300] or type(exc).__name__
    return None


def _run(mutant: Mutant, stats: Stats) -> None:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        model = tmp / "model.onnx"
        model.write_bytes(mutant.model)
        for name, data in mutant.side_files.items():
            (tmp / name).write_bytes(data)
        prepare_side_files(tmp)
        argv = [mutant.command, str(model), *(a.replace("{tmp}", folder) for a in mutant.args)]
        if mutant.command == "convert":
            argv += ["-o", str(tmp / "out")]
        outcome, err = run_cli(argv)
        kind = mutant.kind.value
        stats.by_kind[kind] += 1
        stats.outcomes[outcome] += 1
        stats.by_kind_outcome[kind, outcome] += 1
        if outcome in (Outcome.INTERNAL, Outcome.HANG, Outcome.TRACEBACK, Outcome.OTHER):
            if KEEP:  # ONNX2BIR_FUZZ_KEEP=DIR keeps the failing models for a closer look
                shutil.copy(model, Path(KEEP) / f"{kind}-{len(stats.failures)}.onnx")
            stats.failures.append((outcome.value, kind, mutant.detail, argv[2:], err[-400:]))
            return
        if outcome is Outcome.REFUSED and len(err.strip().splitlines()) != 1:
            stats.failures.append(("not one line", kind, mutant.detail, argv[2:], err[-400:]))
        if mutant.kind is Kind.FLAGS or outcome not in (Outcome.OK, Outcome.MISMATCH):
            return
        refusal = _onnxruntime_refuses(model)
        if refusal is None:
            return
        for pattern, reason in ACCEPTED_BY_DESIGN:
            if re.search(pattern, refusal):
                stats.accepted_by_design[reason] += 1
                return
        stats.disagreements.append((kind, mutant.detail, refusal))


def fuzz(examples: int) -> Stats:
    stats = Stats()

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def one(data):
        _run(make_mutant(data.draw), stats)

    one()
    return stats


def _assert_clean(stats: Stats) -> None:
    print("\n" + stats.table())
    assert not stats.failures, "\n".join(map(str, stats.failures[:20]))
    assert not stats.disagreements, "onnxruntime refuses, onnx2bir accepts:\n" + "\n".join(
        map(str, stats.disagreements[:20])
    )


def test_fuzz_smoke():
    """A few seconds of the fuzzer in the default suite."""
    stats = fuzz(12)
    _assert_clean(stats)
    assert sum(stats.by_kind.values()) == 12


@pytest.mark.slow
def test_fuzz_structural_and_flags():
    stats = fuzz(2400)
    _assert_clean(stats)
    assert sum(stats.by_kind.values()) >= 2000
    assert len(stats.by_kind) == len(Kind)
