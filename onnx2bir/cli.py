"""The `onnx2bir` command: convert, validate, report, run.

Exit status: 0 success (validate: every output matches onnxruntime), 1 validate found a
mismatch or a race, run found a race, or the machine rejected the program, 2 bad input or
usage, 3 an internal error.
Bad input is one line on stderr; `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from onnx2bir import options as compile_options
from onnx2bir import run_command
from onnx2bir.errors import MachineError, UserError
from onnx2bir.run_command import add_concurrency_options

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors: one line, exit 2
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,... with positive sizes: {text!r}")
    return name, shape


def _dim_arg(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"expected SYMBOL=N with N a positive integer: {text!r}")
    return name, int(value)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the ONNX model file")
    parser.add_argument(
        "--input-shape",
        action="append",
        type=_shape_arg,
        default=[],
        metavar="NAME=D0,D1,...",
        help="fix the shape of input NAME (repeatable)",
    )
    parser.add_argument(
        "--dim",
        action="append",
        type=_dim_arg,
        default=[],
        metavar="SYMBOL=N",
        help="give symbolic dimension SYMBOL the size N (repeatable)",
    )
    group = parser.add_argument_group("compile options (reference compiler spelling)")
    group.add_argument(
        "--native-kernel-cast-type",
        default=compile_options.DEFAULT_CAST_TYPE,
        metavar="WHAT-to-TYPE",
        help=f"storage dtype of native kernel matmul operands: "
        f"{compile_options.CAST_TYPE_GRAMMAR}; default %(default)s",
    )
    group.add_argument(
        "--enable-native-kernel-attention",
        action="store_true",
        help="raise matmul-softmax-matmul attention to a native kernel",
    )
    group.add_argument(
        "--enable-native-kernel-attention-bf16",
        action="store_true",
        help="raise attention whatever the input dtype, with bf16 intermediates",
    )
    group.add_argument(
        "--experimental-convolution-kernel-match",
        action="store_true",
        help="also try the experimental convolution kernel registry",
    )
    group.add_argument(
        "--target",
        default=compile_options.DEFAULT_TARGET,
        help="target device name (default %(default)s)",
    )
    parser.add_argument("--stats", action="store_true", help="print the passes' statistic counters")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="onnx2bir",
        description="Compile an ONNX model to BIR for a NeuronCore-like accelerator, run it on "
        "a numpy model of the hardware, and check the numbers against onnxruntime.",
        epilog="examples:\n"
        "  onnx2bir validate models/small_cnn.onnx\n"
        "  onnx2bir validate model.onnx --localize --dim batch=1\n"
        "  onnx2bir report model.onnx --explain conv_3\n"
        "  onnx2bir convert model.onnx -o out/\n"
        "  onnx2bir run out/model.bir.json --inputs in.npz --check-races\n\n"
        "exit status: 0 ok, 1 validate found a mismatch or a race (run: a race), 2 bad input "
        "or usage, 3 internal error",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    convert = commands.add_parser(
        "convert",
        help="compile MODEL and write DIR/<model>.bir.json and its constants",
        description="Compile MODEL to BIR. Writes DIR/<model>.bir.json and "
        "DIR/<model>.consts.bin; nothing is written unless compilation succeeds.",
    )
    _common(convert)
    convert.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="folder for the BIR files (created if missing)",
    )
    validate = commands.add_parser(
        "validate",
        help="compile, simulate and compare every output with onnxruntime",
        description="Compile MODEL, run it on the NeuronCore model and compare each output "
        "with onnxruntime on the same inputs. Exit 0: all outputs match; 1: one "
        "does not; 2: bad input.",
    )
    _common(validate)
    _validate_options(validate)
    report = commands.add_parser(
        "report",
        help="what the compiler found and decided for MODEL",
        description="List what the passes decided for MODEL — each convolution's kernel or "
        "why it fell back to the generic path, attention and MLP blocks — and "
        "whether the model compiles, without simulating.",
    )
    _common(report)
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument(
        "--explain",
        metavar="NODE",
        help="print the whole kernel-registry walk for convolution NODE",
    )
    report.add_argument(
        "--annotate",
        metavar="OUT.onnx",
        help="also write the model with each node's kernel, fallback reason, "
        "idiom and lowering as node metadata (shown by Netron)",
    )
    run_command.register(commands)
    return parser


def _validate_options(validate: argparse.ArgumentParser) -> None:
    data = validate.add_argument_group("inputs and outputs")
    data.add_argument(
        "--inputs",
        metavar="FILE.npz|DIR",
        help="input arrays by graph-input name: an .npz file, or an ONNX "
        "test_data_set_N folder of input_K.pb (default: seeded random; "
        "gather indices bounded by their table, attention masks in {0, 1})",
    )
    data.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    data.add_argument(
        "--save-inputs",
        metavar="FILE.npz|DIR",
        help="write the inputs used (.npz, or a test_data_set folder)",
    )
    data.add_argument(
        "--save-outputs",
        metavar="FILE.npz|DIR",
        help="write the machine's (not onnxruntime's) outputs (.npz, or a "
        "test_data_set folder of output_K.pb)",
    )
    tol = validate.add_argument_group(
        "tolerance",
        "An element passes when |machine - onnxruntime| <= atol + rtol*|onnxruntime|. "
        "Defaults: fp32 path atol 1e-4 rtol 1e-3; bf16/fp16 paths atol growing with the "
        "reduction length, rtol 2^-6 / 1e-3; integers exact. Strongest first: --tolerance, "
        "the file's tensors, --op-tolerance, the file's op_types, --atol/--rtol, the file's "
        "default and paths.",
    )
    tol.add_argument("--atol", type=float, help="absolute tolerance for every tensor")
    tol.add_argument("--rtol", type=float, help="relative tolerance for every tensor")
    tol.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="NAME=ATOL,RTOL",
        help="tolerance of one output or intermediate tensor (repeatable; leave a "
        "number empty to keep the default, e.g. logits=,1e-2)",
    )
    tol.add_argument(
        "--op-tolerance",
        action="append",
        default=[],
        metavar="OP=ATOL,RTOL",
        help="tolerance of tensors produced by op type OP (repeatable)",
    )
    tol.add_argument(
        "--tolerance-file",
        metavar="FILE.json",
        help='tolerances from JSON: {"default", "paths", "op_types", "tensors"}, '
        'each {"atol", "rtol"} (see onnx2bir.runtime.tolerance)',
    )
    loc = validate.add_argument_group("localisation")
    loc.add_argument(
        "--localize",
        action="store_true",
        help="compare every intermediate tensor with onnxruntime; report the "
        "first node over tolerance (its own error vs error carried in), the "
        "first NaN/inf, and each conv's kernel next to its error",
    )
    loc.add_argument(
        "--localize-budget",
        type=float,
        default=256,
        metavar="MB",
        help="onnxruntime holds at most this many MB of intermediates at once "
        "(default %(default)s)",
    )
    add_concurrency_options(validate)
    validate.add_argument("--json", action="store_true", help="print the result as JSON")
    validate.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is drawn on stderr only when stderr is a "
        "terminal and the simulation runs over a second)",
    )


def _options(args: argparse.Namespace) -> compile_options.CompileOptions:
    return compile_options.CompileOptions(
        native_kernel_cast_type=args.native_kernel_cast_type,
        enable_native_kernel_attention=args.enable_native_kernel_attention,
        enable_native_kernel_attention_bf16=args.enable_native_kernel_attention_bf16,
        experimental_convolution_kernel_match=args.experimental_convolution_kernel_match,
        target=args.target,
    )


def _compile(args: argparse.Namespace, keep_going: bool = False):
    from onnx2bir.compiler import compile_model

    return compile_model(
        args.model, _options(args), dict(args.input_shape), dict(args.dim), keep_going=keep_going
    )


def _print_stats(args, compilation) -> None:
    if args.stats:
        from onnx2bir.passes import format_statistics

        print(
            format_statistics(compilation.passes.statistics) or "(no statistics)", file=sys.stderr
        )


def cmd_convert(args: argparse.Namespace) -> int:
    from onnx2bir.bir.json_io import write_module

    compilation = _compile(args)
    _print_stats(args, compilation)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder")
    if not out.parent.is_dir():
        raise UserError(f"{out.parent}: no such folder")
    stem = Path(args.model).name.removesuffix(".onnx")
    try:
        staging = Path(
            tempfile.mkdtemp(prefix=".onnx2bir-", dir=out if out.exists() else out.parent)
        )
    except OSError as exc:
        raise UserError(f"{out}: cannot write there ({exc.strerror})") from exc
    try:
        files = write_module(compilation.module, staging, stem)
        if out.exists():
            for path in files:
                os.replace(path, out / path.name)
            staging.rmdir()
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    instructions = sum(1 for _ in compilation.module.functions[0].instructions())
    print(
        f"wrote {out / (stem + '.bir.json')} ({instructions} instructions) and "
        f"{out / (stem + '.consts.bin')}"
    )
    return EXIT_OK


def _policy(args: argparse.Namespace):
    from onnx2bir.runtime.tolerance import (
        TolerancePolicy,
        load_tolerance_file,
        parse_override,
    )

    for flag, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if value is not None and not value >= 0:
            raise UserError(f"{flag} {value}: must be a number >= 0")
    policy = TolerancePolicy(atol=args.atol, rtol=args.rtol)
    if args.tolerance_file:
        load_tolerance_file(args.tolerance_file, policy)
    for text in args.tolerance:
        name, partial = parse_override(text, "tolerance")
        policy.tensors[name] = partial
    for text in args.op_tolerance:
        name, partial = parse_override(text, "op-tolerance")
        policy.op_types[name] = partial
    return policy


def cmd_validate(args: argparse.Namespace) -> int:
    from onnx2bir import validation_report

    if args.localize_budget <= 0:
        raise UserError(f"--localize-budget {args.localize_budget}: must be > 0")
    policy = _policy(args)
    doc, feeds, outputs = validation_report.run_validate(
        args.model,
        _options(args),
        policy,
        input_shapes=dict(args.input_shape),
        dims=dict(args.dim),
        inputs=args.inputs,
        seed=args.seed,
        localize_nodes=args.localize,
        budget_bytes=int(args.localize_budget * (1 << 20)),
        progress=not args.no_progress,
        on_compiled=lambda compilation: _print_stats(args, compilation),
        schedule=args.schedule,
        check_races=args.check_races,
    )
    if args.save_inputs:
        validation_report.save_inputs(args.save_inputs, feeds)
    if args.save_outputs:
        validation_report.save_outputs(args.save_outputs, outputs)
    print(validation_report.to_json_text(doc) if args.json else validation_report.format_text(doc))
    return EXIT_OK if doc["passed"] else EXIT_MISMATCH


def cmd_report(args: argparse.Namespace) -> int:
    from onnx2bir import report

    prepared = None
    if args.annotate:  # the annotation needs the folded model to name unnamed nodes
        from onnx2bir.runtime.prepared import prepare

        prepared = prepare(
            args.model, _options(args), dict(args.input_shape), dict(args.dim), keep_going=True
        )
        compilation = prepared.compilation
    else:
        compilation = _compile(args, keep_going=True)
    _print_stats(args, compilation)
    doc = report.build_report(args.model, compilation)
    if prepared is not None:
        from onnx2bir.annotate import annotate_model

        count = annotate_model(args.model, prepared, doc, args.annotate)
        print(f"wrote {args.annotate} ({count} nodes annotated)", file=sys.stderr)
    if args.explain:
        try:
            print(report.explain_conv(doc, args.explain))
        except KeyError as exc:
            raise UserError(exc.args[0]) from exc
        return EXIT_OK
    print(json.dumps(doc, indent=1) if args.json else report.format_report(doc))
    return EXIT_OK


COMMANDS = {
    "convert": cmd_convert,
    "validate": cmd_validate,
    "report": cmd_report,
    "run": run_command.cmd_run,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"onnx2bir: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MachineError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"onnx2bir: the machine rejected the program: {exc}", file=sys.stderr)
        return EXIT_MISMATCH
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # an onnx2bir bug: say so, keep the traceback behind --debug
        if args.debug:
            traceback.print_exc()
        print(
            f"onnx2bir: internal error: {type(exc).__name__}: {exc} "
            "(rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
