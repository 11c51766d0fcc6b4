"""ONNX's own conformance suites under `onnx2bir validate` (benchmarks/conformance.py), slow.

Every node case written from the installed onnx package and every shipped PyTorch-converted,
PyTorch-operator and simple case is validated as a user would; the run must show no valid
model called bad input (exit 2), no wrong answer, no crash or timeout, and the pass counts of
docs/conformance.md. A mismatch where onnxruntime (the oracle) is what departs from the
suite's expected outputs, the machine matching them, is counted apart (`oracle_deviation`).
About 2 minutes on 2 cores: `pytest -m slow tests/conformance`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import conformance  # noqa: E402

MIN_PASS = {"node": 1450, "pytorch+simple": 128}


@pytest.mark.slow
def test_the_suites_show_no_bad_input_no_wrong_answer_no_crash(tmp_path):
    records = tmp_path / "cases.json"
    conformance.main(["--cases", str(tmp_path / "cases"), "--jobs", "2", "--json", str(records)])
    summary = json.loads(records.read_text())["summary"]["suites"]
    for suite, counts in summary.items():
        for outcome in ("bad_input", "mismatch", "crash", "timeout"):
            assert counts.get(outcome, 0) == 0, (suite, outcome, counts)
        assert counts.get("pass", 0) >= MIN_PASS[suite], (suite, counts)
