"""`onnx2bir debug reduce`: the command line of `onnx2bir/debug/` (docs/debug.md)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from onnx2bir.cli.flag_groups import COMPILE, INPUTS, add_model_arguments, reproducing_flags
from onnx2bir.errors import UserError
from onnx2bir.runtime.oracle.compare import json_safe

EXIT_OK = 0


def register(commands) -> None:
    """Add `debug` and its subcommands, each with the model and the compile options."""
    debug = commands.add_parser(
        "debug",
        help="find what makes a failing model fail (reduce) or drift (precision)",
        description="Tools for a model that fails to compile, mismatches or races. docs/debug.md.",
    )
    tools = debug.add_subparsers(dest="debug_command", required=True, parser_class=type(debug))
    reduce = tools.add_parser(
        "reduce",
        help="cut a failing model down to the smallest model that still fails",
        description="Cut MODEL down to a small model that still fails: first stop the model "
        "after the earliest node that still fails, then drop what that node does not need, then "
        "begin the model as late as still fails, feeding the cut tensors onnxruntime's values "
        "(floats computed from the inputs become graph inputs, the rest constants). 'Fails' is "
        "onnx2bir's own verdict — the same kind of failure as MODEL's: a refusal with the same "
        "message, an unsupported op, a mismatch, a race, a machine refusal, an internal error — "
        "or, with --check, a command's. Writes OUT.onnx (and OUT.inputs.npz for its graph "
        "inputs) and prints the command that shows the failure. Exit 0: written; 2: bad input, "
        "or MODEL does not fail (nothing to reduce).",
    )
    add_model_arguments(reduce)
    _register_precision(tools)
    reduce.add_argument(
        "-o", "--output", required=True, metavar="OUT.onnx", help="the reduced model to write"
    )
    reduce.add_argument(
        "--mode",
        choices=("bisect", "linear"),
        default="bisect",
        help="bisect: halve the range of nodes at each step (about 2·log2(N) candidates); "
        "linear: one node at a time, slower but right when the failure comes and goes along "
        "the model (default %(default)s)",
    )
    reduce.add_argument(
        "--check",
        metavar="CMD",
        help="judge each candidate by this command instead of onnx2bir: the candidate's path "
        "replaces {} (appended when there is no {}), its inputs file ({} with .inputs.npz) "
        "replaces {inputs}; exit 0 means the candidate is good, anything else that it fails",
    )
    reduce.add_argument(
        "--fail-regex",
        metavar="RE",
        help="a failure counts only when its message (with --check: the command's output) "
        "matches RE",
    )
    reduce.add_argument(
        "--inputs",
        metavar="FILE.npz|DIR",
        help="the model's inputs (default: seeded random, as validate makes them)",
    )
    reduce.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    reduce.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr (one per candidate)"
    )


def _register_precision(tools) -> None:
    precision = tools.add_parser(
        "precision",
        help="find the nodes to keep in fp32 for the autocast's drift to meet a target",
        description="Find a small set of the nodes MODEL's program rounds (under --auto-cast "
        "and --auto-cast-type) that, kept in fp32, make every output's drift from fp32 "
        "onnxruntime meet --max-drift: bisection over those nodes in the model's order (the "
        "first N, or with --dir reverse the last N), then a greedy pass that drops each one "
        "the target holds without. Writes EXCLUDE.txt for --auto-cast-exclude-file. Exit 0: "
        "written (the target is met); 1: not even every node in fp32 meets it; 2: bad input.",
    )
    add_model_arguments(precision)
    precision.add_argument(
        "-o", "--output", required=True, metavar="EXCLUDE.txt", help="the exclusion file to write"
    )
    precision.add_argument(
        "--max-drift",
        required=True,
        metavar="KEY=VALUE[,...]",
        help="the drift every output must meet: cosine=C (at least), snr=DB (at least), "
        "r=R (at most), comma-separated (docs/validation.md#drift)",
    )
    precision.add_argument("--mode", choices=("bisect", "linear"), default="bisect")
    precision.add_argument(
        "--dir",
        dest="direction",
        choices=("forward", "reverse"),
        default="forward",
        help="keep the first N casting nodes in fp32 (forward) or the last N (reverse) "
        "before the greedy pass (default %(default)s)",
    )
    precision.add_argument("--inputs", metavar="FILE.npz|DIR", help="the model's inputs")
    precision.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    precision.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _compile_flags(argv: list[str]) -> list[str]:
    """The compile flags of the command line, to repeat in the command that shows the
    failure."""
    keep, words, index = [], list(argv), 0
    with_value, switches = reproducing_flags()
    while index < len(words):
        word = words[index]
        name = word.split("=", 1)[0]
        if name in with_value:
            keep.append(word)
            if "=" not in word and index + 1 < len(words):
                keep.append(words[index + 1])
                index += 1
        elif word in switches:
            keep.append(word)
        index += 1
    return keep


def shown_by(doc: dict, argv: list[str], check: str | None) -> str:
    """The command that shows the reduced model's failure."""
    out, inputs = doc["output"], doc["inputs"]
    if check:
        words = shlex.split(check)
        words = [w.replace("{inputs}", inputs or "") for w in words]
        if not any("{}" in w for w in words):
            words.append(out)
        return shlex.join(w.replace("{}", out) for w in words)
    flags = _compile_flags(argv)
    if doc["original_failure"]["kind"] in ("unsupported op", "does not compile"):
        return shlex.join(["onnx2bir", "report", out, *flags])
    words = ["onnx2bir", "validate", out, *flags]
    if inputs:
        words += ["--inputs", inputs]
    if doc["original_failure"]["kind"] == "race":
        words.append("--check-races")
    return shlex.join(words)


def cmd_debug(args: argparse.Namespace) -> int:
    """`debug reduce` and `debug precision`: the flags parsed, then the tool run."""
    from onnx2bir.debug.reduce import reduce_model

    if args.input_value:
        raise UserError(
            f"debug {args.debug_command} does not take --input-value yet: it cuts and runs "
            "the model as the file has it (validate takes --input-value)"
        )
    options, sized = COMPILE.options(args), INPUTS.shapes(args)
    shapes, dims = sized["input_shapes"], sized["dims"]
    progress = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr))
    if args.debug_command == "precision":
        return _precision(args, options, shapes, dims, progress)
    doc = reduce_model(
        args.model,
        options,
        args.output,
        mode=args.mode,
        check=args.check,
        fail_regex=args.fail_regex,
        inputs=args.inputs,
        seed=args.seed,
        input_shapes=shapes,
        dims=dims,
        progress=progress,
    )
    doc["command"] = shown_by(doc, args.argv, args.check)
    if args.json:
        print(json.dumps(json_safe(doc), indent=1))
        return EXIT_OK
    culprit = doc["culprit"]
    lines = [
        f"reduced {doc['model']}: {doc['nodes_before']} nodes -> {doc['nodes_after']}, in "
        f"{doc['evaluations']} candidates ({doc['mode']}, {doc['wall_seconds']:.1f} s)",
        f"  fails: {doc['failure']['kind']}: {doc['failure']['message']}",
        f"  ends at node {culprit['node']} ({culprit['op_type']}, #{culprit['index']})",
        f"  wrote {doc['output']}" + (f" and {doc['inputs']}" if doc["inputs"] else ""),
        f"  shown by: {doc['command']}",
    ]
    lines += [f"  note: {note}" for note in doc["notes"]]
    print("\n".join(lines))
    return EXIT_OK


def _drift_text(result: dict) -> str:
    parts = []
    for name, record in result["drift"].items():
        r = "-" if record["r"] is None else f"{record['r']:.3f}"
        parts.append(f"{name}: cosine {record['cosine']:.6f}, SNR {record['snr_db']:.1f} dB, R {r}")
    return "; ".join(parts)


def _precision(args, options, shapes, dims, progress) -> int:
    from onnx2bir.debug.precision import search_precision

    doc = search_precision(
        args.model,
        options,
        args.output,
        max_drift=args.max_drift,
        mode=args.mode,
        direction=args.direction,
        inputs=args.inputs,
        seed=args.seed,
        input_shapes=shapes,
        dims=dims,
        progress=progress,
    )
    if args.json:
        print(json.dumps(json_safe(doc), indent=1))
        return EXIT_OK if doc["meets"] else 1
    lines = [
        f"{doc['model']} under --auto-cast {doc['autocast']}: {doc['casting_nodes']} casting "
        f"nodes; {doc['evaluations']} validations ({doc['mode']}, {doc['direction']}, "
        f"{doc['wall_seconds']:.1f} s)",
        f"  before: {_drift_text(doc['before'])}",
    ]
    if not doc["meets"]:
        every = doc["all_fp32"]
        lines.append(
            "  not met even with every casting node in fp32"
            + (f": {_drift_text(every)}" if every else "")
        )
        print("\n".join(lines))
        return 1
    lines += [
        f"  after:  {_drift_text(doc['after'])}",
        f"  kept in fp32: {len(doc['excluded'])} of {doc['casting_nodes']} casting nodes ("
        f"{doc['prefix']} before the greedy pass): "
        + ", ".join(f"{e['node']} ({e['op_type']})" for e in doc["excluded"][:12])
        + (" ..." if len(doc["excluded"]) > 12 else ""),
        f"  wrote {doc['output']}; use it with --auto-cast-exclude-file {doc['output']}",
    ]
    if not doc["passed"]:
        lines.append("  note: the program does not match the emulating oracle (run validate)")
    print("\n".join(lines))
    return EXIT_OK
