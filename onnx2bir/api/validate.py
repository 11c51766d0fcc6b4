"""`onnx2bir.validate` and its result (re-exported by `onnx2bir.api`; docs/api.md#validate).

Compile `model`, run it on the machine and compare every output with onnxruntime, as
`onnx2bir validate` does; `ValidationResult.to_json()` is that command's `--json` document.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx

from onnx2bir import compiler
from onnx2bir.api.options import (
    InputOptions,
    ModelSource,
    ToleranceOptions,
    ValidationRunOptions,
    validate_options,
)
from onnx2bir.errors import UserError
from onnx2bir.options import CompileOptions
from onnx2bir.reporting.notes import flag_notes, shape_notes


# --- validate ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ValidationResult:
    """The outcome of `onnx2bir validate`: the document, the inputs used and the machine's
    outputs."""

    document: dict
    inputs: dict[str, np.ndarray] = field(repr=False, compare=False)
    outputs: dict[str, np.ndarray] = field(repr=False, compare=False)
    details: compiler.Compilation | None = field(default=None, repr=False, compare=False)
    # --segments: no whole-model compilation was made; the page's report sections make one.
    compile_whole: Callable[[], compiler.Compilation] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def passed(self) -> bool:
        return self.document["passed"]

    def to_json(self) -> dict:
        """The document `onnx2bir validate --json` prints (non-finite floats as None)."""
        from onnx2bir.runtime.oracle.compare import json_safe

        return json_safe(self.document)

    def text(self, stats: bool = False) -> str:
        from onnx2bir.validation.text import format_segments_text, format_text

        if "segments" in self.document:
            return format_segments_text(self.document)
        return format_text(self.document, stats=stats)

    def html(self, path: str | os.PathLike) -> Path:
        """Write the report page with this run's errors (`validate --html`)."""
        from onnx2bir.reporting.document import build_report
        from onnx2bir.reporting.html import write_page

        details = self.details
        if details is None and self.compile_whole is not None:
            details = self.compile_whole()
        doc = build_report(self.document["model"], details)
        doc["notes"] = self.document.get("notes", [])
        return write_page(path, doc, self.document, details)

    def save_inputs(self, path: str | os.PathLike) -> Path:
        from onnx2bir.validation.run import save_inputs

        return save_inputs(path, self.inputs)

    def save_outputs(self, path: str | os.PathLike) -> Path:
        from onnx2bir.validation.run import save_outputs

        return save_outputs(path, self.outputs)


def validate(
    model: ModelSource,
    inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
    *,
    options: CompileOptions | None = None,
    input_options: InputOptions | None = None,
    tolerance_options: ToleranceOptions | None = None,
    run_options: ValidationRunOptions | None = None,
    **keywords,
) -> ValidationResult:
    """Compile `model`, run it on the machine and compare every output with onnxruntime.

    `inputs`: an .npz file or an ONNX test_data_set folder, or a {name: array} mapping;
    default seeded random inputs (`seed`). Their shapes fix the model's symbolic dimensions.
    The options come in groups (`onnx2bir.api.options`), each given whole or as keywords
    named as its fields, keywords overriding the group's fields: `options` the compile options
    (`CompileOptions`); `input_options` the shapes, values and seed (`InputOptions`:
    `input_shapes`, `dims`, `input_values`, `seed`); `tolerance_options` the bounds
    (`ToleranceOptions`: `atol`, `rtol`, `tolerance` / `op_tolerance` {tensor or op type:
    (atol, rtol)}, None keeping the default, `tolerance_file`); `run_options` how the run is
    checked (`ValidationRunOptions`: `localize` every intermediate within `localize_budget` MB,
    `progress`, `schedule` "program", "random:SEED" or "timeline" with `check_races`,
    `reference` outputs to measure drift against instead of plain fp32 onnxruntime (an .npz,
    a test_data_set folder — whose inputs are used when `inputs` is not given — or arrays),
    `max_drift` "cosine=0.999,snr=30,r=1.2" (or {"cosine": 0.999, ...}) limits on the drift
    that fail the validation (docs/validation.md#drift), `segments` pieces validated each from
    onnxruntime's values at its inputs, `jobs` processes at a time or as Ray tasks (`use_ray`,
    `ray_address`; docs/validation.md#segments)).
    """
    from onnx2bir.runtime.oracle.tolerance import Partial, TolerancePolicy, load_tolerance_file
    from onnx2bir.runtime.oracle.verdict import parse_max_drift
    from onnx2bir.validation.run import run_validate

    opts, input_opts, tolerance_opts, run_opts = validate_options(
        options, (input_options, tolerance_options, run_options), keywords
    )
    reference, max_drift = run_opts.reference, run_opts.max_drift
    for flag, value in (("atol", tolerance_opts.atol), ("rtol", tolerance_opts.rtol)):
        if value is not None and not value >= 0:
            raise UserError(f"--{flag} {value}: must be a number >= 0")
    if not run_opts.localize_budget > 0:
        raise UserError(f"--localize-budget {run_opts.localize_budget}: must be > 0")
    policy = TolerancePolicy(atol=tolerance_opts.atol, rtol=tolerance_opts.rtol)
    if tolerance_opts.tolerance_file:
        load_tolerance_file(tolerance_opts.tolerance_file, policy)
    for name, (a, r) in (tolerance_opts.tolerance or {}).items():
        policy.tensors[name] = Partial(a, r, f"--tolerance {name}")
    for name, (a, r) in (tolerance_opts.op_tolerance or {}).items():
        policy.op_types[name] = Partial(a, r, f"--op-tolerance {name}")
    limits = dict(max_drift) if isinstance(max_drift, Mapping) else parse_max_drift(max_drift)
    if isinstance(max_drift, Mapping):
        parse_max_drift(",".join(f"{k}={v}" for k, v in limits.items()))  # the same checks
    if reference is not None and not isinstance(reference, Mapping):
        reference = str(reference)
        if inputs is None and Path(reference).is_dir():
            inputs = reference  # a test_data_set folder holds the inputs of its outputs
    shapes = dict(input_opts.input_shapes or {})
    values = dict(input_opts.input_values or {})
    arrays = None
    fixed_notes: list[str] = []
    if inputs is not None:
        from onnx2bir.frontend.importer import read_model, refuse_unsupported_types

        # before reading files; the graph's inputs alone, so the weights are not read
        refuse_unsupported_types(read_model(model, weights=False), inputs_only=True)
        arrays = read_input_arrays(inputs, model)
        fixed, fixed_notes = _compile_time_values(model, arrays, values)
        values.update(fixed)
        arrays = _without_pinned(arrays, values)
        for name, shape in _symbolic_shapes(model, arrays).items():
            shapes.setdefault(name, shape)
    if run_opts.segments is not None or run_opts.segment_memory is not None:
        return _validate_segmented(
            model,
            opts,
            policy,
            run_opts.segments,
            segment_memory=run_opts.segment_memory,
            memory_limit=run_opts.memory_limit,
            input_shapes=shapes,
            dims=dict(input_opts.dims or {}),
            input_values=values,
            inputs=arrays,
            inputs_label=None if isinstance(inputs, Mapping) or inputs is None else str(inputs),
            seed=input_opts.seed,
            jobs=run_opts.jobs,
            use_ray=run_opts.use_ray,
            ray_address=run_opts.ray_address,
            schedule=run_opts.schedule,
            check_races=run_opts.check_races,
            progress=run_opts.progress,
            refused={
                "--localize": run_opts.localize,
                "--reference": reference,
                "--max-drift": limits,
            },
        )
    compiled: list[compiler.Compilation] = []
    doc, feeds, outputs = run_validate(
        model if isinstance(model, onnx.ModelProto) else str(model),
        opts,
        policy,
        input_shapes=shapes,
        dims=dict(input_opts.dims or {}),
        input_values=values,
        inputs=arrays,
        inputs_label=None if isinstance(inputs, Mapping) or inputs is None else str(inputs),
        seed=input_opts.seed,
        localize_nodes=run_opts.localize,
        budget_bytes=int(run_opts.localize_budget * (1 << 20)),
        progress=run_opts.progress,
        on_compiled=compiled.append,
        schedule=run_opts.schedule,
        check_races=run_opts.check_races,
        reference=dict(reference) if isinstance(reference, Mapping) else reference,
        max_drift=limits,
        memory_limit=run_opts.memory_limit,
    )
    details = compiled[0]
    doc["notes"] = shape_notes(model, dict(input_opts.input_shapes or {})) + flag_notes(
        opts, details
    )
    doc["notes"] += [{"flag": "inputs", "message": text} for text in fixed_notes]
    doc["compile_options"] = {
        **doc.get("compile_options", {}),
        **opts.to_json(),
    }
    return ValidationResult(doc, feeds, outputs, details)


def _validate_segmented(model, opts, policy, segments, *, refused, progress, **how):
    import sys

    from onnx2bir.validation.segments import check_compatible, run_segmented

    check_compatible(**refused)
    if how["jobs"] is not None and how["jobs"] < 1:
        raise UserError(f"--jobs {how['jobs']}: must be at least 1")
    lines = (lambda line: print(line, file=sys.stderr)) if progress else (lambda line: None)
    doc, feeds, outputs = run_segmented(
        model if isinstance(model, onnx.ModelProto) else str(model),
        opts,
        policy,
        segments,
        progress=lines,
        **how,
    )
    if doc["internal_errors"]:
        raise RuntimeError("; ".join(doc["internal_errors"]))
    doc["notes"] = []
    doc["compile_options"] = opts.to_json()
    shapes = {name: tuple(value.shape) for name, value in feeds.items()}

    def compile_whole() -> compiler.Compilation:
        return compiler.compile_model(
            model, opts, shapes, how["dims"], keep_going=True, input_values=how["input_values"]
        )

    return ValidationResult(doc, feeds, outputs, None, compile_whole)


def _compile_time_values(model: ModelSource, arrays, values) -> tuple[dict, list[str]]:
    """Inputs the program needs as constants, fixed from the arrays given
    (frontend/compile_time_inputs.py), with their notes."""
    from onnx2bir.frontend.compile_time_inputs import fixed_from_inputs
    from onnx2bir.frontend.importer import read_model

    return fixed_from_inputs(read_model(model, weights=False), arrays, set(values))


def _without_pinned(
    arrays: dict[str, np.ndarray], values: Mapping[str, object]
) -> dict[str, np.ndarray]:
    """The arrays but those of inputs fixed by --input-value; an array there must hold the
    fixed value (the program computes the model for that value only)."""
    for name in set(arrays) & set(values):
        given = np.asarray(arrays[name]).reshape(-1).astype(np.float64)
        fixed = np.asarray(values[name], dtype=np.float64).reshape(-1)
        if given.shape != fixed.shape or not np.array_equal(given, fixed):
            raise UserError(
                f"--input-value {name}: the inputs given hold another value for it "
                f"({np.array2string(given.reshape(-1)[:8], separator=',')}); the program is "
                "compiled for the fixed value only"
            )
    return {name: array for name, array in arrays.items() if name not in values}


def read_input_arrays(
    source: str | os.PathLike | Mapping[str, np.ndarray], model: ModelSource
) -> dict[str, np.ndarray]:
    """Arrays by graph-input name from a mapping, an .npz file or a test_data_set folder."""
    if isinstance(source, Mapping):
        return {name: np.asarray(value) for name, value in source.items()}
    from onnx2bir.frontend.importer import read_model, runtime_inputs
    from onnx2bir.runtime.oracle import ort as oracle

    path = Path(source)
    if path.is_dir():
        names = [v.name for v in runtime_inputs(read_model(model, weights=False))]
        # The folder reader maps unnamed input_K.pb files by position in graph-input order.
        return oracle._read_test_data_set(path, SimpleNamespace(inputs=names))
    from onnx2bir.runtime.oracle import input_files

    input_files.check_inputs_source(path)
    # Headers first: a wrong dtype or an array larger than the host's memory is refused before
    # any data is read. Shapes are compared once --input-shape and the arrays have fixed them.
    names = [value.name for value in runtime_inputs(read_model(model, weights=False))]
    return input_files.read_npz(path, dict.fromkeys(names))


def _symbolic_shapes(model: ModelSource, arrays: dict[str, np.ndarray]) -> dict[str, tuple]:
    """The arrays' shapes for the inputs the model declares with a symbolic or unknown dim."""
    from onnx2bir.frontend.importer import read_model, runtime_inputs

    shapes = {}
    for value in runtime_inputs(read_model(model, weights=False)):
        dims = value.type.tensor_type.shape.dim
        static = all(d.HasField("dim_value") and d.dim_value > 0 for d in dims) and len(dims)
        if value.name in arrays and not static:
            shapes[value.name] = tuple(int(d) for d in np.shape(arrays[value.name]))
    return shapes
