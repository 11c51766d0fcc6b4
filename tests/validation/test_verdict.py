"""The verdict against the emulating oracle: the checks of a narrow-stored intermediate, the
unverifiable rule, drift and its gate, outputs the user supplies, checkpoints that fail, and
`--localize` under the autocast (docs/validation.md#verdict)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import make_model
from onnx import helper
from validation_helpers import SMALL_CNN, corrupt_node, run, run_json

from onnx2bir.bir.cast_plan import CastPlan
from onnx2bir.bir.enums import Dtype
from onnx2bir.compiler import import_graph
from onnx2bir.errors import UserError
from onnx2bir.runtime.oracle.tolerance import Tolerance
from onnx2bir.runtime.oracle.verdict import (
    check_narrow,
    drift,
    drift_failures,
    parse_max_drift,
    taints,
    unverifiable_reason,
)
from onnx2bir.validation.text import DRIFT_NOTE_COSINE, DRIFT_NOTE_SNR_DB, drift_note

RESNET18 = SMALL_CNN.parent / "resnet18.onnx"
FP32 = Tolerance(1e-4, 1e-3)


def _bf16(values) -> np.ndarray:
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


# --- a narrow-stored intermediate -------------------------------------------------------------
def test_a_rounding_flipped_at_a_half_way_point_passes():
    """The oracle's value sits a hair below the half-way point between two bf16 values; the
    machine rounded up. Some value within the fp32 bound rounds there: it passes."""
    half_way = np.float32(1.0 + 2**-8)
    oracle = np.array([np.nextafter(half_way, np.float32(0))], np.float32)
    machine = _bf16([1.0 + 2**-7])
    assert _bf16(oracle)[0] == 1.0  # the oracle's own rounding went down
    assert check_narrow("t", machine, Dtype.BF16, oracle, FP32).passed


def test_a_value_no_rounding_of_the_bound_reaches_fails():
    oracle = np.array([1.0 + 2**-10], np.float32)  # far from any half-way point
    assert check_narrow("t", _bf16([1.0]), Dtype.BF16, oracle, FP32).passed
    assert not check_narrow("t", _bf16([1.0 + 2**-7]), Dtype.BF16, oracle, FP32).passed
    assert not check_narrow("t", _bf16([0.0]), Dtype.BF16, oracle, FP32).passed


# --- where the oracle is approximate ---------------------------------------------------------
@pytest.mark.parametrize("layout", [0, 1])
def test_an_unemulated_recurrence_chains_one_rounding_per_step(layout):
    """An LSTM that rounds its state inside the op rounds it once per step of its sequence
    (7 here, the batch 2): its output's statistical bound counts D = 7, not 1."""
    hidden, steps, batch = 3, 7, 2
    shape = (batch, steps, 4) if layout else (steps, batch, 4)
    rng = np.random.default_rng(0)
    proto = make_model(
        [
            helper.make_node(
                "LSTM", ["x", "w", "r"], ["y"], name="lstm", hidden_size=hidden, layout=layout
            ),
            helper.make_node("Relu", ["y"], ["out"], name="relu"),
        ],
        {"x": shape},
        {"out": None},
        initializers={
            "w": rng.standard_normal((1, 4 * hidden, 4)).astype(np.float32),
            "r": rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32),
        },
    )
    graph = import_graph(proto)
    found = taints(graph, CastPlan(unemulated={"lstm": "rounds its state"}), set())
    assert found["y"].depth == steps and found["out"].depth == steps
    assert found["out"].cause == "rounds its state"
    assert taints(graph, CastPlan(unemulated={"lstm": "x"}), {"y"}).get("out") is None


# --- bounds that cannot fail ------------------------------------------------------------------
def test_a_bound_that_accepts_zeros_is_unverifiable():
    reference = np.array([0.5, -0.5, 0.25])
    assert unverifiable_reason(Tolerance(1e-4, 1e-3), reference) is None
    assert "rtol" in unverifiable_reason(Tolerance(1e-4, 1.0), reference)
    assert "zeros" in unverifiable_reason(Tolerance(0.5, 1e-3), reference)
    # A reference of zeros is matched by zeros: that bound says the truth.
    assert unverifiable_reason(Tolerance(1e-4, 1e-3), np.zeros(3)) is None


@pytest.mark.parametrize("flags", [["--rtol", "1"], ["--atol", "10"]])
def test_an_unverifiable_output_fails_validation(capsys, flags):
    code, out, _ = run(["validate", SMALL_CNN, *flags], capsys)
    assert code == 1 and "UNVERIFIABLE" in out and "cannot tell a right answer from zeros" in out
    # Its bound already accepts zeros: no "would pass" beside it.
    assert "would pass" not in out and "margin:" not in out
    if flags[0] == "--atol":
        assert "is not above atol 10" in out and "--inputs" in out


def _scaled_model(tmp_path, scale: float) -> str:
    """y = x · scale: with scale 3e-7 the output of random inputs has an RMS of about 3e-7, as
    a trained detector's scores on noise do."""
    proto = make_model(
        helper.make_node("Mul", ["x", "s"], ["y"]),
        {"x": (4, 32)},
        {"y": (4, 32)},
        initializers={"s": np.array(scale, np.float32)},
    )
    path = tmp_path / "scaled.onnx"
    onnx.save(proto, path)
    return str(path)


def test_a_near_zero_output_is_unverifiable_and_asks_for_real_inputs(tmp_path, capsys):
    path = _scaled_model(tmp_path, 3e-7)
    code, out, _ = run(["validate", path], capsys)
    assert code == 1 and "UNVERIFIABLE" in out
    assert "the output is near zero for its bound" in out and "is not above atol 0.0001" in out
    assert "cannot tell a right answer from zeros" in out
    assert "real inputs with --inputs" in out and "--tolerance y=ATOL," in out
    assert "would pass" not in out and "rtol >= 0" not in out and "margin:" not in out
    code, doc = run_json(["validate", path], capsys)
    (y,) = doc["outputs"]
    assert code == 1 and y["verifiable"] is False
    assert 1e-7 < y["reference_rms"] < 1e-6 and y["reference_rms"] <= y["atol"]
    # Real inputs (here: large ones) bring the output above the bound: judged, and it passes.
    feeds = tmp_path / "real.npz"
    np.savez(feeds, x=np.full((4, 32), 1e3, np.float32))
    code, out, _ = run(["validate", path, "--inputs", feeds], capsys)
    assert code == 0 and "UNVERIFIABLE" not in out


# --- drift ------------------------------------------------------------------------------------
def test_drift_compares_with_fp32_and_with_the_emulations_own_distance():
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(1000)
    emulated = reference + rng.standard_normal(1000) * 1e-3
    record = drift(emulated, reference, emulated, "onnxruntime fp32")
    assert record["r"] == pytest.approx(1.0)
    twice = drift(reference + 2 * (emulated - reference), reference, emulated, "x")
    assert twice["r"] == pytest.approx(2.0)
    assert twice["snr_db"] == pytest.approx(record["snr_db"] - 20 * np.log10(2), abs=1e-9)
    assert drift(reference, reference, reference, "x")["r"] is None  # nothing was rounded
    assert drift(np.arange(3), np.arange(3), None, "x") is None  # integers drift not


def test_max_drift_parses_and_judges():
    limits = parse_max_drift(["cosine=0.999,snr=30", "r=1.2"])
    assert limits == {"cosine": 0.999, "snr": 30.0, "r": 1.2}
    good = {"cosine": 0.9999, "snr_db": 40.0, "r": 1.0}
    assert drift_failures(good, limits) == []
    bad = {"cosine": 0.99, "snr_db": 20.0, "r": 1.5}
    assert len(drift_failures(bad, limits)) == 3
    assert drift_failures({**good, "r": None}, limits) == []  # no R: nothing to break
    for text in ("cos=1", "cosine=2", "r=0", "snr=abc", "cosine"):
        with pytest.raises(UserError):
            parse_max_drift(text)


def test_the_drift_note_sits_at_cosine_0_999_and_snr_30_db():
    clean = {"cosine": 0.9995, "snr_db": 35.0, "r": 1.0}
    assert drift_note(clean) is None
    assert drift_note({**clean, "cosine": DRIFT_NOTE_COSINE}) is None  # at the threshold
    assert drift_note({**clean, "snr_db": DRIFT_NOTE_SNR_DB}) is None
    low_cosine = drift_note({**clean, "cosine": 0.95}, "m.onnx")
    assert "cosine 0.9500 < 0.999" in low_cosine and "SNR" not in low_cosine
    assert "onnx2bir debug precision m.onnx" in low_cosine and "--auto-cast-exclude" in low_cosine
    low_snr = drift_note({**clean, "snr_db": 10.0})
    assert "SNR 10.0 dB < 30 dB" in low_snr and "debug precision MODEL" in low_snr
    # No cast reaches the output (R null): its drift is not the autocast's to fix.
    assert drift_note({"cosine": 0.5, "snr_db": 3.0, "r": None}) is None
    assert drift_note(None) is None


def _cancelling_matmuls(tmp_path, eps: float) -> str:
    """y = x·W + x·W' with W' = -W + eps·R: the two products cancel to eps·x·R, so the bf16
    rounding of their operands (errors of 2^-9 of each product) is large beside y when eps is
    small, and small when it is 1."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 16)).astype(np.float32)
    proto = make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"]),
            helper.make_node("MatMul", ["x", "w2"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ],
        {"x": (4, 32)},
        {"y": (4, 16)},
        initializers={
            "w": w,
            "w2": (-w + eps * rng.standard_normal((32, 16))).astype(np.float32),
        },
    )
    path = tmp_path / f"cancelling_{eps}.onnx"
    onnx.save(proto, path)
    return str(path)


def test_a_pass_with_large_autocast_drift_gets_a_note(tmp_path, capsys):
    drifting = _cancelling_matmuls(tmp_path, 0.01)
    code, doc = run_json(["validate", drifting], capsys)
    (y,) = doc["outputs"]
    assert code == 0 and y["drift"]["cosine"] < 0.999 and y["drift"]["snr_db"] < 30
    code, out, _ = run(["validate", drifting], capsys)
    notes = [line for line in out.splitlines() if line.strip().startswith("note: large autocast")]
    assert code == 0 and len(notes) == 1
    assert f"onnx2bir debug precision {drifting}" in notes[0]
    assert "--auto-cast-exclude" in notes[0] and "--max-drift cosine=0.999,snr=30" in notes[0]
    # The same model in fp32, and a model whose products do not cancel: no note.
    code, out, _ = run(["validate", drifting, "--auto-cast", "none"], capsys)
    assert code == 0 and "large autocast drift" not in out
    code, out, _ = run(["validate", _cancelling_matmuls(tmp_path, 1.0)], capsys)
    assert code == 0 and "drift vs" in out and "large autocast drift" not in out
    # A drift gate that fails says so itself; the note is for passes.
    code, out, _ = run(["validate", drifting, "--max-drift", "cosine=0.999"], capsys)
    assert code == 1 and "FAIL --max-drift" in out and "large autocast drift" not in out


def test_the_json_carries_drift_and_the_default_is_within_the_fp32_bound(capsys):
    code, doc = run_json(["validate", RESNET18], capsys)
    (logits,) = doc["outputs"]
    assert code == 0 and logits["bound"] == "fp32"
    assert (logits["atol"], logits["rtol"]) == (1e-4, 1e-3)
    assert set(logits["drift"]) >= {"cosine", "snr_db", "max_abs_err", "r"}
    assert 0.99 < logits["drift"]["r"] < 1.2 and logits["drift"]["max_abs_err"] > 1e-3
    code, doc = run_json(["validate", RESNET18, "--auto-cast", "none"], capsys)
    assert code == 0 and doc["outputs"][0]["drift"]["r"] is None  # nothing rounded


def test_max_drift_turns_drift_into_a_gate(capsys):
    code, out, _ = run(["validate", SMALL_CNN, "--max-drift", "cosine=0.99"], capsys)
    assert code == 0
    code, out, _ = run(["validate", SMALL_CNN, "--max-drift", "snr=200"], capsys)
    assert code == 1 and "FAIL --max-drift: SNR" in out
    code, _, err = run(["validate", SMALL_CNN, "--max-drift", "bogus=1"], capsys)
    assert code == 2 and "--max-drift" in err


# --- outputs the user supplies ------------------------------------------------------------------
def test_drift_against_supplied_outputs(tmp_path, capsys):
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    code, doc = run_json(
        ["validate", SMALL_CNN, "--save-inputs", inputs, "--save-outputs", outputs], capsys
    )
    assert code == 0
    # The machine's own outputs as the reference: no drift at all, and the verdict unchanged.
    code, doc = run_json(
        ["validate", SMALL_CNN, "--inputs", inputs, "--reference", outputs], capsys
    )
    record = doc["outputs"][0]["drift"]
    assert code == 0 and record["max_abs_err"] == 0.0 and record["against"].endswith("out.npz")
    # Scaled by 1.05: the drift shows it, and --max-drift can fail on it.
    logits = np.load(outputs)["logits"]
    np.savez(outputs, logits=logits * 1.05)
    code, doc = run_json(
        [
            "validate",
            SMALL_CNN,
            "--inputs",
            inputs,
            "--reference",
            outputs,
            "--max-drift",
            "snr=30",
        ],
        capsys,
    )
    assert code == 1 and doc["outputs"][0]["drift_failures"]


def test_a_reference_folder_brings_its_inputs(tmp_path, capsys):
    folder = tmp_path / "test_data_set_0"
    run_json(["validate", SMALL_CNN, "--save-inputs", folder], capsys)
    code, doc = run_json(["validate", SMALL_CNN, "--save-outputs", tmp_path / "o.npz"], capsys)
    logits = np.load(tmp_path / "o.npz")["logits"]
    from onnx import numpy_helper

    (folder / "output_0.pb").write_bytes(
        numpy_helper.from_array(logits, "logits").SerializeToString()
    )
    code, doc = run_json(["validate", SMALL_CNN, "--reference", folder], capsys)
    assert code == 0 and doc["outputs"][0]["drift"]["max_abs_err"] == 0.0
    assert doc["inputs"][0]["source"].startswith("from ")


def test_a_reference_of_the_wrong_shape_is_bad_input(tmp_path, capsys):
    np.savez(tmp_path / "ref.npz", logits=np.zeros((2, 3), np.float32))
    np.savez(tmp_path / "in.npz", input=np.zeros((1, 3, 32, 32), np.float32))
    code, _, err = run(
        [
            "validate",
            SMALL_CNN,
            "--inputs",
            tmp_path / "in.npz",
            "--reference",
            tmp_path / "ref.npz",
        ],
        capsys,
    )
    assert code == 2 and "shape" in err


# --- checkpoints --------------------------------------------------------------------------------
def test_a_wrong_intermediate_fails_its_checkpoint_and_the_outputs_it_feeds(capsys, monkeypatch):
    """node_relu_2's result feeds a convolution, which rounds it: the probe there catches the
    error, and the logits computed from it fail too, naming it. (node_relu_2 runs on the
    eviction of node_conv2d_2, docs/conv_selection.md#fused-activations: that conv writes it.)"""
    corrupt_node(monkeypatch, "node_conv2d_2", amount=0.01)
    code, doc = run_json(["validate", SMALL_CNN, "--no-memory-plan"], capsys)
    failing = [c for c in doc["checkpoints"] if not c["passed"]]
    assert code == 1 and [c["name"] for c in failing] == ["relu_2"]
    assert (failing[0]["producer"], failing[0]["op_type"]) == ("node_relu_2", "Relu")
    assert failing[0]["fused_into"] == "node_conv2d_2"  # the conv that writes it
    assert doc["outputs"][0]["failed_upstream"] == ["relu_2"] and not doc["outputs"][0]["passed"]
    order = [c["producer"] for c in doc["checkpoints"]]  # in graph order
    nodes = [n.name for n in onnx.load(SMALL_CNN).graph.node]
    assert order == sorted(order, key=nodes.index)
    code, out, _ = run(["validate", SMALL_CNN, "--no-memory-plan"], capsys)
    # Stored in bf16: its one reader, node_conv2d_3's band loads, round it to bf16 anyway
    # (docs/autocast.md#weights), now that no padded fp32 copy of it is made.
    assert code == 1 and (
        "FAIL relu_2 (from Relu node_relu_2, fused into node_conv2d_2, stored bfloat16" in out
    )


def test_every_checkpoint_passes_on_a_right_program(capsys):
    code, doc = run_json(["validate", RESNET18, "--auto-cast", "all"], capsys)
    assert code == 0 and doc["checkpoints"] and all(c["passed"] for c in doc["checkpoints"])
    assert all(c["resynchronised"] for c in doc["checkpoints"])
    narrow = [c for c in doc["checkpoints"] if c["stored"] == "bfloat16"]
    assert narrow  # under `all` the intermediates are stored in bf16 and checked as such


def test_localize_under_the_autocast_flags_nothing_on_a_right_program(capsys):
    code, doc = run_json(["validate", RESNET18, "--localize"], capsys)
    loc = doc["localize"]
    assert code == 0 and loc["first_failing"] is None
    bounds = {t.get("bound") for n in loc["nodes"] for t in n["tensors"]}
    assert bounds == {"fp32"}


def test_localize_under_the_autocast_names_the_corrupted_node(capsys, monkeypatch):
    corrupt_node(monkeypatch, "node_conv2d_3", amount=0.01)
    code, doc = run_json(["validate", SMALL_CNN, "--localize"], capsys)
    assert code == 1 and doc["localize"]["first_failing"]["node"] == "node_conv2d_3"


def test_validate_json_names_the_casts(capsys):
    code, doc = run_json(["validate", SMALL_CNN], capsys)
    assert doc["casts"] and {"node", "input", "dtype"} <= set(doc["casts"][0])
    assert doc["emulation"]["resynchronised"] == doc["emulation"]["probes_read"] > 0
    json.dumps(doc)


# --- a Relu fused into its conv ---------------------------------------------------------------
def _cancelling_conv_relu():
    """Conv then Relu over 128 channels whose second 64 repeat the first with negated weights:
    every output is 0 in exact arithmetic, and in fp32 whatever the order of the 1,152 products
    leaves, up to about 0.2 on inputs of 1e4. The Relu is fused into the conv's eviction, so
    the conv's output is never stored: the Relu's output is what is checked."""
    rng = np.random.default_rng(0)
    half = rng.standard_normal((16, 64, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    weights = {"w": np.concatenate([half, -half], axis=1)}
    model = make_model(nodes, {"x": (1, 128, 8, 8)}, {"y": None}, initializers=weights)
    x = (rng.standard_normal((1, 64, 8, 8)) * 1e4).astype(np.float32)
    return model, {"x": np.concatenate([x, x], axis=1)}


def test_a_fused_relu_is_judged_with_its_convs_accumulation_allowance(monkeypatch):
    """|relu(a) - relu(b)| <= |a - b|: the Relu's output takes the allowance of the conv's sum
    (runtime/oracle/emulating.py `accumulation_source`). Without it the residues of the
    cancellation failed the fp32 bound. A conv corrupted by four times that allowance fails."""
    from onnx2bir.api.validate import validate

    model, feeds = _cancelling_conv_relu()
    doc = validate(model, inputs=feeds).document
    (output,) = doc["outputs"]
    assert doc["passed"] and output["max_abs_err"] > 1e-2  # the residues are there
    allowance = output["accumulation_allowance_max"]
    assert 0 < allowance < 1e3
    corrupt_node(monkeypatch, "conv", amount=4 * allowance)
    assert not validate(model, inputs=feeds).document["passed"]


@pytest.mark.parametrize(
    ("mode", "amount"),
    [("scale", 1.02), ("zero", 0.0), ("noise", 0.01)],
    ids=["2% gain", "zeros", "noise"],
)
def test_a_fused_relus_allowance_still_rejects_a_wrong_conv(monkeypatch, mode, amount):
    """The same conv and Relu on inputs that do not cancel: the allowance the Relu takes from
    the conv's sum is then far below the fp32 bound, and a conv 2% off, zeroed or noisy by
    0.01 fails; the right program passes."""
    from onnx2bir.api.validate import validate

    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    weights = {"w": (rng.standard_normal((16, 32, 3, 3)) / 17).astype(np.float32)}
    model = make_model(nodes, {"x": (1, 32, 8, 8)}, {"y": None}, initializers=weights)
    feeds = {"x": rng.standard_normal((1, 32, 8, 8)).astype(np.float32)}
    assert validate(model, inputs=feeds).document["passed"]
    corrupt_node(monkeypatch, "conv", mode=mode, amount=amount)
    assert not validate(model, inputs=feeds).document["passed"]


def _net_split_in_pairs(monkeypatch):
    """A conv net at batch 4 whose second stage the batch split runs two images at a time
    (the split's threshold lowered so that a 16 KiB image fits and a 32 KiB pair does not):
    its tensors there are stored as pieces of two images, probed and put back together."""
    from onnx2bir.patterns import batch_split

    monkeypatch.setattr(batch_split, "SPILL_BYTES", 20 * 1024)
    rng = np.random.default_rng(2)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a0"], name="a0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a0"], ["a1"], name="a1"),
        helper.make_node("Conv", ["a1", "wb0"], ["b0"], name="b0", strides=[2, 2]),
        helper.make_node("Relu", ["b0"], ["b1"], name="b1"),
        helper.make_node("Conv", ["b1", "wb1"], ["b2"], name="b2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["b2", "b0"], ["b3"], name="b3"),
        helper.make_node("Conv", ["b3", "wb2"], ["b4"], name="b4", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b4", "wb3"], ["y"], name="b5", pads=[1, 1, 1, 1]),
    ]
    inits = {
        "wa": w(16, 4, 3, 3),
        "wb0": w(32, 16, 2, 2),
        "wb1": w(32, 32, 3, 3),
        "wb2": w(32, 32, 3, 3),
        "wb3": w(32, 32, 3, 3),
    }
    model = make_model(nodes, {"x": (4, 4, 16, 16)}, {"y": None}, initializers=inits)
    feeds = {"x": rng.standard_normal((4, 4, 16, 16)).astype(np.float32)}
    return model, feeds


@pytest.mark.parametrize(
    ("mode", "amount"),
    [("scale", 1.02), ("zero", 0.0), ("noise", 0.01)],
    ids=["2% gain", "zeros", "noise"],
)
def test_a_wrong_pair_of_images_fails_its_checkpoint(monkeypatch, mode, amount):
    """b3 is computed two images at a time (pieces `b3@image0`, `b3@image2`, batch 2 each,
    Probe.images). The right program passes; the Add of images 2-3 alone 2% off, zeroed or
    noisy by 0.01 fails the checkpoint of b3, put back together from its pieces."""
    from onnx2bir.api.validate import validate
    from onnx2bir.bir.enums import MemoryType

    model, feeds = _net_split_in_pairs(monkeypatch)
    doc = validate(model, inputs=feeds).document
    assert doc["passed"]
    assert any(c["name"] == "b3" for c in doc["checkpoints"])
    corrupt_node(
        monkeypatch,
        "b3/images2-3",
        mode=mode,
        amount=amount,
        memories=(MemoryType.DRAM, MemoryType.SB),
    )
    doc = validate(model, inputs=feeds).document
    failing = [c["name"] for c in doc["checkpoints"] if not c["passed"]]
    assert not doc["passed"] and failing[0] == "b3"
