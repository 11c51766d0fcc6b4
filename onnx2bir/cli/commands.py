"""The `onnx2bir` command: convert, validate, report, profile, sweep, run — a thin layer over
`onnx2bir.api.commands` and the command modules.

Exit status, every command: 0 ok; 1 the model is readable but fails (validate: a mismatch or a
race; run: a race; any command: it does not compile, or the machine rejects the program); 2 bad
input or usage; 3 an internal error. An error is one line on stderr, or with `--json` one
`{"error": {"kind", "message"}}` document on stdout; `--debug` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from onnx2bir import __version__, api, output_paths
from onnx2bir import options as compile_options
from onnx2bir.cli import debug as debug_command
from onnx2bir.cli import flag_values
from onnx2bir.cli import run as run_command
from onnx2bir.cli.run import add_concurrency_options
from onnx2bir.errors import ErrorKind, ExitCode, MachineError, UsageError, UserError
from onnx2bir.runtime.oracle.compare import json_safe

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_INTERNAL = (
    ExitCode.OK,
    ExitCode.FAILS,
    ExitCode.BAD_INPUT,
    ExitCode.INTERNAL,
)


class _Parser(argparse.ArgumentParser):
    raise_usage_errors = False  # set by main() under --json: the error becomes a JSON document

    def error(self, message: str) -> NoReturn:
        """A usage error is one line, `onnx2bir: error: ...`, exit 2 (`--help` shows usage)."""
        if _Parser.raise_usage_errors:
            raise UsageError(message)
        print(f"onnx2bir: error: {message} (see onnx2bir --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the ONNX model file")
    parser.add_argument(
        "--input-shape",
        action="append",
        type=flag_values.input_shape,
        default=[],
        metavar="NAME=D0,D1,...",
        help="fix the shape of input NAME (repeatable)",
    )
    parser.add_argument(
        "--dim",
        action="append",
        type=flag_values.dim,
        default=[],
        metavar="SYMBOL=N",
        help="give symbolic dimension SYMBOL the size N (repeatable)",
    )
    parser.add_argument(
        "--input-value",
        action="append",
        type=flag_values.input_value,
        default=[],
        metavar="NAME=V[,V...]",
        help="fix input NAME to these values (its declared shape, row-major): it becomes a "
        "constant before folding, so an If or a shape it steers (a sample rate, a flag) "
        "folds away; validate feeds onnxruntime the same value (repeatable)",
    )
    group = parser.add_argument_group("compile options (reference compiler spelling)")
    group.add_argument(
        "--auto-cast",
        default=compile_options.DEFAULT_AUTO_CAST,
        metavar="{" + ",".join(compile_options.AUTO_CAST_CHOICES) + "}",
        help="general autocast: matmult stores the operands of every MatMul, Gemm, Conv and "
        "ConvTranspose in --auto-cast-type (PSUM accumulates fp32), all also every fp32 "
        "intermediate, none keeps the model's dtypes; not applied to the raised attention "
        "kernel, which follows --native-kernel-cast-type (default %(default)s)",
    )
    group.add_argument(
        "--auto-cast-type",
        default=compile_options.DEFAULT_AUTO_CAST_TYPE,
        metavar="{" + ",".join(compile_options.AUTO_CAST_TYPES) + "}",
        help="dtype --auto-cast stores in; fp8_e4m3 saturates at +-448 (default %(default)s)",
    )
    group.add_argument(
        "--auto-cast-exclude",
        action="append",
        type=flag_values.exclude_list,
        default=[],
        metavar="NODE|OP_TYPE[,...]",
        help="keep these nodes, or every node of these op types, in fp32 under the general "
        "autocast (repeatable; each must name a node or an op type of the model; "
        "docs/autocast.md#exclude)",
    )
    group.add_argument(
        "--auto-cast-exclude-file",
        metavar="FILE",
        help="the same, one name per line (# starts a comment); debug precision writes one",
    )
    group.add_argument(
        "--native-kernel-cast-type",
        default=compile_options.DEFAULT_CAST_TYPE,
        metavar="WHAT-to-TYPE",
        help=f"storage dtype of the raised attention kernel's matmul operands, which it "
        f"follows instead of --auto-cast: {compile_options.CAST_TYPE_GRAMMAR}; default "
        "%(default)s",
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
        choices=compile_options.KNOWN_TARGETS,
        help="target device name (default %(default)s; the attention raise fires only for "
        f"{compile_options.RAISE_TARGET})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one JSON document on stdout, errors included ({"error": {"kind", "message"}})',
    )
    parser.add_argument(
        "--stats",
        action="store_true",
        help="add the passes' statistic counters to the output (always in --json)",
    )
    group.add_argument(
        "--dynamic-dma-sbuf-bytes",
        type=int,
        default=0,
        metavar="N",
        help="SBUF bytes per partition kept free for dynamic DMA; the attention raise "
        "counts them against the state buffer (default %(default)s)",
    )
    group.add_argument(
        "--no-memory-plan",
        action="store_true",
        help="keep every intermediate tensor in DRAM instead of planning SBUF homes "
        "(docs/memory_planner.md; validate --localize always does)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="log the passes' decisions on stderr (attention matches, casts, warnings)",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="onnx2bir",
        description="Compile an ONNX model to BIR for a NeuronCore-like accelerator, run it on "
        "a numpy model of the hardware, and check the numbers against onnxruntime.",
        epilog="examples:\n"
        "  onnx2bir validate models/small_cnn.onnx\n"
        "  onnx2bir validate models/small_cnn.onnx --auto-cast none   # fp32, no autocast\n"
        "  onnx2bir validate model.onnx --localize --dim batch=1\n"
        "  onnx2bir report model.onnx --explain conv_3\n"
        "  onnx2bir convert model.onnx -o out/\n"
        "  onnx2bir report model.onnx --html report.html\n"
        "  onnx2bir profile model.onnx --trace trace.json --svg timeline.svg\n"
        "  onnx2bir sweep models/ --jobs 2 --json sweep.json --md sweep.md\n"
        "  onnx2bir run out/model.bir.json --inputs in.npz --check-races\n"
        "  onnx2bir debug reduce model.onnx -o small.onnx   # the smallest model that fails\n\n"
        "exit status (every command): 0 ok; 1 the model reads but fails (validate: a "
        "mismatch or a race;\n  any command: it does not compile, or the machine rejects the "
        "program); 2 bad input\n  or usage (one line; docs/input_contracts.md lists what is "
        "checked); 3 a bug in onnx2bir\n  (please report it). With --json, errors are one "
        'JSON document on stdout:\n  {"error": {"kind", "message"}}.',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"onnx2bir {__version__}")
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
        help="folder for the BIR files (created, with its parents, if missing)",
    )
    validate = commands.add_parser(
        "validate",
        help="compile, simulate and compare every output with onnxruntime",
        description="Compile MODEL, run it on the NeuronCore model and compare each output, "
        "and (when the program rounds) each intermediate it stores, with onnxruntime on the same "
        "inputs, rounding where the program rounds (docs/validation.md). Drift from plain fp32 is "
        "reported apart. Exit 0: all match; 1: one does not (or the model does not compile, "
        "or --max-drift is exceeded); 2: bad input.",
    )
    _common(validate)
    _validate_options(validate)
    report = commands.add_parser(
        "report",
        help="what the compiler found and decided for MODEL",
        description="List what the passes decided for MODEL — each convolution's kernel or "
        "why it fell back to the generic path, attention and MLP blocks — and "
        "whether the model compiles, without simulating. Exit 0: it compiles; 1: it does "
        "not (the report says why).",
    )
    _common(report)
    report.add_argument(
        "--html",
        metavar="OUT.html",
        help="also write the report as one self-contained HTML page (tables and charts)",
    )
    report.add_argument(
        "--explain",
        metavar="NODE",
        help="print the whole kernel-registry walk for convolution NODE (the table shows the "
        "two closest entries' refusals)",
    )
    report.add_argument(
        "--annotate",
        metavar="OUT.onnx",
        help="also write the model with each node's kernel, fallback reason, "
        "idiom and lowering as node metadata (shown by Netron)",
    )
    profile = commands.add_parser(
        "profile",
        help="write MODEL's estimated device timeline as a Perfetto trace (and an SVG)",
        description="Compile MODEL and simulate it on the device-time model "
        "(docs/device_time.md): write a Chrome/Perfetto trace with one track per engine and "
        "DMA queue and one slice per instruction (open it at ui.perfetto.dev), and with --svg "
        "the same timeline as a picture. Exit 0: written; 1: the model does not compile.",
    )
    _common(profile)
    profile.add_argument(
        "--trace", required=True, metavar="OUT.json", help="the Chrome trace-event file to write"
    )
    profile.add_argument("--svg", metavar="OUT.svg", help="also draw the timeline as SVG")
    from onnx2bir.sweep import run as sweep

    sweep.add_parser(commands)
    run_command.register(commands)
    debug_command.register(commands, _common)
    return parser


def _validate_options(validate: argparse.ArgumentParser) -> None:
    data = validate.add_argument_group("inputs and outputs")
    data.add_argument(
        "--inputs",
        metavar="FILE.npz|DIR",
        help="input arrays by graph-input name: an .npz file, or an ONNX "
        "test_data_set_N folder of input_K.pb; their shapes fix the model's symbolic "
        "dimensions (default: seeded random; gather indices bounded by their table, "
        "attention masks in {0, 1})",
    )
    data.add_argument(
        "--seed",
        type=flag_values.seed,
        default=0,
        help="seed for random inputs, 0 to 2^128-1 (default 0)",
    )
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
        "The oracle is onnxruntime rounding where the program rounds (the autocast's casts), "
        "so the default is the fp32 bound, atol 1e-4 rtol 1e-3, for every tensor it emulates "
        "exactly; where it can only approximate (the raised attention kernel, an op that "
        "rounds inside itself, a model in fp16/bf16) a statistical bound growing with the "
        "reduction length and the number of such roundings; integers exact. A bound that "
        "would accept zeros (rtol >= 1, or atol >= the reference's RMS) fails as unverifiable. "
        "Strongest first: --tolerance, "
        "the file's tensors, --op-tolerance, the file's op_types, --atol/--rtol, the file's "
        "default and paths.",
    )
    tol.add_argument(
        "--atol", type=flag_values.tolerance, help="absolute tolerance for every tensor"
    )
    tol.add_argument(
        "--rtol", type=flag_values.tolerance, help="relative tolerance for every tensor"
    )
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
        'each {"atol", "rtol"} (see onnx2bir.runtime.oracle.tolerance)',
    )
    drift = validate.add_argument_group(
        "drift",
        "Each output's drift from plain fp32 onnxruntime (what the casts cost: cosine, SNR, "
        "max abs error, R = |machine - fp32| / |emulation - fp32|) is reported beside the "
        "verdict and changes it only through --max-drift (docs/validation.md#drift).",
    )
    drift.add_argument(
        "--reference",
        metavar="FILE.npz|DIR",
        help="measure drift against these outputs (PyTorch's, say) instead of fp32 "
        "onnxruntime: an .npz keyed by output name, or a test_data_set folder of output_K.pb "
        "(whose input_K.pb are used when --inputs is not given); the verdict still compares "
        "with onnxruntime rounding where the program rounds",
    )
    drift.add_argument(
        "--max-drift",
        action="append",
        default=[],
        metavar="KEY=VALUE[,...]",
        help="fail when an output drifts further: cosine=0.999 (at least), snr=30 (dB, at "
        "least), r=1.2 (at most); repeatable",
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
        type=flag_values.positive_megabytes,
        default=256,
        metavar="MB",
        help="onnxruntime holds at most this many MB of intermediates at once "
        "(default %(default)s)",
    )
    validate.add_argument(
        "--html",
        metavar="OUT.html",
        help="also write the report page with this run's errors (with --localize, the error "
        "of every node along the graph as a chart)",
    )
    seg = validate.add_argument_group(
        "segments",
        "Cut the model into N consecutive pieces of about equal work and validate each on its "
        "own, from onnxruntime's values at its inputs, in parallel (docs/validation.md#segments)",
    )
    seg.add_argument(
        "--segments",
        type=flag_values.segment_count,
        metavar="N",
        help="validate in N segments; each one's error and wall time are reported",
    )
    seg.add_argument(
        "--jobs",
        type=flag_values.count,
        metavar="N",
        help="segments at a time, each in its own process (default: the CPU count)",
    )
    seg.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run each segment as a Ray task (a local Ray instance without ADDRESS); needs the "
        "extra onnx2bir[ray]",
    )
    add_concurrency_options(validate)
    validate.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (it is drawn on stderr only when stderr is a "
        "terminal and the simulation runs over a second)",
    )


def _options(args: argparse.Namespace) -> dict:
    """The compile options and shapes given on the command line, as API keywords."""
    return {
        "input_shapes": dict(args.input_shape),
        "dims": dict(args.dim),
        "input_values": dict(args.input_value),
        "native_kernel_cast_type": args.native_kernel_cast_type,
        "enable_native_kernel_attention": args.enable_native_kernel_attention,
        "enable_native_kernel_attention_bf16": args.enable_native_kernel_attention_bf16,
        "experimental_convolution_kernel_match": args.experimental_convolution_kernel_match,
        "target": args.target,
        "dynamic_dma_sbuf_bytes": args.dynamic_dma_sbuf_bytes,
        "auto_cast": args.auto_cast,
        "auto_cast_type": args.auto_cast_type,
        "memory_plan": not args.no_memory_plan,
        "auto_cast_exclude": _exclusions(args),
    }


def _exclusions(args: argparse.Namespace) -> tuple[str, ...]:
    """The names of --auto-cast-exclude (flattened) and of --auto-cast-exclude-file."""
    names = [name for group in args.auto_cast_exclude for name in group]
    if args.auto_cast_exclude_file is not None:
        names += compile_options.read_exclude_file(args.auto_cast_exclude_file)
    return tuple(dict.fromkeys(names))


def _emit(args: argparse.Namespace, doc: dict, text: str) -> None:
    print(json.dumps(json_safe(doc), indent=1) if args.json else text)


def _stats_text(statistics: list[dict]) -> str:
    return "\n".join(
        f"  {stat['pass']}.{stat['name']} = {stat['value']}  ({stat['description']})"
        for stat in statistics
    )


def _stem(model: str) -> str:
    stem = Path(model).name.removesuffix(".onnx")
    return stem if stem not in ("", ".", "..") else "model"


def cmd_convert(args: argparse.Namespace) -> int:
    out, stem = output_paths.check_folder(args.output, "-o"), _stem(args.model)
    if out.is_dir():
        for suffix in (".bir.json", ".consts.bin"):
            output_paths.check_file(out / f"{stem}{suffix}", "-o")
    compilation = api.compile(args.model, **_options(args)).save(args.output)
    text = compilation.text()
    if args.stats:
        text += "\npass statistics:\n" + _stats_text(compilation.to_json()["pass_statistics"])
    _emit(args, compilation.to_json(), text)
    return EXIT_OK


def _overrides(texts: list[str], what: str) -> dict:
    from onnx2bir.runtime.oracle.tolerance import parse_override

    result = {}
    for text in texts:
        name, partial = parse_override(text, what)
        result[name] = (partial.atol, partial.rtol)
    return result


def cmd_validate(args: argparse.Namespace) -> int:
    from onnx2bir.runtime.oracle.input_files import check_inputs_source
    from onnx2bir.runtime.oracle.ort import check_arrays_target

    if args.inputs is not None:
        check_inputs_source(args.inputs)
    for path, stem in ((args.save_inputs, "input"), (args.save_outputs, "output")):
        if path is not None:
            check_arrays_target(path, stem)
    if args.html is not None:
        output_paths.check_file(args.html, "--html")
    result = api.validate(
        args.model,
        args.inputs,
        seed=args.seed,
        atol=args.atol,
        rtol=args.rtol,
        tolerance=_overrides(args.tolerance, "tolerance"),
        op_tolerance=_overrides(args.op_tolerance, "op-tolerance"),
        tolerance_file=args.tolerance_file,
        localize=args.localize,
        localize_budget=args.localize_budget,
        progress=not args.no_progress and not args.json,
        schedule=args.schedule,
        check_races=args.check_races,
        reference=args.reference,
        max_drift=args.max_drift,
        segments=args.segments,
        jobs=args.jobs,
        use_ray=args.ray is not None,
        ray_address=args.ray or None,
        **_options(args),
    )
    if args.save_inputs is not None:
        result.save_inputs(args.save_inputs)
    if args.save_outputs is not None:
        result.save_outputs(args.save_outputs)
    if args.html is not None:
        path = result.html(args.html)
        print(f"wrote {path}", file=sys.stderr)
    _emit(args, result.to_json(), result.text(stats=args.stats))
    return EXIT_OK if result.passed else EXIT_MISMATCH


def cmd_report(args: argparse.Namespace) -> int:
    if args.annotate is not None:
        output_paths.check_file(args.annotate, "--annotate")
    if args.html is not None:
        output_paths.check_file(args.html, "--html")
    result = api.report(args.model, annotate=args.annotate, **_options(args))
    doc = result.to_json()
    if args.annotate is not None:
        print(
            f"wrote {args.annotate} ({doc['annotated']['nodes']} nodes annotated)", file=sys.stderr
        )
    if args.html is not None:
        path = result.html(args.html)
        print(f"wrote {path}", file=sys.stderr)
    if args.explain:
        text = result.explain(args.explain)
        conv = next(c for c in doc["convs"] if c["node"] == args.explain)
        _emit(args, conv, text)
    else:
        text = result.text()
        if args.stats:
            text += "\n\npass statistics:\n" + _stats_text(doc["pass_statistics"])
        _emit(args, doc, text)
    return EXIT_OK if result.compiles else EXIT_MISMATCH


def cmd_profile(args: argparse.Namespace) -> int:
    from onnx2bir.reporting import profile as profiler

    profiler.check_outputs(args.trace, args.svg)
    compilation = api.compile(args.model, **_options(args))
    profile = profiler.build_profile(args.model, compilation.module)
    written = profiler.write_profile(profile, args.trace, args.svg)
    doc = profiler.summary_json(profile, written)
    _emit(args, doc, profiler.summary_text(doc))
    return EXIT_OK


def cmd_debug(args: argparse.Namespace) -> int:
    return debug_command.cmd_debug(args, _options(args))


def cmd_sweep(args: argparse.Namespace) -> int:
    from onnx2bir.sweep import run as sweep

    return sweep.cmd_sweep(args)


COMMANDS = {
    "convert": cmd_convert,
    "validate": cmd_validate,
    "report": cmd_report,
    "profile": cmd_profile,
    "sweep": cmd_sweep,
    "run": run_command.cmd_run,
    "debug": cmd_debug,
}


@contextlib.contextmanager
def _log_to_stderr(verbose: bool) -> Iterator[None]:
    """With --verbose, the passes' log records (INFO and up) go to stderr for this command."""
    if not verbose:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("onnx2bir")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _error(args_json: bool, kind: ErrorKind, message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    if args_json:
        print(json.dumps({"error": {"kind": kind.value, "message": message}}, indent=1))
    elif kind is ErrorKind.MACHINE_REJECTED:
        print(f"onnx2bir: the machine rejected the program: {message}", file=sys.stderr)
    elif kind is ErrorKind.INTERNAL:
        print(f"onnx2bir: internal error ({message})", file=sys.stderr)
    else:
        print(f"onnx2bir: error: {message}", file=sys.stderr)
    return int(kind.exit_code)


def internal_error_message(exc: BaseException, args: argparse.Namespace, argv) -> str:
    """Exit 3 means a bug in onnx2bir: one line that asks for a report and says what to send."""
    words = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["onnx2bir", *(shlex.quote(str(word)) for word in words)])
    detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return (
        f"a bug in onnx2bir {__version__}, please report it with the model "
        f"{getattr(args, 'model', '?')!s}, the command `{command}` and the output of "
        f"--debug: {detail}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    wants_json = "--json" in argv
    debug = "--debug" in argv
    _Parser.raise_usage_errors = wants_json
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        return _error(True, ErrorKind.USAGE, str(exc), False)
    finally:
        _Parser.raise_usage_errors = False
    with _log_to_stderr(getattr(args, "verbose", False)):
        return _dispatch(args, argv, debug)


def _dispatch(args: argparse.Namespace, argv: list[str], debug: bool) -> int:
    args.argv = argv  # a command may repeat its flags (debug reduce's "shown by")
    try:
        return COMMANDS[args.command](args)
    except (UserError, MachineError) as exc:
        return _error(args.json, exc.kind, str(exc), args.debug)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # an onnx2bir bug: say so, keep the traceback behind --debug
        return _error(args.json, ErrorKind.INTERNAL, internal_error_message(exc, args, argv), debug)


if __name__ == "__main__":
    sys.exit(main())
