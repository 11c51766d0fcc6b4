"""The flag groups: the namespace becomes the API's options by name, a command line without
flags hands the API its defaults, and the help keeps its layout."""

from __future__ import annotations

import argparse
import re

import pytest

from onnx2bir.api.options import InputOptions, ToleranceOptions, ValidationRunOptions
from onnx2bir.cli import flag_groups
from onnx2bir.cli.commands import build_parser
from onnx2bir.errors import UserError
from onnx2bir.options import CompileOptions


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _subparser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = commands.choices[name]
    return parser


def test_no_flags_give_the_api_defaults():
    args = _parse(["validate", "m.onnx"])
    assert flag_groups.COMPILE.options(args) == CompileOptions()
    assert flag_groups.INPUTS.options(args) == InputOptions(
        input_shapes={}, dims={}, input_values={}
    )
    assert flag_groups.TOLERANCE.options(args) == ToleranceOptions(tolerance={}, op_tolerance={})
    run = flag_groups.VALIDATION_RUN.options(args)
    assert run == ValidationRunOptions(max_drift=[], progress=True)


def test_the_flags_reach_the_options_by_name():
    args = _parse(
        [
            "validate",
            "m.onnx",
            "--json",
            "--auto-cast",
            "all",
            "--no-memory-plan",
            "--auto-cast-exclude",
            "Conv,Gemm",
            "--auto-cast-exclude",
            "Conv",
            "--dim",
            "batch=2",
            "--seed",
            "7",
            "--tolerance",
            "logits=,1e-2",
            "--ray",
            "--segments",
            "3",
        ]
    )
    options = flag_groups.COMPILE.options(args)
    assert (options.auto_cast, options.memory_plan) == ("all", False)
    assert options.auto_cast_exclude == ("Conv", "Gemm")
    inputs = flag_groups.INPUTS.options(args)
    assert (inputs.dims, inputs.seed) == ({"batch": 2}, 7)
    assert flag_groups.TOLERANCE.options(args).tolerance == {"logits": (None, 1e-2)}
    run = flag_groups.VALIDATION_RUN.options(args)
    assert (run.use_ray, run.ray_address, run.segments, run.progress) == (True, None, 3, False)


def test_a_value_the_options_refuse_is_bad_input():
    args = _parse(["convert", "m.onnx", "-o", "out", "--dynamic-dma-sbuf-bytes", "-1"])
    with pytest.raises(UserError, match="--dynamic-dma-sbuf-bytes -1 is not valid"):
        flag_groups.COMPILE.options(args)


def test_a_reproducing_command_repeats_the_shapes_and_the_portable_compile_flags():
    with_value, switches = flag_groups.reproducing_flags()
    assert with_value == {
        "--input-shape",
        "--dim",
        "--auto-cast",
        "--auto-cast-type",
        "--native-kernel-cast-type",
        "--target",
        "--dynamic-dma-sbuf-bytes",
    }
    assert switches == {
        "--enable-native-kernel-attention",
        "--enable-native-kernel-attention-bf16",
        "--experimental-convolution-kernel-match",
        "--no-memory-plan",
    }


def test_help_sections_keep_their_order():
    titles = [group.title for group in _subparser("validate")._action_groups]
    assert titles == [
        "positional arguments",
        "options",
        "compile options (reference compiler spelling)",
        "inputs and outputs",
        "tolerance",
        "drift",
        "localisation",
        "segments",
        "concurrency",
    ]
    usage = _subparser("validate").format_usage()
    order = ["--target", "--json", "--stats", "--dynamic-dma-sbuf-bytes", "--verbose", "--inputs"]
    where = [re.search(re.escape("[" + flag) + r"[] ]", usage).start() for flag in order]
    assert where == sorted(where)  # the usage line lists the flags as it always has
