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
from onnx2bir.cli import debug as debug_command
from onnx2bir.cli import run as run_command
from onnx2bir.cli.flag_groups import (
    COMPILE,
    INPUTS,
    TOLERANCE,
    VALIDATION_OUTPUT,
    VALIDATION_RUN,
    add_model_arguments,
    add_validate_arguments,
)
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
    add_model_arguments(convert)
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
    add_model_arguments(validate)
    add_validate_arguments(validate)
    report = commands.add_parser(
        "report",
        help="what the compiler found and decided for MODEL",
        description="List what the passes decided for MODEL — each convolution's kernel or "
        "why it fell back to the generic path, attention and MLP blocks — and "
        "whether the model compiles, without simulating. Exit 0: it compiles; 1: it does "
        "not (the report says why).",
    )
    add_model_arguments(report)
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
    add_model_arguments(profile)
    profile.add_argument(
        "--trace", required=True, metavar="OUT.json", help="the Chrome trace-event file to write"
    )
    profile.add_argument("--svg", metavar="OUT.svg", help="also draw the timeline as SVG")
    from onnx2bir.sweep import run as sweep

    sweep.add_parser(commands)
    run_command.register(commands)
    debug_command.register(commands)
    return parser


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
    compilation = api.compile(
        args.model, options=COMPILE.options(args), **INPUTS.shapes(args)
    ).save(args.output)
    text = compilation.text()
    if args.stats:
        text += "\npass statistics:\n" + _stats_text(compilation.to_json()["pass_statistics"])
    _emit(args, compilation.to_json(), text)
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    INPUTS.check_arrays(args)
    VALIDATION_OUTPUT.check(args)
    tolerance = TOLERANCE.options(args)  # a bad --tolerance is refused before the options
    result = api.validate(
        args.model,
        args.inputs,
        options=COMPILE.options(args),
        input_options=INPUTS.options(args),
        tolerance_options=tolerance,
        run_options=VALIDATION_RUN.options(args),
    )
    VALIDATION_OUTPUT.write(args, result)
    _emit(args, result.to_json(), result.text(stats=args.stats))
    return EXIT_OK if result.passed else EXIT_MISMATCH


def cmd_report(args: argparse.Namespace) -> int:
    if args.annotate is not None:
        output_paths.check_file(args.annotate, "--annotate")
    if args.html is not None:
        output_paths.check_file(args.html, "--html")
    result = api.report(
        args.model, annotate=args.annotate, options=COMPILE.options(args), **INPUTS.shapes(args)
    )
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
    compilation = api.compile(args.model, options=COMPILE.options(args), **INPUTS.shapes(args))
    profile = profiler.build_profile(args.model, compilation.module)
    written = profiler.write_profile(profile, args.trace, args.svg)
    doc = profiler.summary_json(profile, written)
    _emit(args, doc, profiler.summary_text(doc))
    return EXIT_OK


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
    "debug": debug_command.cmd_debug,
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
