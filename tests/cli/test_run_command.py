"""`onnx2bir run`, and --check-races / --schedule on validate; report's dependency counts."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np

from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"
SCHEMA = ROOT / "onnx2bir" / "bir" / "schema.json"


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _converted(tmp_path, capsys) -> tuple[Path, Path]:
    assert run(["convert", SMALL_CNN, "-o", tmp_path], capsys)[0] == 0
    bir = tmp_path / "small_cnn.bir.json"
    inputs = tmp_path / "in.npz"
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.savez(inputs, input=x)
    return bir, inputs


def _strip_edges(block: dict) -> None:
    for item in block["items"]:
        if "body" in item:
            _strip_edges(item["body"])
        else:
            item["deps"] = []


def test_run_gives_validates_outputs_under_every_schedule(tmp_path, capsys):
    bir, _ = _converted(tmp_path, capsys)
    inputs, outputs = tmp_path / "v_in.npz", tmp_path / "v_out.npz"
    code, out, err = run(
        ["validate", SMALL_CNN, "--save-inputs", inputs, "--save-outputs", outputs], capsys
    )
    assert code == 0, err
    expected = np.load(outputs)["logits"]
    for schedule in ("program", "random:1", "timeline"):
        saved = tmp_path / f"{schedule.replace(':', '_')}.npz"
        argv = ["run", bir, "--inputs", inputs, "--check-races", "--schedule", schedule]
        code, out, err = run([*argv, "--save-outputs", saved], capsys)
        assert code == 0, err
        assert f"schedule {schedule}; races: 0 found" in out
        # the machine's outputs from the BIR file equal validate's, bit for bit
        assert np.array_equal(np.load(saved)["logits"], expected)


def test_run_of_a_program_without_edges_exits_1_naming_the_racing_instructions(tmp_path, capsys):
    bir, inputs = _converted(tmp_path, capsys)
    doc = json.loads(bir.read_text())
    _strip_edges(doc["functions"][0]["entry"])
    stripped = tmp_path / "stripped.bir.json"
    stripped.write_text(json.dumps(doc))
    code, out, err = run(["run", stripped, "--inputs", inputs, "--check-races"], capsys)
    assert code == 1, err
    lines = [line for line in out.splitlines() if line.startswith("race: ")]
    assert lines
    assert all(line.count("instruction ") == 2 and " are unordered on " in line for line in lines)
    code, out, _ = run(["run", stripped, "--inputs", inputs, "--check-races", "--json"], capsys)
    result = json.loads(out)
    assert code == 1 and result["races"] and result["schedule"] == "program"
    first = result["races"][0]
    assert {"id", "opcode", "stream", "node", "rule"} <= set(first["first"])
    # without --check-races the run is not checked: races null, exit 0
    code, out, _ = run(["run", stripped, "--inputs", inputs, "--json"], capsys)
    assert code == 0 and json.loads(out)["races"] is None


def test_run_bad_input_is_one_line_exit_2(tmp_path, capsys):
    bir, inputs = _converted(tmp_path, capsys)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, input=np.zeros((1, 3, 8, 8), np.float32))
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3, np.float32))
    bad_doc = json.loads(bir.read_text())
    bad_doc["functions"][0]["entry"]["items"][0]["deps"] = [{"source": 99999, "kind": "Flow"}]
    unverified = tmp_path / "unverified.bir.json"
    unverified.write_text(json.dumps(bad_doc))
    for argv, fragment in [
        (["run", tmp_path / "nope.bir.json", "--inputs", inputs], "no such file"),
        (["run", bir, "--inputs", tmp_path / "nope.npz"], "no such inputs file"),
        (["run", bir, "--inputs", wrong], "expects (1, 3, 32, 32)"),
        (["run", bir, "--inputs", other], "missing ['input']"),
        (["run", bir, "--inputs", inputs, "--schedule", "random:x"], "random:SEED"),
        (["run", inputs, "--inputs", inputs], "cannot read BIR"),
        (["run", unverified, "--inputs", inputs], "fails verification"),
    ]:
        code, out, err = run(argv, capsys)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and fragment in lines[0], (argv, err)
        assert "Traceback" not in err


def test_validate_json_carries_schedule_and_races(capsys):
    code, out, _ = run(["validate", SMALL_CNN, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["schedule"] == "program" and doc["races"] is None
    code, out, _ = run(
        ["validate", SMALL_CNN, "--json", "--check-races", "--schedule", "random:2"], capsys
    )
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["schedule"] == "random:2" and doc["races"] == []
    code, out, _ = run(["validate", SMALL_CNN, "--check-races"], capsys)
    assert "schedule: program; races: none found" in out


def test_report_counts_dependencies_and_convert_writes_carried_edges(tmp_path, capsys):
    # small_cnn's tile loops are multi-buffered (no carried edge left); the ONNX Loop's body
    # carries its state from one trip to the next.
    model = ROOT / "models" / "loop_cumsum.onnx"
    code, out, _ = run(["report", model, "--json"], capsys)
    deps = json.loads(out)["dependencies"]
    assert set(deps) == {"Flow", "Anti", "Output", "Ordered", "loop_carried"}
    assert deps["Flow"] > 0 and deps["loop_carried"] > 0
    assert run(["convert", model, "-o", tmp_path], capsys)[0] == 0
    doc = json.loads((tmp_path / "loop_cumsum.bir.json").read_text())
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    text = (tmp_path / "loop_cumsum.bir.json").read_text()
    assert text.count('"carried_by"') == deps["loop_carried"]


# --- run --model: a saved program judged against its model ------------------------------------
def test_run_model_passes_a_program_against_the_model_it_was_compiled_from(tmp_path, capsys):
    bir, inputs = _converted(tmp_path, capsys)
    code, out, err = run(["run", bir, "--inputs", inputs, "--model", SMALL_CNN], capsys)
    assert code == 0, err
    assert out.startswith("PASS") and "rounding where the program rounds" in out
    code, out, _ = run(
        [
            "run",
            bir,
            "--inputs",
            inputs,
            "--model",
            SMALL_CNN,
            "--schedule",
            "random:1",
            "--check-races",
            "--json",
        ],
        capsys,
    )
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["races"] == [] and doc["schedule"] == "random:1"


def test_run_model_refuses_a_program_without_a_cast_plan(tmp_path, capsys):
    bir, inputs = _converted(tmp_path, capsys)
    doc = json.loads(bir.read_text())
    doc["metadata"].pop("cast_plan")
    bir.write_text(json.dumps(doc))
    code, _, err = run(["run", bir, "--inputs", inputs, "--model", SMALL_CNN], capsys)
    assert code == 2 and "convert the model again" in err


def test_run_model_refuses_another_model(tmp_path, capsys):
    bir, inputs = _converted(tmp_path, capsys)
    other = ROOT / "models" / "resnet18.onnx"
    code, _, err = run(["run", bir, "--inputs", inputs, "--model", other], capsys)
    assert code == 2 and ("do not match" in err or "lacks" in err), err
