"""The Python API: compile, validate, report and run, as the command line does them.

    import onnx2bir
    result = onnx2bir.validate("models/resnet18.onnx")
    result.passed                      # True
    result.to_json()                   # exactly what `onnx2bir validate --json` prints

Every function takes the model as a path (or an `onnx.ModelProto`) and the compile options as
keywords named as on the command line with `-` spelled `_` (`enable_native_kernel_attention=True`,
`native_kernel_cast_type="all-to-fp16"`, `target="sunda"`; the fields of `CompileOptions`), or a
whole `options=CompileOptions(...)`. `input_shapes={"x": (1, 3, 224, 224)}` and
`dims={"batch": 1}` fix symbolic dimensions as `--input-shape` and `--dim` do.

Results are frozen dataclasses; `.to_json()` is the command's `--json` document and `.text()`
its text output. Errors are exceptions from `onnx2bir.errors`: `UserError` (bad input, exit 2
on the command line), `CompileError` (the model reads but does not compile, exit 1),
`MachineError` (the program broke a hardware rule, exit 1). docs/api.md has the reference.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnx2bir import compiler, output_paths
from onnx2bir.api.options import ModelSource, compile_options
from onnx2bir.api.options import model_label as _model_label
from onnx2bir.api.validate import ValidationResult, read_input_arrays, validate
from onnx2bir.bir.ir import Module
from onnx2bir.errors import UserError
from onnx2bir.options import CompileOptions
from onnx2bir.reporting.notes import flag_notes, shape_notes

__all__ = [
    "Compilation",
    "Report",
    "ValidationResult",
    "compile",
    "compile_options",
    "read_input_arrays",
    "report",
    "run",
    "validate",
]


# --- compile -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Compilation:
    """A compiled model: the BIR module and what the passes decided.

    `details` is the compiler's own record (the graph after the passes, the pass manager with
    its statistics, the timings); `files` lists what `save` wrote.
    """

    model: str
    options: CompileOptions
    details: compiler.Compilation
    files: tuple[str, ...] = ()
    notes: tuple[dict, ...] = ()  # flags that asked for something that did not happen

    @property
    def module(self) -> Module:
        return self.details.module

    @property
    def instruction_count(self) -> int:
        return sum(1 for _ in self.module.functions[0].instructions())

    def save(self, folder: str | os.PathLike) -> Compilation:
        """Write `<folder>/<model>.bir.json` and `<model>.consts.bin` (folders created as
        needed, nothing left behind on failure); returns the compilation with `files` set."""
        files = write_bir(self.module, Path(folder), _stem(self.model, self.module))
        return dataclasses.replace(self, files=tuple(str(f) for f in files))

    def to_json(self) -> dict:
        """The document `onnx2bir convert --json` prints."""
        function = self.module.functions[0]
        engines = Counter(i.engine.value for i in function.instructions())
        return {
            "model": self.model,
            "compiles": True,
            "files": list(self.files),
            "instructions": {
                "total": sum(engines.values()),
                "per_engine": dict(sorted(engines.items())),
            },
            "ops": dict(sorted(self.details.source_ops.items())),
            "pass_statistics": [s.to_json() for s in self.details.passes.statistics],
            "compile_options": self.options.to_json(),
            "notes": list(self.notes),
            "timings": {k: round(v, 6) for k, v in self.details.timings.items()},
        }

    def text(self) -> str:
        """What `onnx2bir convert` prints."""
        lines = [f"note: {n['flag']}: {n['message']}" for n in self.notes]
        if self.files:
            json_file = next(f for f in self.files if f.endswith(".bir.json"))
            others = [f for f in self.files if f != json_file]
            lines.append(
                f"wrote {json_file} ({self.instruction_count} instructions)"
                + (f" and {', '.join(others)}" if others else "")
            )
        else:
            lines.append(f"compiled {self.model}: {self.instruction_count} instructions")
        return "\n".join(lines)


def compile(  # noqa: A001 (the API's name for it)
    model: ModelSource,
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    dims: Mapping[str, int] | None = None,
    input_values: Mapping[str, object] | None = None,
    options: CompileOptions | None = None,
    **compile_option_values,
) -> Compilation:
    """Compile `model` to BIR. Raises `CompileError` when it does not compile."""
    opts = compile_options(options, **compile_option_values)
    shapes = dict(input_shapes or {})
    details = compiler.compile_model(
        model, opts, shapes, dict(dims or {}), input_values=dict(input_values or {})
    )
    notes = shape_notes(model, shapes) + flag_notes(opts, details)
    return Compilation(_model_label(model), opts, details, notes=tuple(notes))


def _stem(model: str, module: Module) -> str:
    return Path(model).name.removesuffix(".onnx") if model != "<ModelProto>" else module.name


def write_bir(module: Module, out: Path, stem: str) -> list[Path]:
    """The module's files in `out` (created with its parents), written through a staging
    folder so a failure leaves nothing half-written (`onnx2bir.output_paths`)."""
    from onnx2bir.bir.json_io import write_module

    output_paths.check_folder(out, "-o")
    with output_paths.stage_folder(out) as staging:
        files = write_module(module, staging, stem)
    return [out / path.name for path in files]


# --- report --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Report:
    """What the compiler found and decided for a model (`onnx2bir report`)."""

    document: dict
    details: compiler.Compilation = field(repr=False, compare=False)

    @property
    def compiles(self) -> bool:
        return self.document["compiles"]

    def to_json(self) -> dict:
        """The document `onnx2bir report --json` prints."""
        return self.document

    def text(self, all_reasons: bool = False) -> str:
        from onnx2bir.reporting import document

        return document.format_report(self.document, all_reasons=all_reasons)

    def explain(self, node: str) -> str:
        """The whole kernel-registry walk for one convolution (`report --explain NODE`)."""
        from onnx2bir.reporting import document

        try:
            return document.explain_conv(self.document, node)
        except KeyError as exc:
            raise UserError(exc.args[0]) from exc

    def html(self, path: str | os.PathLike) -> Path:
        """Write the report page (`report --html`): one self-contained HTML file."""
        from onnx2bir.reporting.html import write_page

        return write_page(path, self.document, None, self.details)


def report(
    model: ModelSource,
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    dims: Mapping[str, int] | None = None,
    input_values: Mapping[str, object] | None = None,
    annotate: str | os.PathLike | None = None,
    options: CompileOptions | None = None,
    **compile_option_values,
) -> Report:
    """The passes' decisions for `model`, compiled or not (`compiles` says which).

    `annotate` also writes the model with each node's decisions as node metadata."""
    from onnx2bir.reporting.document import build_report

    opts = compile_options(options, **compile_option_values)
    shapes, symbols = dict(input_shapes or {}), dict(dims or {})
    values = dict(input_values or {})
    prepared = None
    if annotate is not None:  # the annotation needs the folded model to name unnamed nodes
        from onnx2bir.validation.prepared import prepare

        prepared = prepare(model, opts, shapes, symbols, keep_going=True, input_values=values)
        details = prepared.compilation
    else:
        details = compiler.compile_model(
            model, opts, shapes, symbols, keep_going=True, input_values=values
        )
    doc = build_report(_model_label(model), details)
    doc["compile_options"] = opts.to_json()
    doc["notes"] = shape_notes(model, shapes) + flag_notes(opts, details)
    if prepared is not None:
        from onnx2bir.reporting.annotate import annotate_model

        count = annotate_model(model, prepared, doc, annotate)
        doc["annotated"] = {"path": str(annotate), "nodes": count}
    return Report(doc, details)


# --- run -----------------------------------------------------------------------------------
def run(
    bir: str | os.PathLike | Module | Compilation,
    inputs: str | os.PathLike | Mapping[str, np.ndarray],
    *,
    schedule: str = "program",
    check_races: bool = False,
) -> dict[str, np.ndarray]:
    """Run a compiled program on the machine: its outputs by tensor name.

    `bir`: a `.bir.json` file written by `convert` (its `.consts.bin` beside it; verified when
    read), a `Module` or a `Compilation`. `inputs`: {graph input: array}, or an .npz file.
    `schedule` and `check_races` are `onnx2bir run`'s: the order the streams run in
    ("program", "random:SEED", "timeline") and the race detector, whose first race is raised
    as a MachineError naming both instructions.
    """
    from onnx2bir.bir.json_io import read_module
    from onnx2bir.bir.verify import check_module
    from onnx2bir.errors import MachineError
    from onnx2bir.runtime.machine import interpreter
    from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
    from onnx2bir.runtime.oracle import input_files

    if isinstance(bir, Compilation):
        module = bir.module
    elif isinstance(bir, Module):
        module = bir
    else:
        path = Path(bir)
        if not path.is_file():
            raise UserError(f"{path}: no such BIR file")
        module = read_module(path)
        check_module(module, str(path))
    function = module.functions[0]
    if isinstance(inputs, Mapping):
        feeds = {name: np.asarray(value) for name, value in inputs.items()}
    elif Path(inputs).suffix == ".npz":
        input_files.check_inputs_source(inputs)
        shapes = {name: tuple(function.memory_locations[name].shape) for name in function.inputs}
        feeds = input_files.read_npz(Path(inputs), shapes)
    else:
        raise UserError(f"{inputs}: run takes inputs as an .npz file or a mapping")
    missing = [name for name in function.inputs if name not in feeds]
    extra = sorted(set(feeds) - set(function.inputs))
    if missing or extra:
        raise UserError(
            f"the program's inputs are {', '.join(function.inputs)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; no input named {', '.join(extra)}" if extra else "")
        )
    plan = parse_schedule(schedule)
    if plan.kind == "program" and not check_races:  # the interpreter: no unrolled program
        raw = interpreter.run_function(module, feeds)
    else:
        result = run_scheduled(module, feeds, plan, check_races)
        if result.races:
            raise MachineError(result.races[0].message())
        raw = result.outputs
    return {name.removesuffix(":output"): raw[name] for name in function.outputs}
