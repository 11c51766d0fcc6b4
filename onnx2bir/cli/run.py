"""`onnx2bir run BIR_JSON --inputs FILE.npz`: run a saved BIR program on the machine model.

In: a `<stem>.bir.json` written by `convert` (its constants sidecar beside it), an .npz of
input arrays keyed by the function's input names. The module is read, verified
(`bir.verify`), then run under a schedule (`runtime/machine/schedule.py`), optionally with the race
detector (`runtime/machine/races.py`). Out: a summary (text or `--json`), the outputs with
`--save-outputs`, and the exit status: 0 ran (race-free when checked), 1 a race was found
(one line each) or the machine rejected the program, 2 bad input (unreadable or unverifiable
file, missing or ill-shaped inputs, a bad flag value).

JSON document: {"bir", "function", "schedule", "instances", "streams", "races": null | [race],
"race_count", "outputs": [{"name", "location", "shape", "dtype"}], "saved": path | null}.

With `--model MODEL.onnx` the program is also judged against the model: the outputs and the
intermediates the program stores are compared with onnxruntime rounding where the program
rounds, under the cast plan and input shapes the program's metadata records (a program edited
by hand keeps them), and the document is validate's (`onnx2bir.validation.run`): exit 1
when an output or a checked intermediate is outside its bound.
"""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path

import numpy as np

from onnx2bir.cli.flag_groups import VALIDATION_RUN
from onnx2bir.errors import UserError

EXIT_OK, EXIT_RACE = 0, 1
OUTPUT_SUFFIX = ":output"  # the copy of a graph output that is also an input or a constant


def register(commands) -> None:
    run = commands.add_parser(
        "run",
        help="run a saved BIR program (BIR_JSON) on the machine model",
        description="Read BIR_JSON (and its constants sidecar), verify it, and run it on the "
        "NeuronCore model with the inputs of FILE.npz. Exit 0: it ran (race-free when "
        "checked); 1: a race was found (one line each) or the machine rejected it; 2: bad "
        "input.",
    )
    run.add_argument("bir", metavar="BIR_JSON", help="a <stem>.bir.json written by convert")
    run.add_argument(
        "--inputs",
        required=True,
        metavar="FILE.npz",
        help="input arrays keyed by the function's input names (the graph input names)",
    )
    run.add_argument(
        "--save-outputs",
        metavar="OUT.npz",
        help="write the outputs (.npz, or a test_data_set folder of output_K.pb)",
    )
    run.add_argument(
        "--model",
        metavar="MODEL.onnx",
        help="also judge the outputs, and the intermediates the program stores, against this "
        "model on onnxruntime rounding where the program rounds (the cast plan and options the "
        "program's metadata records; docs/validation.md#verdict): exit 1 on a mismatch",
    )
    VALIDATION_RUN.add_concurrency_arguments(run)
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def _read(path: Path):
    from onnx2bir.bir.json_io import read_module
    from onnx2bir.bir.verify import check_module

    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        module = read_module(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: cannot read BIR: {exc}") from exc
    check_module(module, str(path))
    if not module.functions:
        raise UserError(f"{path}: the module has no function")
    return module


def _inputs(path: Path, function) -> dict[str, np.ndarray]:
    from onnx2bir.runtime.oracle import input_files

    input_files.check_inputs_source(path)
    if not path.is_file():
        raise UserError(f"{path}: not a file; --inputs wants an .npz file")
    if not zipfile.is_zipfile(path):
        raise UserError(f"{path}: not a readable .npz file")
    with zipfile.ZipFile(path) as archive:
        names = [name.removesuffix(".npy") for name in archive.namelist()]
    missing = [name for name in function.inputs if name not in names]
    extra = sorted(set(names) - set(function.inputs))
    if missing or extra:
        raise UserError(
            f"{path}: the function's inputs are {function.inputs}; "
            f"missing {missing}, unknown {extra}"
        )
    # Each array's header (dtype, shape) is checked before its data is read.
    arrays = input_files.read_npz(
        path, {name: tuple(function.memory_locations[name].shape) for name in function.inputs}
    )
    for name in function.inputs:
        loc = function.memory_locations[name]
        array = arrays[name]
        if array.shape != tuple(loc.shape) or array.dtype != loc.dtype.numpy:
            raise UserError(
                f"{path}: input {name!r} is {array.dtype}{list(array.shape)}, the program "
                f"wants {loc.dtype}{list(loc.shape)}"
            )
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
    from onnx2bir.runtime.oracle.ort import check_arrays_target
    from onnx2bir.validation.run import save_outputs

    plan = parse_schedule(args.schedule)
    if args.save_outputs is not None:
        check_arrays_target(args.save_outputs, "output")
    path = Path(args.bir)
    module = _read(path)
    function = module.functions[0]
    feeds = _inputs(Path(args.inputs), function)
    if args.model is not None:
        return _run_against_model(args, module, feeds)
    run = run_scheduled(module, feeds, plan, args.check_races)
    outputs = {name.removesuffix(OUTPUT_SUFFIX): value for name, value in run.outputs.items()}
    saved = None
    if args.save_outputs:
        saved = save_outputs(args.save_outputs, outputs)
    races = run.races
    if args.json:
        doc = {
            "bir": str(path),
            "function": function.name,
            "schedule": str(plan),
            "instances": run.instances,
            "streams": run.streams,
            "races": None if races is None else [race.to_json() for race in races],
            "race_count": run.race_count,
            "outputs": [
                {
                    "name": name.removesuffix(OUTPUT_SUFFIX),
                    "location": name,
                    "shape": list(value.shape),
                    "dtype": str(value.dtype),
                }
                for name, value in run.outputs.items()
            ],
            "saved": None if saved is None else str(saved),
        }
        print(json.dumps(doc, indent=1))
    else:
        if races is None:
            checked = "not checked (--check-races)"
        elif len(races) < run.race_count:
            checked = f"{len(races)} instruction pairs shown ({run.race_count} racing accesses)"
        else:
            checked = f"{len(races)} found"
        print(
            f"ran {path}: {run.instances} instruction executions on {len(run.streams)} "
            f"streams, schedule {plan}; races: {checked}"
        )
        for race in races or []:
            print(race.message())
        for name, value in outputs.items():
            print(f"  output {name} {value.dtype}{list(value.shape)}")
        if saved is not None:
            print(f"wrote {saved}")
    return EXIT_RACE if races else EXIT_OK


def _run_against_model(args: argparse.Namespace, module, feeds: dict[str, np.ndarray]) -> int:
    from onnx2bir.frontend.importer import read_model
    from onnx2bir.validation.run import check_program, save_outputs
    from onnx2bir.validation.text import format_text

    # a missing or unreadable model is bad input, said before the run
    read_model(args.model, weights=False)
    doc, outputs = check_program(
        module, feeds, args.model, schedule=args.schedule, check_races=args.check_races
    )
    doc["bir"] = str(args.bir)
    if args.save_outputs:
        doc["saved"] = str(save_outputs(args.save_outputs, outputs))
    if args.json:
        from onnx2bir.runtime.oracle.compare import json_safe

        print(json.dumps(json_safe(doc), indent=1))
    else:
        doc.setdefault("inputs", [])
        doc.setdefault("seed", None)
        doc.setdefault("tolerance", {"rule": "|machine - oracle| <= atol + rtol * |oracle|"})
        doc.setdefault("timings", {})
        doc["model"] = f"{args.bir} (for {args.model})"
        print(format_text(doc))
    return EXIT_OK if doc["passed"] else EXIT_RACE
