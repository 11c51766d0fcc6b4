"""LSTM, GRU and RNN in the emulating oracle: computed step by step (a Scan whose body is one
step in plain ONNX ops) with the program's roundings, judged at the fp32 bound plus the gates'
summation allowance (docs/validation.md#recurrent-ops).

The steps against onnxruntime's own ops without rounding (every direction, both layouts, with
and without bias and initial states, both GRU reset forms); the state's rounding at every step
against numpy; the machine's Y taken as h_{t-1}; the cast plan read off the program (the
projection's X and W under the default autocast, the recurrent product's R and state when its
operands are narrow); and validations of hand-built models under the default autocast that
pass at the fp32 bound and fail when the machine's output is off by a little more than it."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import make_model
from onnx import helper
from validation_helpers import run_json

from onnx2bir.bir.cast_plan import CastPlan, CastPoint
from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen.cast_plan import _recurrent_points
from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.runtime.machine import semantics
from onnx2bir.runtime.oracle.emulating import (
    ACCUMULATION_SUFFIX,
    run_emulating,
)
from onnx2bir.runtime.oracle.ort import run_onnxruntime
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
STATES = {"LSTM": ["y", "yh", "yc"], "GRU": ["y", "yh"], "RNN": ["y", "yh"]}


def _recurrent(
    op,
    direction="forward",
    layout=0,
    hidden=16,
    inp=5,
    seq=6,
    batch=3,
    bias=True,
    initial=True,
    seed=1,
    consumer=False,
    opset=18,
    **attrs,
):
    """(model, feeds, outputs): one recurrent node "rec" with seeded weights; with `consumer`,
    a Relu reads Y (so Y is an intermediate the program stores: a probe) and the outputs are
    relu(Y), Y_h and Y_c."""
    rng = np.random.default_rng(seed)
    gates, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    scale = 1 / np.sqrt(hidden)  # torch's initialisation: the gates stay out of saturation
    weights = {
        "w": rng.uniform(-scale, scale, (dirs, gates * hidden, inp)).astype(np.float32),
        "r": rng.uniform(-scale, scale, (dirs, gates * hidden, hidden)).astype(np.float32),
    }
    names = ["x", "w", "r", "b" if bias else "", ""]
    if bias:
        weights["b"] = rng.uniform(-scale, scale, (dirs, 2 * gates * hidden)).astype(np.float32)
    inputs = {"x": (batch, seq, inp) if layout else (seq, batch, inp)}
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    if initial:
        names.append("h0")
        inputs["h0"] = state
        if op == "LSTM":
            names.append("c0")
            inputs["c0"] = state
    outputs = list(STATES[op])
    node = helper.make_node(
        op,
        names,
        outputs,
        name="rec",
        hidden_size=hidden,
        direction=direction,
        **({"layout": layout} if layout else {}),  # an attribute from opset 14 on
        **attrs,
    )
    nodes = [node]
    if consumer:
        nodes.append(helper.make_node("Relu", ["y"], ["out"], name="relu"))
        outputs = ["out", *outputs[1:]]
    proto = make_model(nodes, inputs, dict.fromkeys(outputs), opset, weights)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}
    return proto, feeds, outputs


def _onnxruntime(op, direction, layout, feeds, **kw):
    """onnxruntime's own op; its CPU kernels refuse layout 1, so that one runs on the
    transposed inputs of the layout-0 model and its outputs are transposed back."""
    if not layout:
        proto, _, outputs = _recurrent(op, direction, 0, **kw)
        return run_onnxruntime(proto.SerializeToString(), feeds, outputs)
    proto, _, outputs = _recurrent(op, direction, 0, **kw)
    flipped = {name: value.transpose(1, 0, 2) for name, value in feeds.items()}
    got = run_onnxruntime(proto.SerializeToString(), flipped, outputs)
    return {
        name: value.transpose(2, 0, 1, 3) if name == "y" else value.transpose(1, 0, 2)
        for name, value in got.items()
    }


def _stepped(proto, feeds, outputs, plan=None, machine=None):
    """The oracle's step form (asked for the allowances, which only it computes)."""
    wanted = outputs + [name + ACCUMULATION_SUFFIX for name in outputs]
    return run_emulating(proto, import_graph(proto), {}, plan or CastPlan(), feeds, machine, wanted)


# --- the steps, without rounding, against onnxruntime's own op ----------------------------------
CASES = [
    ("LSTM", {}),
    ("GRU", {"linear_before_reset": 0}),
    ("GRU", {"linear_before_reset": 1}),
    ("RNN", {}),
]


@pytest.mark.parametrize("op, attrs", CASES, ids=["lstm", "gru", "gru-lbr", "rnn"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("given", [True, False], ids=["bias-initial", "bare"])
def test_the_steps_compute_what_onnxruntimes_own_op_computes(op, attrs, direction, layout, given):
    kw = dict(bias=given, initial=given, **attrs)
    proto, feeds, outputs = _recurrent(op, direction, layout, **kw)
    got = _stepped(proto, feeds, outputs)
    want = _onnxruntime(op, direction, layout, feeds, **kw)
    for name in outputs:
        assert got[name].shape == want[name].shape
        assert np.abs(got[name] - want[name]).max() < 2e-6, name
        allowance = got[name + ACCUMULATION_SUFFIX]
        assert allowance.shape == want[name].shape
        assert np.all(allowance > 0) and allowance.max() < 1e-4  # a few fp32 ULPs of Σ|t|


def test_other_activations_and_a_wide_lstm_match_onnxruntime():
    kw = dict(activations=["Relu", "Tanh", "Sigmoid"], hidden=256, inp=40, seq=5, batch=2)
    proto, feeds, outputs = _recurrent("LSTM", **kw)
    got, want = _stepped(proto, feeds, outputs), _onnxruntime("LSTM", "forward", 0, feeds, **kw)
    assert max(np.abs(got[n] - want[n]).max() for n in outputs) < 2e-6


# --- the roundings inside the steps -------------------------------------------------------------
def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _numpy_steps(op, feeds, weights, lbr=0):
    """Forward LSTM/GRU in float64, rounding what the plan of `test_the_state_is_rounded...`
    rounds: X, W and R, and at every step the state (GRU without linear_before_reset: r⊙h)
    before its product with R."""
    x, w, r, b = (
        _bf16(feeds["x"]),
        _bf16(weights["w"][0]),
        _bf16(weights["r"][0]),
        weights["b"][0].astype(np.float64),
    )
    hidden = r.shape[1]
    wb, rb = b[: b.size // 2], b[b.size // 2 :]
    h = feeds["h0"][0].astype(np.float64)
    c = feeds.get("c0", np.zeros((1, *h.shape)))[0].astype(np.float64)
    ys = []
    for x_t in x:
        if op == "LSTM":
            a = x_t @ w.T + wb + rb + _bf16(h) @ r.T
            i, o, f, g = (a[:, k * hidden : (k + 1) * hidden] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
        else:
            xw = x_t @ w.T + wb
            zr = xw[:, : 2 * hidden] + _bf16(h) @ r[: 2 * hidden].T + rb[: 2 * hidden]
            z, reset = _sigmoid(zr[:, :hidden]), _sigmoid(zr[:, hidden:])
            if lbr:
                inner = reset * (_bf16(h) @ r[2 * hidden :].T + rb[2 * hidden :])
            else:
                inner = _bf16(reset * h) @ r[2 * hidden :].T + rb[2 * hidden :]
            cand = np.tanh(xw[:, 2 * hidden :] + inner)
            h = (1 - z) * cand + z * h
        ys.append(h)
    return np.stack(ys)[:, None]


@pytest.mark.parametrize("op, lbr", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
def test_the_state_is_rounded_at_every_step_where_the_plan_says(op, lbr):
    """A plan with a "recurrent" point on R (the recurrent products take R and the state in
    bf16): the oracle rounds h_{t-1} (GRU's r⊙h_{t-1}) at every step, as numpy does; without
    the state's rounding the result is as far off as bf16 makes it."""
    attrs = {"linear_before_reset": lbr} if op == "GRU" else {}
    proto, feeds, outputs = _recurrent(op, seq=8, hidden=32, **attrs)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    points = (
        CastPoint("rec", "x", "bfloat16", "operand"),
        CastPoint("rec", "w", "bfloat16", "operand"),
        CastPoint("rec", "r", "bfloat16", "recurrent"),
    )
    want = _numpy_steps(op, feeds, weights, lbr)
    got = _stepped(proto, feeds, outputs, CastPlan(points))["y"]
    assert np.abs(got - want).max() < 2e-6
    operands_only = CastPlan((*points[:2], dataclasses.replace(points[2], kind="operand")))
    assert np.abs(_stepped(proto, feeds, outputs, operands_only)["y"] - want).max() > 1e-4


def test_before_opset_13_the_steps_round_with_the_arithmetic_form():
    """No Cast to bfloat16 before opset 13: the body rounds the state with the arithmetic
    rounding, bit for bit what the Cast pair gives at opset 18."""
    plan = CastPlan((CastPoint("rec", "r", "bfloat16", "recurrent"),))
    got = {}
    for opset in (11, 18):
        proto, feeds, outputs = _recurrent("GRU", "bidirectional", opset=opset)
        got[opset] = _stepped(proto, feeds, outputs, plan)
    for name in outputs:
        np.testing.assert_array_equal(got[11][name], got[18][name])


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_each_step_starts_from_the_machines_h(op):
    """With Y resynchronised, step t reads the machine's Y[t-1]: a machine Y equal to the
    oracle's changes nothing, and one step changed moves the step after it (forward; the one
    before it in the reverse direction) and no other — in an LSTM the later steps too,
    through c, which the oracle carries itself."""
    proto, feeds, outputs = _recurrent(op, "bidirectional", seq=5)
    own = _stepped(proto, feeds, outputs)
    same = _stepped(proto, feeds, outputs, machine={"y": own["y"]})
    for name in outputs:
        np.testing.assert_array_equal(same[name], own[name])
    changed = own["y"].copy()
    changed[2] += 0.25
    got = _stepped(proto, feeds, outputs, machine={"y": changed})["y"]
    moved = (np.abs(got - own["y"]).max(axis=(2, 3)) > 1e-3).T.tolist()  # [direction, step]
    if op == "GRU":
        assert moved == [[False, False, False, True, False], [False, True, False, False, False]]
    else:
        assert moved == [[False, False, False, True, True], [True, True, False, False, False]]


# --- the cast plan ------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_the_plan_rounds_the_projections_operands_under_the_default_autocast(op):
    """The lowering's input projection X·Wᵀ takes bf16 operands; its recurrent product and
    gate math are fp32: X and W are exact operand points, nothing is unemulated."""
    proto, _, _ = _recurrent(op, "bidirectional", hidden=32)
    plan = compile_model(proto).cast_plan
    assert not plan.unemulated
    assert {(p.input, p.dtype, p.kind, p.exact) for p in plan.points} == {
        ("x", "bfloat16", "operand", True),
        ("w", "bfloat16", "operand", True),
    }


def test_a_narrow_recurrent_product_is_read_as_rounding_r_and_the_state():
    """The plan reads the program's data flow, not the lowering's habits: the same program
    with its recurrent product's tiles (Rᵀ and hᵀ) made bf16 rounds R and the state."""
    proto, _, _ = _recurrent("LSTM", hidden=32)
    compilation = compile_model(proto)
    function = compilation.module.functions[0]
    locations = function.memory_locations
    for name in [n for n in locations if "/r_t" in n or "/h_t" in n]:
        locations[name] = dataclasses.replace(locations[name], dtype=Dtype.BF16)
    found = _recurrent_points(function, "rec", import_graph(proto))
    assert sorted(found) == [
        ("r", "bfloat16", "recurrent"),
        ("w", "bfloat16", "operand"),
        ("x", "bfloat16", "operand"),
    ]


# --- validations --------------------------------------------------------------------------------
def _save(tmp_path, proto, name="rec.onnx"):
    path = tmp_path / name
    onnx.save(proto, path)
    return path


MODELS = {
    "lstm-128": ("LSTM", dict(hidden=128, inp=64, seq=6, batch=2)),
    "lstm-bidirectional-128": ("LSTM", dict(direction="bidirectional", hidden=128, inp=48, seq=5)),
    "gru-bidirectional-128": ("GRU", dict(direction="bidirectional", hidden=128, inp=48, seq=5)),
    "gru-lbr-reverse-64": (
        "GRU",
        dict(direction="reverse", hidden=64, inp=32, seq=5, linear_before_reset=1),
    ),
    # tiled over partitions: H chunks of 128 accumulated in PSUM
    "lstm-bidirectional-512": ("LSTM", dict(direction="bidirectional", hidden=512, inp=64, seq=4)),
    "lstm-1024": ("LSTM", dict(hidden=1024, inp=64, seq=3)),
    "gru-reverse-1024": ("GRU", dict(direction="reverse", hidden=1024, inp=64, seq=3)),
}


@pytest.mark.parametrize("case", list(MODELS))
def test_a_recurrent_model_passes_at_the_fp32_bound(tmp_path, capsys, case):
    op, kw = MODELS[case]
    proto, _, outputs = _recurrent(op, consumer=True, **kw)
    code, doc = run_json(["validate", _save(tmp_path, proto)], capsys)
    assert code == 0, [o for o in doc["outputs"] if not o["passed"]]
    emulation = doc["emulation"]
    assert emulation["unemulated"] == [] and emulation["statistical"] == []
    judged = {o["name"]: o for o in doc["outputs"]} | {c["name"]: c for c in doc["checkpoints"]}
    for name in ["y", *outputs[1:]]:
        entry = judged[name]
        assert entry["bound"] == "fp32" and (entry["atol"], entry["rtol"]) == (1e-4, 1e-3)
        assert entry["max_abs_err"] < 2e-6
        assert 0 < entry["accumulation_allowance_max"] < 2e-3
    assert judged["y"]["resynchronised"]  # Y is a probe: each step from the machine's h


def _perturb_writes(monkeypatch, location: str, amount: float) -> None:
    """Add `amount` to whatever any instruction writes into DRAM location `location`."""
    for opcode, function in list(semantics.SEMANTICS.items()):

        def wrapped(machine, ins, loop_values, _function=function):
            _function(machine, ins, loop_values)
            if ins.dst is not None and ins.dst.loc == location:
                view = machine.operands(ins)["dst"].view(loop_values)
                view += np.asarray(amount, view.dtype)

        monkeypatch.setitem(semantics.SEMANTICS, opcode, wrapped)


@pytest.mark.parametrize("op, output", [("LSTM", "yc"), ("LSTM", "y"), ("GRU", "yh")])
def test_an_output_off_by_a_little_more_than_its_bound_fails(
    tmp_path, capsys, monkeypatch, op, output
):
    """The machine's output moved by twice its whole bound (atol + rtol·|ref| + the summation
    allowance, at its largest) fails, at the fp32 bound — a move the statistical bound the
    recurrent op had before accepted."""
    proto, feeds, _ = _recurrent(op, "bidirectional", hidden=128, inp=48, seq=5, consumer=True)
    path = _save(tmp_path, proto)
    np.savez(tmp_path / "inputs.npz", **feeds)
    argv = ["validate", path, "--inputs", tmp_path / "inputs.npz"]
    code, doc = run_json(argv, capsys)
    judged = {o["name"]: o for o in doc["outputs"]} | {c["name"]: c for c in doc["checkpoints"]}
    assert code == 0 and judged[output]["passed"]
    plain, _, _ = _recurrent(op, "bidirectional", hidden=128, inp=48, seq=5)  # Y an output
    reference = run_onnxruntime(plain.SerializeToString(), feeds, [output])[output]
    allowance = judged[output]["accumulation_allowance_max"]
    amount = 2 * (1e-4 + 1e-3 * float(np.abs(reference).max()) + allowance)
    _perturb_writes(monkeypatch, output, amount)
    code, doc = run_json(argv, capsys)
    judged = {o["name"]: o for o in doc["outputs"]} | {c["name"]: c for c in doc["checkpoints"]}
    assert code == 1 and not judged[output]["passed"]
    assert judged[output]["bound"] == "fp32"
    # (Y's steps read the machine's moved Y[t-1]: the oracle's own Y moves too)
    assert judged[output]["max_abs_err"] >= 0.99 * amount
    # What the old path judged it by: the statistical bf16 bound over D = 5 steps.
    old = TolerancePolicy().for_tensor(output, op, "bf16", reference, 1, 5)
    assert old.atol > amount
