"""`onnx2bir debug reduce`: models of `models/` made to fail in three ways are cut down to the
culprit, in both modes; every candidate is a model onnxruntime loads; bad input is refused.

The failing models are built here from the committed ones: an op onnx2bir has no lowering for
(RandomNormalLike) inserted in the middle of resnet18, resnet18's MaxPool given
storage_order=1 (which the lowering refuses, with its reason), and a check script that fails
while the model holds a MaxPool.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from onnx2bir.cli.commands import main
from onnx2bir.validation.subgraph import Cutter, all_values

ROOT = Path(__file__).resolve().parents[2]
RESNET18 = ROOT / "models" / "resnet18.onnx"
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"
MODES = ("bisect", "linear")


def _insert_after(model: onnx.ModelProto, index: int, op_type: str, **attrs) -> onnx.ModelProto:
    """`model` with a node of `op_type` reading node `index`'s output, in its readers' place."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    nodes = list(result.graph.node)
    tensor = nodes[index].output[0]
    inserted = helper.make_node(op_type, [tensor], [tensor + "_x"], name="culprit", **attrs)
    for node in nodes[index + 1 :]:
        node.input[:] = [tensor + "_x" if t == tensor else t for t in node.input]
    nodes.insert(index + 1, inserted)
    del result.graph.node[:]
    result.graph.node.extend(nodes)
    return result


@pytest.fixture(scope="module")
def unsupported(tmp_path_factory) -> Path:
    model = onnx.load(RESNET18)
    middle = next(i for i, n in enumerate(model.graph.node) if i >= 33 and n.op_type == "Relu")
    path = tmp_path_factory.mktemp("models") / "unsupported.onnx"
    onnx.save(_insert_after(model, middle, "RandomNormalLike"), path)
    return path


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> Path:
    model = onnx.load(RESNET18)
    pool = next(n for n in model.graph.node if n.op_type == "MaxPool")
    pool.name = "culprit"
    for attribute in pool.attribute:
        if attribute.name == "storage_order":
            attribute.i = 1
    path = tmp_path_factory.mktemp("models") / "refused.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def check_script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("check") / "no_maxpool.py"
    path.write_text(
        "import sys, onnx\n"
        "model = onnx.load(sys.argv[1])\n"
        "sys.exit(1 if any(n.op_type == 'MaxPool' for n in model.graph.node) else 0)\n"
    )
    return path


def _reduce(capsys, args: list[str]) -> tuple[int, dict]:
    code = main(["debug", "reduce", *[str(a) for a in args], "--json", "--quiet"])
    return code, json.loads(capsys.readouterr().out)


def _loads(path: Path) -> onnx.ModelProto:
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model


@pytest.mark.parametrize("mode", MODES)
def test_an_unsupported_op_in_the_middle_is_cut_out(unsupported, tmp_path, capsys, mode):
    out = tmp_path / "small.onnx"
    code, doc = _reduce(capsys, [unsupported, "-o", out, "--mode", mode])
    model = _loads(out)
    assert code == 0 and doc["nodes_before"] == 70 and doc["nodes_after"] <= 3
    assert "culprit" in [n.name for n in model.graph.node]
    assert doc["failure"]["kind"] == "unsupported op" and doc["culprit"]["node"] == "culprit"
    code = main(["report", str(out)])
    assert code == 1 and "RandomNormalLike" in capsys.readouterr().out  # the command shows it
    if mode == "bisect":
        assert doc["evaluations"] <= 2 * int(np.ceil(np.log2(70))) + 2


@pytest.mark.parametrize("mode", MODES)
def test_a_refused_node_is_cut_out_with_its_reason(refused, tmp_path, capsys, mode):
    out = tmp_path / "small.onnx"
    code, doc = _reduce(capsys, [refused, "-o", out, "--mode", mode])
    model = _loads(out)
    assert code == 0 and doc["nodes_after"] <= 3
    assert "culprit" in [n.name for n in model.graph.node]
    assert "storage_order=1 is not supported" in doc["failure"]["message"]
    assert doc["failure"] == doc["original_failure"]  # the same refusal, word for word
    assert doc["command"].startswith("onnx2bir report ")


@pytest.mark.parametrize("mode", MODES)
def test_a_check_command_decides_what_fails(check_script, tmp_path, capsys, mode):
    out = tmp_path / "small.onnx"
    check = f"{sys.executable} {check_script} {{}}"
    code, doc = _reduce(capsys, [SMALL_CNN, "-o", out, "--mode", mode, "--check", check])
    model = _loads(out)
    assert code == 0 and doc["nodes_after"] <= 3
    assert "MaxPool" in [n.op_type for n in model.graph.node]
    assert doc["failure"]["kind"] == "check command" and doc["command"].endswith(str(out))


def test_fail_regex_narrows_what_counts(check_script, tmp_path, capsys):
    """The check prints nothing, so no output matches: the model does not fail."""
    check = f"{sys.executable} {check_script}"
    code = main(
        ["debug", "reduce", str(SMALL_CNN), "-o", str(tmp_path / "x.onnx"), "--check", check]
        + ["--fail-regex", "never printed", "--quiet"]
    )
    assert code == 2 and "does not fail" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_a_model_that_passes_has_nothing_to_reduce(tmp_path, capsys):
    code = main(["debug", "reduce", str(SMALL_CNN), "-o", str(tmp_path / "x.onnx"), "--quiet"])
    assert code == 2 and "nothing to reduce" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--check", "no-such-command-here {}"], "no such command"),
        (["-o", "."], "refusing to replace it"),
        (["--inputs", "missing.npz"], "missing.npz"),
    ],
)
def test_bad_input_is_one_line(refused, tmp_path, capsys, extra, message):
    args = ["debug", "reduce", str(refused), "--quiet"]
    if "-o" not in extra:
        args += ["-o", str(tmp_path / "x.onnx")]
    code = main(args + extra)
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_an_unknown_mode_is_a_usage_error(refused, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["debug", "reduce", str(refused), "-o", str(tmp_path / "x.onnx"), "--mode", "up"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


# --- the cuts themselves ----------------------------------------------------------------------
def test_a_cut_computes_what_the_model_computes_on_its_values():
    """Every cut of small_cnn ending at node k and beginning at node j, run on onnxruntime with
    the original run's values at its inputs, gives the original run's values at its outputs."""
    model = onnx.load(SMALL_CNN)
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32), np.float32)}
    values = all_values(model, feeds)
    cutter = Cutter(model, feeds, values)
    for last in range(len(cutter.nodes)):
        for cut in (cutter.truncated(last), *(cutter.upstream(last, j) for j in range(last + 1))):
            session = ort.InferenceSession(
                cut.model.SerializeToString(), providers=["CPUExecutionProvider"]
            )
            names = [o.name for o in session.get_outputs()]
            for name, got in zip(names, session.run(names, cut.feeds), strict=True):
                np.testing.assert_allclose(got, values[name], rtol=1e-5, atol=1e-6)


def test_a_cut_freezes_what_does_not_depend_on_the_inputs():
    """A Reshape's shape, computed by a node from constants, stays a constant when the cut
    begins after that node; the float it reshapes becomes a graph input."""
    model = onnx.load(SMALL_CNN)
    feeds = {"input": np.zeros((1, 3, 32, 32), np.float32)}
    cutter = Cutter(model, feeds, all_values(model, feeds))
    reshape = next(i for i, n in enumerate(cutter.nodes) if n.op_type == "Reshape")
    cut = cutter.upstream(reshape, reshape)
    inputs = [i.name for i in cut.model.graph.input]
    data, shape = cutter.nodes[reshape].input[:2]
    assert inputs == [data] and data in cut.feeds
    assert shape in [i.name for i in cut.model.graph.initializer]
