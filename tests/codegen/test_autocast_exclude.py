"""`--auto-cast-exclude`: named nodes and op types keep fp32 PE operands under the general
autocast, the cast plan and the emulating oracle follow, the report lists them, and bad names
are refused (docs/autocast.md#exclude)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.bir.enums import Dtype, MemoryType, Opcode
from onnx2bir.bir.ir import node_of_origin
from onnx2bir.cli.commands import main
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions

ROOT = Path(__file__).resolve().parents[2]
RESNET18 = ROOT / "models" / "resnet18.onnx"
BERT = ROOT / "models" / "bert.onnx"


def _operand_dtypes(compilation) -> dict[str, set[Dtype]]:
    """Compiled node → the dtypes of its PE matmuls' operands (transposes left out)."""
    function = compilation.module.functions[0]
    locations = function.memory_locations
    found: dict[str, set[Dtype]] = {}
    for ins in function.instructions():
        if ins.opcode is not Opcode.MATMULT or ins.srcs["moving"].loc.startswith("identity_"):
            continue
        node = node_of_origin(ins.origin.node, set(compilation.graph.nx)) or ins.origin.node
        for role in ("stationary", "moving"):
            found.setdefault(node, set()).add(locations[ins.srcs[role].loc].dtype)
    return found


def test_an_excluded_op_type_keeps_fp32_operands_and_the_others_are_cast():
    compilation = compile_model(RESNET18, CompileOptions(auto_cast_exclude=("Gemm",)))
    dtypes = _operand_dtypes(compilation)
    gemm = [n for n, d in compilation.graph.nodes() if n in dtypes and "linear" in n]
    assert gemm and all(dtypes[n] == {Dtype.FP32} for n in gemm)
    others = [n for n in dtypes if n not in gemm]
    assert others and all(dtypes[n] == {Dtype.BF16} for n in others)
    rounded = {point.node for point in compilation.cast_plan.points}
    assert not rounded & set(gemm) and rounded  # the plan reads it off the program


def test_an_excluded_node_keeps_fp32_and_its_neighbours_do_not():
    plain = compile_model(RESNET18)
    conv = sorted(n for n in _operand_dtypes(plain) if n.startswith("node_Conv"))[3]
    compilation = compile_model(RESNET18, CompileOptions(auto_cast_exclude=(conv,)))
    dtypes = _operand_dtypes(compilation)
    assert dtypes[conv] == {Dtype.FP32}
    assert sum(1 for d in dtypes.values() if d == {Dtype.FP32}) == 1
    assert conv not in {point.node for point in compilation.cast_plan.points}


def test_a_raised_mlp_block_with_an_excluded_member_runs_in_fp32():
    compilation = compile_model(BERT, CompileOptions(auto_cast_exclude=("MatMul",)))
    assert all(d == {Dtype.FP32} for d in _operand_dtypes(compilation).values())
    assert not compilation.cast_plan.points


def test_under_auto_cast_all_what_an_excluded_node_reads_and_writes_stays_fp32():
    plain = compile_model(RESNET18, CompileOptions(auto_cast="all", memory_plan=False))
    conv = sorted(n for n in _operand_dtypes(plain) if n.startswith("node_Conv"))[3]
    options = CompileOptions(auto_cast="all", memory_plan=False, auto_cast_exclude=(conv,))
    compilation = compile_model(RESNET18, options)
    locations = compilation.module.functions[0].memory_locations
    data = compilation.graph.node(conv)
    touched = [data["inputs"][0], *data["outputs"]]
    assert all(locations[t].dtype is Dtype.FP32 for t in touched)
    narrow = [
        name
        for name, loc in locations.items()
        if loc.memory is MemoryType.DRAM and loc.dtype is Dtype.BF16 and name not in touched
    ]
    assert narrow  # the rest of the model is still stored in bf16


def _validate(capsys, args) -> tuple[int, dict]:
    code = main(["validate", *[str(a) for a in args], "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_emulating_oracle_follows_and_drift_shrinks(capsys):
    code, cast = _validate(capsys, [RESNET18])
    code_excluded, kept = _validate(capsys, [RESNET18, "--auto-cast-exclude", "Conv,Gemm"])
    assert code == code_excluded == 0
    assert kept["casts"] == [] and cast["casts"]
    before = cast["outputs"][0]["drift"]["max_abs_err"]
    after = kept["outputs"][0]["drift"]["max_abs_err"]
    assert after < before / 100  # every matmul in fp32: only summation order is left
    assert kept["compile_options"]["auto_cast_exclude"] == ["Conv", "Gemm"]


def test_the_exclude_file_and_the_report(tmp_path, capsys):
    listing = tmp_path / "keep.txt"
    listing.write_text("# kept in fp32\nGemm   # the classifier\n\nnode_Conv_309\n")
    code = main(["report", str(RESNET18), "--auto-cast-exclude-file", str(listing), "--json"])
    cast = json.loads(capsys.readouterr().out)["autocast"]
    assert code == 0 and cast["excluded"] == ["Gemm", "node_Conv_309"]
    assert "node_Conv_309" in cast["kept_fp32"] and len(cast["kept_fp32"]) == 2
    main(["report", str(RESNET18), "--auto-cast-exclude-file", str(listing)])
    assert "kept in fp32 (--auto-cast-exclude): node_Conv_309, node_linear" in (
        capsys.readouterr().out
    )


def test_a_saved_program_keeps_its_exclusions(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["convert", str(RESNET18), "-o", str(out), "--auto-cast-exclude", "Gemm"]) == 0
    capsys.readouterr()
    inputs = tmp_path / "x.npz"
    np.savez(inputs, input=np.random.default_rng(0).standard_normal((1, 3, 64, 64), np.float32))
    bir = out / "resnet18.bir.json"
    code = main(["run", str(bir), "--inputs", str(inputs), "--model", str(RESNET18), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["passed"]
    assert not [p for p in doc["casts"] if "linear" in p["node"]]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--auto-cast-exclude", "NoSuchThing"], "no node or op type of that name"),
        (["--auto-cast-exclude-file", "/no/such/file.txt"], "cannot be read"),
    ],
)
def test_bad_names_are_bad_input(capsys, args, message):
    assert main(["report", str(RESNET18), *args]) == 2
    assert message in capsys.readouterr().err


def test_an_empty_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(RESNET18), "--auto-cast-exclude", "Conv,,Gemm"])
    assert exit_.value.code == 2 and "without empty names" in capsys.readouterr().err
