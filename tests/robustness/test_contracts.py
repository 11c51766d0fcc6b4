"""The import-time contracts one by one: each refusal names its node, attribute or figure;
what onnxruntime loads and runs is not refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main
from onnx2bir.errors import UserError
from onnx2bir.frontend import memory_contracts as contracts_memory
from onnx2bir.frontend.importer import import_model

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18, ir_version=10, opsets=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()] if inits else [],
    )
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in opsets)]
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version)


def _refused(model, *fragments):
    with pytest.raises(UserError) as info:
        import_model(model)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _ort_loads(model) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


RELU = helper.make_node("Relu", ["x"], ["y"], name="relu")


def test_ir_version_newer_than_onnx_knows():
    model = _model([RELU], {"x": [2]}, {"y": [2]}, ir_version=onnx.IR_VERSION + 1)
    _refused(model, f"IR version {onnx.IR_VERSION + 1}")


def test_ml_opset_newer_than_onnx_knows():
    model = _model([RELU], {"x": [2]}, {"y": [2]}, opsets=[("ai.onnx.ml", 99)])
    _refused(model, "ai.onnx.ml opset 99")
    assert not _ort_loads(model)


def test_a_domain_imported_twice():
    model = _model([RELU], {"x": [2]}, {"y": [2]}, opsets=[("ai.onnx", 17)])
    _refused(model, "imports domain 'ai.onnx' twice")


def test_an_op_that_does_not_exist_at_the_opset():
    node = helper.make_node("Gelu", ["x"], ["y"], name="gelu")  # Gelu arrived in opset 20
    model = _model([node], {"x": [2]}, {"y": [2]}, opset=18)
    _refused(model, "node 'gelu' (Gelu)", "opset 18")
    assert not _ort_loads(model)


def test_an_unnamed_output():
    model = _model([RELU], {"x": [2]}, {"": [2]})
    _refused(model, "graph output #0 has no name")


def test_conv_transpose_channels_disagree():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up")
    model = _model(
        [node], {"x": [1, 4, 5, 5]}, {"y": None}, {"w": np.ones((3, 2, 2, 2), np.float32)}
    )
    _refused(model, "node 'up' (ConvTranspose)", "3 input channels; the input has 4")


def test_conv_bias_of_the_wrong_size():
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")
    inits = {"w": np.ones((8, 4, 1, 1), np.float32), "b": np.ones(5, np.float32)}
    model = _model([node], {"x": [1, 4, 5, 5]}, {"y": None}, inits)
    _refused(model, "bias 'b' has shape [5]; expected [8]")  # onnxruntime fails at run time


def test_pool_auto_pad_value_and_kernel():
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], auto_pad="HALF"
    )
    model = _model([node], {"x": [1, 4, 6, 6]}, {"y": None})
    _refused(model, "node 'pool' (MaxPool): auto_pad 'HALF'")
    assert not _ort_loads(model)


def test_pads_with_auto_pad_are_refused_as_onnxruntime_refuses_them():
    node = helper.make_node(
        "Conv",
        ["x", "w"],
        ["y"],
        name="conv",
        kernel_shape=[3, 3],
        auto_pad="SAME_UPPER",
        pads=[1, 1, 1, 1],
    )
    w = np.ones((4, 4, 3, 3), np.float32)
    model = _model([node], {"x": [1, 4, 6, 6]}, {"y": None}, {"w": w})
    _refused(model, "node 'conv' (Conv): pads and auto_pad 'SAME_UPPER' are both given")
    assert not _ort_loads(model)


def test_softmax_axis_out_of_range():
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-3)
    model = _model([node], {"x": [2, 3]}, {"y": [2, 3]})
    _refused(model, "node name: sm", "'axis' must be in [-2 , 1]")
    assert not _ort_loads(model)


def test_gather_elements_constant_index():
    node = helper.make_node("GatherElements", ["t", "i"], ["y"], name="ge", axis=1)
    model = _model(
        [node], {"t": [2, 3]}, {"y": [2, 2]}, {"i": np.array([[0, 2], [1, -4]], np.int64)}
    )
    _refused(model, "node 'ge' (GatherElements): constant index -4", "[-3, 3) along axis 1")


def test_negative_constant_indices_in_range_are_accepted():
    node = helper.make_node("Gather", ["t", "i"], ["y"], name="g")
    model = _model([node], {"t": [5, 2]}, {"y": [2, 2]}, {"i": np.array([-5, 4], np.int64)})
    assert import_model(model).outputs == ["y"]


def test_validate_refuses_a_peak_over_the_limit_before_any_work(tmp_path, capsys):
    """A small limit: exit 2, the estimate by part and the --segments advice, and nothing run
    (no outputs written)."""
    model = _model([RELU], {"x": [1 << 20]}, {"y": [1 << 20]})
    path = tmp_path / "relu.onnx"
    path.write_bytes(model.SerializeToString())
    saved = tmp_path / "outputs.npz"
    argv = ["validate", str(path), "--no-progress", "--save-outputs", str(saved)]
    assert main([*argv, "--memory-limit", "1MiB"]) == 2
    err = capsys.readouterr().err
    assert "validate would need about" in err and "more than 0.000977 GiB (--memory-limit)" in err
    assert "the comparison" in err and "--segments 2" in err
    assert not saved.exists()
    assert main([*argv, "--memory-limit", "1GiB"]) == 0


def test_weights_over_the_limit_are_refused_before_the_compile(tmp_path, capsys, monkeypatch):
    """Twice the file's weights over the limit: refused before the model is read whole."""
    import onnx2bir.validation.run as validation_run

    weight = np.ones((1024, 1024), np.float32)  # 4 MiB
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    model = _model([node], {"x": [1, 1024]}, {"y": [1, 1024]}, {"w": weight})
    path = tmp_path / "matmul.onnx"
    path.write_bytes(model.SerializeToString())

    def compiled(*args, **kwargs):
        raise AssertionError("compiled before the memory check")

    monkeypatch.setattr(validation_run, "prepare", compiled)
    assert main(["validate", str(path), "--no-progress", "--memory-limit", "6MiB"]) == 2
    assert "(the compile alone), more than 0.00586 GiB" in capsys.readouterr().err


def test_the_peak_estimate_counts_each_part():
    """One 4 MiB intermediate, probed and compared: the oracle holds it four times (machine,
    plain, resynchronised, allowance) beside its intermediates, the comparison twelve float64
    arrays of its elements."""
    model = _model([RELU], {"x": [1 << 20]}, {"y": [1 << 20]})
    graph = import_model(model)
    estimate = contracts_memory.estimate_validate_peak(graph, ("y",), {}, 0)
    size = 4 << 20
    assert estimate.weights == 0 and estimate.machine_constants == 0
    assert estimate.intermediates == 2 * size  # x and y
    assert estimate.oracle == 2 * size + 4 * size
    assert estimate.comparison == 12 * 8 * (1 << 20)
    assert estimate.total == 6 * size + 12 * 8 * (1 << 20)


def test_the_device_figure_is_named(tmp_path, capsys):
    model = _model([RELU], {"x": [1 << 33]}, {"y": [1 << 33]})
    path = tmp_path / "big.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["convert", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "tensor 'x' needs 32 GiB, more than the modelled device DRAM (16 GiB" in err
    assert not (tmp_path / "out").exists()


def test_exit_3_asks_for_a_report_naming_model_command_and_version(capsys, monkeypatch):
    import onnx2bir.cli.commands as cli

    def broken(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setitem(cli.COMMANDS, "report", broken)
    assert main(["report", "m.onnx", "--stats"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "internal error (a bug in onnx2bir 0.1.0, please report it" in err
    assert "the model m.onnx" in err and "`onnx2bir report m.onnx --stats`" in err
    assert err.rstrip().endswith("ZeroDivisionError: division by zero)")


def test_a_vendor_add_is_not_absorbed_into_an_mlp_bias(tmp_path, capsys):
    """vit's fc2 bias Add moved to com.microsoft: the MLP raise once took it as its bias."""
    model = onnx.load(str(Path(__file__).resolve().parents[2] / "models" / "vit.onnx"))
    node = next(n for n in model.graph.node if n.name == "node_linear_5")
    node.domain = "com.microsoft"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    path = tmp_path / "vit_ms.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["convert", str(path), "-o", str(tmp_path / "out")]) == 2
    assert "unsupported ops in vit_ms: com.microsoft.Add x1" in capsys.readouterr().err
    assert not _ort_loads(model)


@pytest.mark.parametrize(
    "target, fragments",
    [
        # onnx's shape inference does not compare the counts: the contract does.
        ([5, 3], ("node 'rs' (Reshape)", "cannot reshape [2, 6] (12 elements) to [5, 3]")),
        # These the shape inference refuses first, naming the node too.
        ([-1, 5], ("node name: rs", "incompatible shapes")),
        ([-1, -1], ("node name: rs", "multiple -1")),
    ],
)
def test_a_reshape_that_changes_the_element_count_is_bad_input(target, fragments):
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")
    model = _model([node], {"x": [2, 6]}, {"y": None}, {"s": np.array(target, np.int64)})
    _refused(model, *fragments)
    assert not _ort_runs(model, {"x": np.zeros((2, 6), np.float32)})


@pytest.mark.parametrize("target", [[3, 4], [0, -1], [-1], [1, 12]])
def test_a_reshape_that_keeps_the_count_is_accepted(target):
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")
    model = _model([node], {"x": [2, 6]}, {"y": None}, {"s": np.array(target, np.int64)})
    assert import_model(model).outputs == ["y"]
    assert _ort_runs(model, {"x": np.zeros((2, 6), np.float32)})


def _ort_runs(model, feeds) -> bool:
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        session.run(None, feeds)
    except Exception:
        return False
    return True


@pytest.mark.parametrize(
    "text, size", [("6GiB", 6 << 30), ("512MiB", 512 << 20), ("8GB", 8 * 10**9), ("2e9", 2 * 10**9)]
)
def test_memory_limit_sizes(text, size):
    from onnx2bir.cli.flag_values import byte_size

    assert byte_size(text) == size


@pytest.mark.parametrize("text", ["0", "6XB", "GiB", "-1GiB", "nan", "inf"])
def test_memory_limit_refuses_what_is_not_a_size(text):
    import argparse

    from onnx2bir.cli.flag_values import byte_size

    with pytest.raises(argparse.ArgumentTypeError, match="expected a size"):
        byte_size(text)
