"""Every case of the robustness corpus gives its exit status and one line naming the problem,
and none gives exit 3 (an internal error)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from corpus_cases import CASES, CORPUS, Case

from onnx2bir.cli.commands import main


def _files(tmp):
    os.mkfifo(tmp / "fifo")
    (tmp / "folder.npz").mkdir()
    np.savez(tmp / "strings.npz", x=np.full((1, 4, 8, 8), "a"))
    np.savez(tmp / "complex.npz", x=np.ones((1, 4, 8, 8), np.complex64))
    np.savez(tmp / "structured.npz", x=np.zeros((1, 4, 8, 8), [("a", "f4"), ("b", "i4")]))
    np.savez(tmp / "void.npz", x=np.zeros((1, 4, 8, 8), "V4"))
    np.savez(tmp / "datetime.npz", x=np.zeros((1, 4, 8, 8), "M8[s]"))
    # A header claiming 2^40 float32 elements, with no data: refused before allocating.
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 1), np.float32))
    header["shape"] = (1 << 20, 1 << 20)
    with open(tmp / "huge.npy", "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
    import zipfile

    with zipfile.ZipFile(tmp / "huge.npz", "w") as archive:
        archive.write(tmp / "huge.npy", "x.npy")
    (tmp / "t400.json").write_text(json.dumps({"default": {"atol": 10**400}}))
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)


def run_case(case: Case, tmp, capsys) -> tuple[int, str]:
    _files(tmp)
    code = main(case.args(tmp))
    _, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_case(case, tmp_path, capsys):
    try:
        code = run_case(case, tmp_path, capsys)
    except SystemExit as exc:  # argparse's usage errors
        code = (exc.code, capsys.readouterr().err)
    code, err = code
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == case.exit, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("onnx2bir: error: "), err
    assert case.message in lines[0], err
    assert "_dim_arg" not in err and "usage:" not in err


def test_corpus_files_are_current(tmp_path):
    """The committed files are what make_corpus.py writes (so a case cannot drift)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, model in module.models().items():
        data = model if isinstance(model, bytes) else model.SerializeToString()
        assert (CORPUS / f"{name}.onnx").read_bytes() == data, name


def test_the_valid_corpus_model_passes(capsys):
    assert main(["validate", str(CORPUS / "ok.onnx")]) == 0


def test_a_node_nothing_reads_is_dropped_not_crashed_on(capsys):
    """A node whose outputs nothing reads once crashed code generation (KeyError: '')."""
    assert main(["validate", str(CORPUS / "dead_node.onnx")]) == 0
    assert capsys.readouterr().out.startswith("PASS")
