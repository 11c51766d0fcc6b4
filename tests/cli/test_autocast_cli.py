"""`--auto-cast` / `--auto-cast-type` on the command line: errors, report, validate, convert."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"
SCHEMA = ROOT / "onnx2bir" / "bir" / "schema.json"


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "flag, value, valid",
    [
        ("--auto-cast", "matmul", "none, matmult, all"),
        ("--auto-cast-type", "fp8", "bf16, fp16, tf32, fp8_e4m3"),
    ],
)
@pytest.mark.parametrize("command", ["report", "validate"])
def test_invalid_value_is_one_line_listing_the_valid_ones(capsys, command, flag, value, valid):
    code, out, err = run([command, SMALL_CNN, flag, value], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and not out and len(lines) == 1 and "Traceback" not in err
    assert flag in lines[0] and repr(value) in lines[0] and valid in lines[0]


def test_convert_rejects_a_bad_value_and_writes_nothing(tmp_path, capsys):
    code, _, err = run(["convert", SMALL_CNN, "-o", tmp_path / "out", "--auto-cast", "x"], capsys)
    assert code == 2 and "--auto-cast" in err
    assert not (tmp_path / "out").exists()


def test_help_documents_the_precedence_over_native_kernels(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--auto-cast {none,matmult,all}" in text
    assert "--auto-cast-type {bf16,fp16,tf32,fp8_e4m3}" in text
    assert "follows --native-kernel-cast-type" in text


def test_report_shows_the_autocast_and_the_operand_dtypes(capsys):
    code, out, _ = run(["report", SMALL_CNN, "--json", "--auto-cast", "matmult"], capsys)
    cast = json.loads(out)["autocast"]
    assert code == 0
    assert cast["auto_cast"] == "matmult" and cast["auto_cast_type"] == "bf16"
    assert cast["text"] == "matmult -> bf16"
    # Product matmuls in bf16; PE transposes against the fp32 identity stay fp32.
    assert cast["matmul_operand_dtypes"].get("bfloat16 x bfloat16", 0) > 0
    code, out, _ = run(
        ["report", SMALL_CNN, "--auto-cast", "all", "--auto-cast-type", "fp16"], capsys
    )
    assert "autocast: all -> fp16" in out
    code, out, _ = run(["report", SMALL_CNN, "--json", "--auto-cast", "none"], capsys)
    assert set(json.loads(out)["autocast"]["matmul_operand_dtypes"]) == {"float32 x float32"}


def test_validate_header_and_json(capsys):
    code, out, _ = run(
        ["validate", SMALL_CNN, "--auto-cast", "matmult", "--auto-cast-type", "tf32"], capsys
    )
    assert code == 0
    assert "autocast: matmult -> tf32" in out.splitlines()[2]
    code, out, _ = run(["validate", SMALL_CNN, "--json", "--auto-cast", "none"], capsys)
    doc = json.loads(out)
    assert doc["autocast"] == "none"
    assert doc["compile_options"]["auto_cast"] == "none"
    assert doc["outputs"][0]["path"] == "fp32"


@pytest.mark.parametrize("cast_type", ["tf32", "fp8_e4m3"])
def test_convert_writes_schema_valid_bir_with_the_new_dtypes(tmp_path, capsys, cast_type):
    argv = ["convert", SMALL_CNN, "-o", tmp_path, "--auto-cast", "matmult"]
    code, _, _ = run([*argv, "--auto-cast-type", cast_type], capsys)
    assert code == 0
    doc = json.loads((tmp_path / "small_cnn.bir.json").read_text())
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    text = json.dumps(doc)
    assert {"tf32": '"tfloat32"', "fp8_e4m3": '"float8_e4m3"'}[cast_type] in text


def test_localize_shows_the_cast_dtype_beside_each_conv_and_matmul(capsys):
    code, out, _ = run(["validate", SMALL_CNN, "--localize", "--auto-cast", "matmult"], capsys)
    assert code == 0
    conv_rows = out.split("convolutions:")[1].splitlines()[1:]
    assert conv_rows and all("bfloat16" in row for row in conv_rows if row.strip()[:4] == "node")
    gemm = next(line for line in out.splitlines() if " Gemm " in line)
    assert "bfloat16" in gemm


def test_the_default_is_the_device_autocast(capsys):
    """Users ask what the device computes: matmult / bf16 unless told otherwise."""
    from onnx2bir.options import CompileOptions

    options = CompileOptions()
    assert (options.auto_cast, options.auto_cast_type) == ("matmult", "bf16")
    code, out, _ = run(["validate", SMALL_CNN], capsys)
    assert code == 0 and "autocast: matmult -> bf16" in out
    assert "rounding where the program rounds" in out  # the emulating oracle
    assert "drift vs onnxruntime fp32" in out  # what the casts cost, apart
