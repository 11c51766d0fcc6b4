"""`onnx2bir debug reduce`: the command line of `onnx2bir/debug/` (docs/debug.md)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from onnx2bir.runtime.oracle.compare import json_safe

EXIT_OK = 0


def register(commands, common) -> None:
    """Add `debug` and its subcommands; `common(parser)` adds the model and compile options."""
    debug = commands.add_parser(
        "debug",
        help="find what makes a failing model fail (reduce)",
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
    common(reduce)
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


def _compile_flags(argv: list[str]) -> list[str]:
    """The compile flags of the command line, to repeat in the command that shows the
    failure."""
    keep, words, index = [], list(argv), 0
    with_value = {
        "--input-shape",
        "--dim",
        "--auto-cast",
        "--auto-cast-type",
        "--native-kernel-cast-type",
        "--target",
        "--dynamic-dma-sbuf-bytes",
    }
    switches = {
        "--enable-native-kernel-attention",
        "--enable-native-kernel-attention-bf16",
        "--experimental-convolution-kernel-match",
        "--no-memory-plan",
    }
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


def cmd_debug(args: argparse.Namespace, options: dict) -> int:
    """`options`: the compile options and shapes of the command line, as API keywords."""
    from onnx2bir.debug.reduce import reduce_model
    from onnx2bir.options import CompileOptions

    shapes, dims = options.pop("input_shapes"), options.pop("dims")
    progress = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr))
    doc = reduce_model(
        args.model,
        CompileOptions(**options),
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
