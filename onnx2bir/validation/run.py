"""`onnx2bir validate`: compile, simulate, compare with onnxruntime, and say what it means.

In: a model, compile options, inputs (seeded random, .npz or a test_data_set folder), a
`TolerancePolicy`. Out: the validate document and, for `--save-outputs`, the machine's
outputs. The machine runs in program order with the cast plan's probes (runtime/machine/probes.py);
the verdict (runtime/oracle/verdict.py) compares every output and every probed intermediate with the
emulating oracle (runtime/oracle/emulating.py) and measures drift from plain fp32 onnxruntime
(docs/validation.md#verdict). The document follows DESIGN.md's contract and adds keys (never
renames):

    {"model", "passed", "outputs": [{"name", "shape", "max_abs_err", "max_rel_err", "cosine",
       "atol", "rtol", "passed",   # the contract
       "mismatches", "size", "dtype", "path", "producer", "op_type", "tolerance_source",
       "bound": "fp32" | "statistical" | "exact", "verifiable", "unverifiable_reason",
       "drift": {"against", "cosine", "snr_db", "max_abs_err", "r", "nonfinite_mismatches"},
       "drift_failures", "failed_upstream",
       "abs_err"/"rel_err": {"max", "mean", "median", "p99"},
       "worst": {"index", "machine", "onnxruntime", "abs_err", "rel_err"},
       "min_atol", "min_rtol", "nonfinite": {"machine"|"onnxruntime": {"nan", "posinf",
       "neginf", "first"}}, "nonfinite_mismatches", "max_ulp", "snr_db", "shape_error"}],
     "checkpoints": [{"name", "producer", "op_type", "fused_into", "readers", "stored",
       "passed", "bound", "resynchronised", "verifiable", "max_abs_err", ...}],
     "casts": [{"node", "input", "dtype", "kind", "exact"}], "emulation": {...},
     "drift_limits": {...}, "schedule": "program" | "random:SEED" | "timeline",
     "races": null (not checked) | [{"first", "second", "memory", "location", "partitions",
       "bytes", "message"}], "schedule_differences": [...],
     "timings": {...}, "seed", "inputs": [{"name", "shape", "dtype", "source"}],
     "oracle": {"name", "version", "provider", "graph_optimization_level"},
     "tolerance": {"rule", "defaults"}, "compile_options": {"native_kernel_cast_type",
     "auto_cast", "auto_cast_type"}, "autocast": "matmult -> bf16" | "none",
     "localize": {...} (with --localize, see onnx2bir.validation.localize)}

("worst" keeps the key "onnxruntime" for the oracle's value: keys are never renamed.) A float
that is not finite (an inf error, a NaN cosine) is written as null by
`validation_text.to_json_text`: JSON has no inf. `onnx2bir.validation.text` renders the same
document for a person.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from onnx2bir.bir.cast_plan import CastPlan
from onnx2bir.frontend.memory_contracts import (
    check_validate_fits,
    check_weights_fit,
    initializer_bytes,
)
from onnx2bir.frontend.opset_upgrade import oracle_source
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine import interpreter
from onnx2bir.runtime.machine.probes import ProbeReader, probe_shapes
from onnx2bir.runtime.machine.progress import progress_for
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle import ort as oracle
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.emulating import round_weights, run_emulating
from onnx2bir.runtime.oracle.tolerance import (
    FP32_ATOL,
    FP32_RTOL,
    LOW_PRECISION_RTOL,
    TolerancePolicy,
)
from onnx2bir.runtime.oracle.verdict import Evidence, judge
from onnx2bir.validation.inputs import (
    TIMINGS_EXPLAINED,
    check_policy_names,
    check_reference,
    describe_inputs,
    model_feeds,
)
from onnx2bir.validation.localize import DEFAULT_BUDGET_BYTES, localize
from onnx2bir.validation.prepared import fused_into, output_values, prepare, simulate

RULE = "|machine - oracle| <= atol + rtol * |oracle|"


def run_validate(
    model: str,
    options: CompileOptions,
    policy: TolerancePolicy,
    *,
    input_shapes=None,
    dims=None,
    input_values=None,
    inputs: str | dict[str, np.ndarray] | None = None,
    inputs_label: str | None = None,
    seed: int = 0,
    localize_nodes: bool = False,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    progress: bool = False,
    factories=(),
    on_compiled=None,
    schedule: str = "program",
    check_races: bool = False,
    reference: str | dict[str, np.ndarray] | None = None,
    max_drift: dict[str, float] | None = None,
    memory_limit: int | None = None,
) -> tuple[dict, dict, dict]:
    """(document, feeds, machine outputs); the CLI prints and saves them.

    `inputs`: a file or folder, or arrays already read (`inputs_label` says where from).
    `on_compiled(compilation)` runs before the simulation; `factories` make machine observers
    for `simulate` (test hooks; they imply --localize's machine-level run). Names in the
    policy's `tensors` and `op_types` must exist in the model (`check_policy_names`).
    `schedule` (`runtime/machine/schedule.py`) orders the instructions; `check_races` runs the race
    detector, and a race fails the validation. `reference`: outputs the user supplies (an
    .npz file, a test_data_set folder, or arrays by output name), which replace plain fp32
    onnxruntime as what drift is measured against;
    `max_drift`: limits that make drift fail the verdict (`runtime/oracle/verdict.py`).
    `memory_limit`: the bytes the estimated peak may reach (default: the memory available).
    """
    plan_order = parse_schedule(schedule)
    if localize_nodes:
        # Every intermediate must have a DRAM copy to compare (docs/memory_planner.md#localize).
        options = dataclasses.replace(options, memory_plan=False)
    file_weights = initializer_bytes(model)
    check_weights_fit(file_weights, memory_limit)  # before the model is read whole
    prepared = prepare(model, options, input_shapes, dims, input_values=input_values)
    # Before any input or machine array is made.
    check_validate_fits(
        prepared.pristine,
        prepared.compilation.cast_plan.probes,
        prepared.compilation.module.constants,
        file_weights,
        memory_limit,
    )
    if on_compiled is not None:
        on_compiled(prepared.compilation)
    compilation, graph = prepared.compilation, prepared.pristine
    check_policy_names(policy, graph)
    supplied = None
    if isinstance(reference, dict):
        supplied = (check_reference(reference, graph), "the given reference outputs")
    elif reference is not None:
        supplied = (oracle.load_reference(reference, graph), f"the reference {reference}")
    timings = dict(compilation.timings)
    feeds, sources = model_feeds(graph, inputs, inputs_label, seed)
    function = compilation.module.functions[0]
    plan = compilation.cast_plan
    reader = ProbeReader(function, plan.probes, probe_shapes(plan.probes, graph))
    bar = progress_for(function, progress)
    machine = None
    start = time.perf_counter()
    races = None
    schedule_differences: list[str] = []
    try:
        # The verdict's run is in program order, with the probes (runtime/machine/probes.py).
        if localize_nodes or factories:
            machine = simulate(
                compilation, feeds, bar.observer if bar else None, factories, reader.before()
            )
            actual = output_values(compilation, machine)
        elif check_races and plan_order.kind == "program":
            run = run_scheduled(
                compilation.module,
                feeds,
                plan_order,
                True,
                observer=bar.observer if bar else None,
                before=reader.before(),
            )
            races = run.races
            actual = _named_outputs(compilation, run.outputs)
        else:
            raw = interpreter.run_function(
                compilation.module,
                feeds,
                observer=bar.observer if bar else None,
                before=reader.before(),
            )
            actual = _named_outputs(compilation, raw)
        if plan_order.kind != "program":
            # Another order: its outputs are judged; they must also equal program order's.
            run = run_scheduled(compilation.module, feeds, plan_order, check_races)
            races = run.races
            ordered = actual
            actual = _named_outputs(compilation, run.outputs)
            schedule_differences = _differences(ordered, actual)
    finally:
        if bar:
            bar.close()
    timings["simulate"] = time.perf_counter() - start
    start = time.perf_counter()
    if supplied is not None:
        expected, reference_kind = supplied
    else:
        # onnxruntime runs the original model: the inputs fixed by --input-value are fed to it.
        pinned = compilation.graph.pinned_inputs
        source = oracle_source(model, compilation.graph.upgraded_from)
        expected = oracle.run_onnxruntime(source, {**feeds, **pinned}, graph.outputs)
        reference_kind = "onnxruntime fp32"
    timings["onnxruntime"] = time.perf_counter() - start  # session creation + one run
    start = time.perf_counter()
    evidence = Evidence(actual, reader.values, reader.stored(), expected, reference_kind)
    outputs, checkpoints, emulation = judge(
        graph, plan, evidence, policy, oracle_runner(prepared, feeds), max_drift
    )
    for entry in checkpoints:  # the node that writes a fused node's output
        entry["fused_into"] = fused_into(compilation, entry["producer"])
    rewrite_check = _import_rewrite_check(
        prepared, model, feeds, expected if supplied is None else None
    )
    timings["emulating_oracle"] = time.perf_counter() - start
    doc = {
        "model": model if isinstance(model, str) else "<ModelProto>",
        "passed": all(entry["passed"] for entry in outputs)
        and all(entry["passed"] for entry in checkpoints)
        and all(entry["passed"] for entry in rewrite_check)
        and not races
        and not schedule_differences,
        "schedule": str(plan_order),
        # null: not checked; [] checked and none found
        "races": None if races is None else [race.to_json() for race in races],
        "schedule_differences": schedule_differences,
        # the import's rewrites checked against the model as given ([] when none)
        "import_rewrite_check": rewrite_check,
        "outputs": outputs,
        "checkpoints": checkpoints,
        "emulation": emulation,
        "casts": [point.to_json() for point in plan.points],
        "drift_limits": max_drift or {},
        "timings": {},
        "seed": None if inputs is not None else seed,
        "inputs": describe_inputs(graph, feeds, sources),
        "oracle": oracle.oracle_info(),
        "tolerance": {
            "rule": RULE,
            "defaults": {
                "fp32": {"atol": FP32_ATOL, "rtol": FP32_RTOL},
                "bf16": {
                    "atol": "max(1e-4, 6*u*sqrt(2/3)*sqrt(K)*rho), u=2^-8",
                    "rtol": LOW_PRECISION_RTOL["bf16"],
                },
                **{
                    path: {
                        "atol": f"max(1e-4, 6*u*sqrt(2/3)*sqrt(K)*rho), u=2^{exponent}",
                        "rtol": LOW_PRECISION_RTOL[path],
                    }
                    for path, exponent in (("fp16", -11), ("tf32", -11), ("fp8_e4m3", -4))
                },
                "exact": {"atol": 0.0, "rtol": 0.0},
            },
        },
        "compile_options": {
            "native_kernel_cast_type": options.native_kernel_cast_type,
            "auto_cast": options.auto_cast,
            "auto_cast_type": options.auto_cast_type,
        },
        "autocast": options.autocast_text,
    }
    if localize_nodes:
        start = time.perf_counter()
        resynced = {t: reader.values[t] for t in emulation["resynchronised_tensors"]}
        doc["localize"] = localize(
            prepared, machine, feeds, policy, options, budget_bytes, factories, resynced
        )
        timings["localize"] = time.perf_counter() - start
        del machine
    doc["timings"] = {key: round(value, 6) for key, value in timings.items()}
    doc["timings_explained"] = TIMINGS_EXPLAINED
    doc["pass_statistics"] = [stat.to_json() for stat in compilation.passes.statistics]
    return doc, feeds, actual


def _import_rewrite_check(
    prepared, model, feeds: dict[str, np.ndarray], original: dict[str, np.ndarray] | None
) -> list[dict]:
    """When the import rewrote the model's meaning (`Graph.import_rewrites`: static sequences
    turned into tensors, ops replaced by their ONNX function bodies), the emulating oracle
    runs the rewritten model, so its verdict cannot see a wrong rewrite. Here onnxruntime runs
    the rewritten model without any rounding and the model as given (`original`, computed
    when not already), and each output of the two must agree at the fp32 bound: both are
    fp32 evaluations of the same function, apart only in summation order
    (docs/validation.md#import-rewrites). [] when nothing was rewritten."""
    graph = prepared.compilation.graph
    if not graph.import_rewrites:
        return []
    if original is None:
        source = oracle_source(model, graph.upgraded_from)
        original = oracle.run_onnxruntime(
            source, {**feeds, **graph.pinned_inputs}, prepared.pristine.outputs
        )
    rewritten = run_emulating(
        prepared.folded, prepared.pristine, prepared.weights, CastPlan(), feeds
    )
    checks = []
    for name in prepared.pristine.outputs:
        result = compare_output(name, rewritten[name], original[name])
        checks.append(
            {
                "output": name,
                "rewrites": list(graph.import_rewrites),
                "passed": result.passed,
                "max_abs_err": result.max_abs_err,
            }
        )
    return checks


def oracle_runner(prepared, feeds: dict[str, np.ndarray]):
    """The emulating oracle of a prepared model on `feeds`, as `runtime/oracle/verdict.py`'s `judge`
    calls it: run(machine_values, wanted) → arrays by name (`emulation_runner`)."""
    return emulation_runner(
        prepared.folded,
        prepared.pristine,
        prepared.weights,
        prepared.compilation.cast_plan,
        feeds,
    )


def emulation_runner(
    folded, graph, weights: dict[str, np.ndarray], plan: CastPlan, feeds, rounded=None
):
    """run(machine_values, wanted) → arrays by name: the emulating oracle of `folded`
    (`emulating.run_emulating`), resynchronised at the tensors of `machine_values`, plain when
    it is empty. The weights' roundings (`rounded`, else computed on the first run) are fed to
    every run (`emulating.round_weights`).

    The plain run of a verdict with probes computes the model's own tensors it is asked for
    (the graph outputs and the probes) and not the allowances: the resynchronisation decision
    and the drift read only those, and the allowances are read from it only when no probe is
    fed on, when one more run computes them as it would have (`PlainEmulation`). On light
    resnet50 that is every convolution's allowance copy left out of the first run."""
    weights_rounded = None if rounded is None else dict(rounded)

    def run(machine_values, wanted):
        nonlocal weights_rounded
        if weights_rounded is None:
            weights_rounded = round_weights(folded, weights, plan)

        def emulate(names):
            return run_emulating(
                folded, graph, weights, plan, feeds, machine_values, names, weights_rounded
            )

        own = [t for t in wanted if t in graph.tensors]
        if machine_values or len(own) == len(wanted) or set(own) <= set(graph.outputs):
            return emulate(wanted)
        return PlainEmulation(emulate(own), lambda: emulate(wanted))

    return run


class PlainEmulation(dict):
    """The plain emulation's values of the model's own tensors; the other tensors asked of it
    (allowances) come from one more run, made when one of them is first read."""

    def __init__(self, values: dict[str, np.ndarray], complete):
        super().__init__(values)
        self._complete = complete

    def _fill(self) -> None:
        if self._complete is not None:
            complete, self._complete = self._complete, None
            for name, value in complete().items():
                self.setdefault(name, value)  # the values already read stay as they were

    def __missing__(self, name):
        self._fill()
        return dict.__getitem__(self, name)

    def __contains__(self, name) -> bool:
        if not dict.__contains__(self, name):
            self._fill()
        return dict.__contains__(self, name)

    def get(self, name, default=None):
        return self[name] if name in self else default


def check_program(
    module,
    feeds: dict[str, np.ndarray],
    model: str,
    schedule: str = "program",
    check_races: bool = False,
    policy: TolerancePolicy | None = None,
    max_drift: dict[str, float] | None = None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """`onnx2bir run BIR --model MODEL`: run a saved (perhaps hand-edited) program and judge
    its outputs against MODEL's emulating oracle, with the cast plan and input shapes the
    program's metadata records (onnx2bir/compiler.py `record_provenance`). Returns (the
    document, the outputs)."""
    from onnx2bir.bir.cast_plan import CastPlan
    from onnx2bir.errors import UserError
    from onnx2bir.frontend.importer import build_graph, import_parts

    meta = module.metadata
    if "cast_plan" not in meta or "input_shapes" not in meta:
        raise UserError(
            "the program records no cast plan or input shapes (it was written by an older "
            "onnx2bir, or by hand): convert the model again to check it with --model"
        )
    shapes = {name: tuple(shape) for name, shape in meta["input_shapes"].items()}
    values = meta.get("input_values") or {}
    imported = import_parts(model, shapes, input_values=values)
    graph = build_graph(imported.folded, imported.graph.name, imported.weights)
    function = module.functions[0]
    if sorted(function.inputs) != sorted(graph.inputs) or len(function.outputs) != len(
        graph.outputs
    ):
        raise UserError(
            f"the program's inputs {function.inputs} and {len(function.outputs)} outputs do not "
            f"match the model's inputs {graph.inputs} and {len(graph.outputs)} outputs"
        )
    plan = CastPlan.from_json(meta["cast_plan"])
    unknown = sorted({p.node for p in plan.points} - set(graph.nx))
    if unknown:
        raise UserError(
            f"the program's cast plan names nodes the model lacks ({', '.join(unknown[:3])}): "
            "is it the model the program was compiled from?"
        )
    order = parse_schedule(schedule)
    reader = ProbeReader(function, plan.probes, probe_shapes(plan.probes, graph))
    if order.kind == "program":
        run = run_scheduled(module, feeds, order, check_races, before=reader.before())
        raw, races, differences = run.outputs, run.races, []
    else:
        raw = interpreter.run_function(module, feeds, before=reader.before())
        run = run_scheduled(module, feeds, order, check_races)
        differences = _differences(raw, run.outputs)
        raw, races = run.outputs, run.races
    actual = dict(zip(graph.outputs, (raw[loc] for loc in function.outputs), strict=True))
    evidence = Evidence(
        actual,
        reader.values,
        reader.stored(),
        oracle.run_onnxruntime(
            oracle_source(model, imported.graph.upgraded_from),
            {**feeds, **imported.pinned},
            graph.outputs,
        ),
        "onnxruntime fp32",
    )

    rounded = round_weights(imported.folded, imported.weights, plan)
    run_oracle = emulation_runner(imported.folded, graph, imported.weights, plan, feeds, rounded)
    outputs, checkpoints, emulation = judge(
        graph, plan, evidence, policy or TolerancePolicy(), run_oracle, max_drift
    )
    doc = {
        "model": str(model),
        "passed": all(o["passed"] for o in outputs)
        and all(c["passed"] for c in checkpoints)
        and not races
        and not differences,
        "schedule": str(order),
        "races": None if races is None else [race.to_json() for race in races],
        "schedule_differences": differences,
        "outputs": outputs,
        "checkpoints": checkpoints,
        "emulation": emulation,
        "casts": [point.to_json() for point in plan.points],
        "compile_options": meta.get("compile_options", {}),
        "oracle": oracle.oracle_info(),
    }
    return doc, actual


def _named_outputs(compilation, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The program's output locations by the graph output they hold."""
    function = compilation.module.functions[0]
    return {
        tensor: raw[location]
        for tensor, location in zip(compilation.graph.outputs, function.outputs, strict=True)
    }


def _differences(first: dict[str, np.ndarray], second: dict[str, np.ndarray]) -> list[str]:
    """Outputs whose bits differ between two runs of one program (in different orders)."""
    found = []
    for name, value in first.items():
        other = second[name]
        same = np.asarray(value).tobytes() == np.asarray(other).tobytes()
        if not same:
            count = int(np.sum(~((value == other) | (np.isnan(value) & np.isnan(other)))))
            found.append(f"{name}: {count} of {value.size} elements differ from program order")
    return found


def save_outputs(path: str | Path, outputs: dict[str, np.ndarray]) -> Path:
    return oracle.save_arrays(path, outputs, "output")


def save_inputs(path: str | Path, feeds: dict[str, np.ndarray]) -> Path:
    return oracle.save_arrays(path, feeds, "input")
