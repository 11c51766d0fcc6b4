"""`onnx2bir debug precision`: on the 1024-token attention block under fp8 e4m3 (cosine 0.962
from fp32) it finds nodes to keep in fp32 that bring the drift to the target, the file it
writes does that under validate, no node of the set can be dropped, and what cannot be met or
searched is said (docs/debug.md#precision)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnx2bir.cli.commands import main
from onnx2bir.options import read_exclude_file

ROOT = Path(__file__).resolve().parents[2]
LONG_ATTENTION = ROOT / "models" / "long_attention.onnx"
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"
FP8 = ["--auto-cast-type", "fp8_e4m3"]
TARGET = "cosine=0.9999"


def _precision(capsys, args) -> tuple[int, dict]:
    code = main(["debug", "precision", *[str(a) for a in args], "--json", "--quiet"])
    return code, json.loads(capsys.readouterr().out)


def _cosine(capsys, model, extra) -> tuple[int, float]:
    code = main(["validate", str(model), *FP8, "--max-drift", TARGET, "--json", *extra])
    doc = json.loads(capsys.readouterr().out)
    return code, min(o["drift"]["cosine"] for o in doc["outputs"])


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_the_exclusion_set_meets_the_target_and_is_minimal(tmp_path, capsys, direction):
    out = tmp_path / "keep.txt"
    code, doc = _precision(
        capsys,
        [LONG_ATTENTION, *FP8, "--max-drift", TARGET, "-o", out, "--dir", direction],
    )
    assert code == 0 and doc["meets"] and doc["before"]["meets"] is False
    names = read_exclude_file(out)
    assert names == [entry["node"] for entry in doc["excluded"]]
    assert 0 < len(names) < doc["casting_nodes"]
    code, cosine = _cosine(capsys, LONG_ATTENTION, [])
    assert code == 1 and cosine < 0.9999  # without the file the target fails
    code, cosine = _cosine(capsys, LONG_ATTENTION, ["--auto-cast-exclude-file", str(out)])
    assert code == 0 and cosine >= 0.9999
    for name in names:  # no node of the set can be dropped
        rest = [n for n in names if n != name]
        extra = ["--auto-cast-exclude", ",".join(rest)] if rest else []
        code, cosine = _cosine(capsys, LONG_ATTENTION, extra)
        assert code == 1 and cosine < 0.9999


def test_a_target_already_met_keeps_nothing(tmp_path, capsys):
    out = tmp_path / "keep.txt"
    code, doc = _precision(capsys, [SMALL_CNN, "--max-drift", "cosine=0.99", "-o", out])
    assert code == 0 and doc["excluded"] == [] and doc["evaluations"] == 1
    assert read_exclude_file(out) == []


def test_a_target_not_even_fp32_meets_fails_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "keep.txt"
    code, doc = _precision(capsys, [SMALL_CNN, "--max-drift", "snr=400", "-o", out])
    assert code == 1 and not doc["meets"] and doc["all_fp32"]["meets"] is False
    assert not out.exists()


def test_nothing_to_search_without_an_autocast(tmp_path, capsys):
    code = main(
        ["debug", "precision", str(SMALL_CNN), "--auto-cast", "none", "--max-drift", TARGET]
        + ["-o", str(tmp_path / "k.txt"), "--quiet"]
    )
    assert code == 2 and "casts nothing" in capsys.readouterr().err


def test_the_drift_target_is_required(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["debug", "precision", str(SMALL_CNN), "-o", str(tmp_path / "k.txt")])
    assert exit_.value.code == 2 and "--max-drift" in capsys.readouterr().err
