"""`onnx2bir validate`: compile, simulate, compare with onnxruntime, and say what it means.

In: a model, compile options, inputs (seeded random, .npz or a test_data_set folder), a
`TolerancePolicy`. Out: the validate document and, for `--save-outputs`, the machine's
outputs. The document follows DESIGN.md's contract and adds keys (never renames):

    {"model", "passed", "outputs": [{"name", "shape", "max_abs_err", "max_rel_err", "cosine",
       "atol", "rtol", "passed",   # the contract
       "mismatches", "size", "dtype", "path", "producer", "op_type", "tolerance_source",
       "abs_err"/"rel_err": {"max", "mean", "median", "p99"},
       "worst": {"index", "machine", "onnxruntime", "abs_err", "rel_err"},
       "min_atol", "min_rtol", "nonfinite": {"machine"|"onnxruntime": {"nan", "posinf",
       "neginf", "first"}}, "nonfinite_mismatches", "max_ulp", "snr_db", "shape_error"}],
     "schedule": "program" | "random:SEED" | "timeline",
     "races": null (not checked) | [{"first", "second", "memory", "location", "partitions",
       "bytes", "message"}],
     "timings": {...}, "seed", "inputs": [{"name", "shape", "dtype", "source"}],
     "oracle": {"name", "version", "provider", "graph_optimization_level"},
     "tolerance": {"rule", "defaults"}, "compile_options": {"native_kernel_cast_type",
     "auto_cast", "auto_cast_type"}, "autocast": "matmult -> bf16" | "none",
     "localize": {...} (with --localize, see onnx2bir.runtime.localize)}

A float that is not finite (an inf error, a NaN cosine) is written as null by `to_json_text`:
JSON has no inf.
`format_text` renders the same document for a person: the verdict first, then one table per
output, then the localisation.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from onnx2bir.contracts_memory import check_validate_fits
from onnx2bir.options import CompileOptions
from onnx2bir.runtime import interpreter, oracle
from onnx2bir.runtime.compare import json_safe
from onnx2bir.runtime.emulating_oracle import run_emulating
from onnx2bir.runtime.localize import DEFAULT_BUDGET_BYTES, localize
from onnx2bir.runtime.prepared import output_values, prepare, simulate
from onnx2bir.runtime.probes import ProbeReader
from onnx2bir.runtime.progress import progress_for
from onnx2bir.runtime.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.tolerance import (
    FP32_ATOL,
    FP32_RTOL,
    LOW_PRECISION_RTOL,
    TolerancePolicy,
)
from onnx2bir.runtime.verdict import Evidence, judge
from onnx2bir.validation_inputs import (
    TIMINGS_EXPLAINED,
    check_arrays,
    check_policy_names,
    check_reference,
)

RULE = "|machine - oracle| <= atol + rtol * |oracle|"
MAX_NODE_ROWS = 60


def run_validate(
    model: str,
    options: CompileOptions,
    policy: TolerancePolicy,
    *,
    input_shapes=None,
    dims=None,
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
) -> tuple[dict, dict, dict]:
    """(document, feeds, machine outputs); the CLI prints and saves them.

    `inputs`: a file or folder, or arrays already read (`inputs_label` says where from).
    `on_compiled(compilation)` runs before the simulation; `factories` make machine observers
    for `simulate` (test hooks; they imply --localize's machine-level run). Names in the
    policy's `tensors` and `op_types` must exist in the model (`check_policy_names`).
    `schedule` (`runtime/schedule.py`) orders the instructions; `check_races` runs the race
    detector, and a race fails the validation. `reference`: outputs the user supplies (an
    .npz file, a test_data_set folder, or arrays by output name), which replace plain fp32
    onnxruntime as what drift is measured against;
    `max_drift`: limits that make drift fail the verdict (`runtime/verdict.py`).
    """
    plan_order = parse_schedule(schedule)
    if localize_nodes:
        # Every intermediate must have a DRAM copy to compare (docs/memory_planner.md#localize).
        options = dataclasses.replace(options, memory_plan=False)
    prepared = prepare(model, options, input_shapes, dims)
    check_validate_fits(prepared.pristine)  # before any input or machine array is made
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
    if isinstance(inputs, dict):
        feeds = check_arrays(inputs, graph, inputs_label or "inputs")
        sources = dict.fromkeys(graph.inputs, f"from {inputs_label or 'the given arrays'}")
    elif inputs is not None:
        feeds = oracle.load_inputs(inputs, graph)
        sources = dict.fromkeys(graph.inputs, f"from {inputs}")
    else:
        feeds = oracle.synthesize_inputs(graph, seed)
        sources = oracle.input_rules(graph)
    function = compilation.module.functions[0]
    plan = compilation.cast_plan
    reader = ProbeReader(function, plan.probes, {t: graph.tensors[t].shape for t in plan.probes})
    bar = progress_for(function, progress)
    machine = None
    start = time.perf_counter()
    races = None
    schedule_differences: list[str] = []
    try:
        # The verdict's run is in program order, with the probes (runtime/probes.py).
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
        expected = oracle.run_onnxruntime(model, feeds, graph.outputs)
        reference_kind = "onnxruntime fp32"
    timings["onnxruntime"] = time.perf_counter() - start  # session creation + one run
    start = time.perf_counter()
    evidence = Evidence(actual, reader.values, reader.stored(), expected, reference_kind)
    outputs, checkpoints, emulation = judge(
        graph, plan, evidence, policy, oracle_runner(prepared, feeds), max_drift
    )
    timings["emulating_oracle"] = time.perf_counter() - start
    doc = {
        "model": model if isinstance(model, str) else "<ModelProto>",
        "passed": all(entry["passed"] for entry in outputs)
        and all(entry["passed"] for entry in checkpoints)
        and not races
        and not schedule_differences,
        "schedule": str(plan_order),
        # null: not checked; [] checked and none found
        "races": None if races is None else [race.to_json() for race in races],
        "schedule_differences": schedule_differences,
        "outputs": outputs,
        "checkpoints": checkpoints,
        "emulation": emulation,
        "casts": [point.to_json() for point in plan.points],
        "drift_limits": max_drift or {},
        "timings": {},
        "seed": None if inputs is not None else seed,
        "inputs": [
            {
                "name": name,
                "shape": list(feeds[name].shape),
                "dtype": str(feeds[name].dtype),
                "source": sources[name],
            }
            for name in graph.inputs
        ],
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


def oracle_runner(prepared, feeds: dict[str, np.ndarray]):
    """The emulating oracle of a prepared model on `feeds`, as `runtime/verdict.py`'s `judge`
    calls it: run(machine_values, wanted) → arrays by name."""

    def run(machine_values, wanted):
        return run_emulating(
            prepared.folded,
            prepared.pristine,
            prepared.weights,
            prepared.compilation.cast_plan,
            feeds,
            machine_values,
            wanted,
        )

    return run


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
    from onnx2bir.codegen.cast_plan import CastPlan
    from onnx2bir.errors import UserError
    from onnx2bir.importer import build_graph, import_parts

    meta = module.metadata
    if "cast_plan" not in meta or "input_shapes" not in meta:
        raise UserError(
            "the program records no cast plan or input shapes (it was written by an older "
            "onnx2bir, or by hand): convert the model again to check it with --model"
        )
    shapes = {name: tuple(shape) for name, shape in meta["input_shapes"].items()}
    imported = import_parts(model, shapes)
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
    reader = ProbeReader(function, plan.probes, {t: graph.tensors[t].shape for t in plan.probes})
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
        oracle.run_onnxruntime(model, feeds, graph.outputs),
        "onnxruntime fp32",
    )

    def run_oracle(machine_values, wanted):
        return run_emulating(
            imported.folded, graph, imported.weights, plan, feeds, machine_values, wanted
        )

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


# --- text ----------------------------------------------------------------------------------
def to_json_text(doc: dict) -> str:
    """The document as strict JSON: non-finite floats become null."""
    return json.dumps(json_safe(doc), indent=1)


def _g(value, spec: str = ".3e") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return format(value, spec)


def _shape(entry: dict) -> str:
    return f"{entry.get('dtype', '')}[{', '.join(str(d) for d in entry['shape'])}]"


def _nonfinite_text(nonfinite: dict) -> str:
    parts = []
    for side, counts in nonfinite.items():
        total = counts["nan"] + counts["posinf"] + counts["neginf"]
        if total:
            where = ", ".join(str(i) for i in counts["first"])
            parts.append(
                f"{side}: {counts['nan']} NaN, {counts['posinf']} +inf, "
                f"{counts['neginf']} -inf (first at {where})"
            )
    return "; ".join(parts) or "none"


def format_output(entry: dict) -> list[str]:
    verdict = "ok" if entry["passed"] else f"FAIL ({entry['mismatches']} of {entry['size']})"
    if entry.get("verifiable") is False:
        verdict = "UNVERIFIABLE"
    elif not entry["passed"] and not entry["mismatches"] and entry.get("failed_upstream"):
        verdict = f"FAIL (computed from {', '.join(entry['failed_upstream'][:3])})"
    elif not entry["passed"] and not entry["mismatches"] and entry.get("drift_failures"):
        verdict = "FAIL (--max-drift)"
    lines = [
        f"  {entry['name']}  {_shape(entry)}  {verdict}   atol {_g(entry['atol'], 'g')} + "
        f"rtol {_g(entry['rtol'], 'g')}·|ref|  ({entry['tolerance_source']})"
    ]
    if entry.get("unverifiable_reason"):
        lines.append(
            f"    its bound cannot tell a right answer from zeros: {entry['unverifiable_reason']}"
            " (tighten it with --tolerance/--atol/--rtol)"
        )
    lines += _drift_text(entry)
    if entry.get("shape_error"):
        return lines + [f"    {entry['shape_error']}"]
    abs_err, rel_err = entry["abs_err"], entry["rel_err"]
    note = (
        ""
        if entry["finite_pairs"] == entry["size"]
        else f"   (over the {entry['finite_pairs']} elements finite on both sides)"
    )
    lines.append(
        f"    {'error':<8} {'|m - o|':>11} {'/ |o|':>11}{note}   (m machine, o the oracle)"
    )
    for key in ("max", "mean", "median", "p99"):
        lines.append(f"    {key:<8} {_g(abs_err.get(key)):>11} {_g(rel_err.get(key)):>11}")
    worst = entry.get("worst")
    if worst:
        allowance = entry["atol"] + entry["rtol"] * abs(worst["onnxruntime"])
        share = (
            f", {100 * worst['abs_err'] / allowance:.0f}% of its allowance"
            if allowance > 0 and np.isfinite(worst["abs_err"])
            else ""
        )
        lines.append(
            f"    {'closest to' if entry['passed'] else 'furthest over'} its tolerance: element "
            f"{worst['index']}, machine "
            f"{_g(worst['machine'], '.9g')}  oracle {_g(worst['onnxruntime'], '.9g')}"
            f"  (abs err {_g(worst['abs_err'])}{share}; the largest abs err is in the table)"
        )
    ulp = "" if entry.get("max_ulp") is None else f"  max {entry['max_ulp']} ULP"
    lines.append(
        f"    cosine {_g(entry['cosine'], '.6f')}  SNR {_g(entry['snr_db'], '.1f')} dB"
        f"{ulp}  mismatches {entry['mismatches']}/{entry['size']}"
    )
    lines.append(f"    NaN/inf: {_nonfinite_text(entry['nonfinite'])}")
    if entry["nonfinite_mismatches"]:
        lines.append(
            f"    no tolerance passes it: {entry['nonfinite_mismatches']} NaN/inf values "
            "differ from onnxruntime"
        )
    else:
        rtol_text = (
            "no rtol (onnxruntime is 0 where the error exceeds atol)"
            if not np.isfinite(entry["min_rtol"])
            else f"rtol >= {_g(entry['min_rtol'], '.3g')}"
        )
        if entry["passed"]:
            lines.append(
                f"    margin: it would still pass down to atol {_g(entry['min_atol'], '.3g')} "
                f"(at rtol {_g(entry['rtol'], 'g')}) or rtol "
                f"{_g(entry['min_rtol'], '.3g')} (at atol {_g(entry['atol'], 'g')}); "
                "0 means that term is not needed"
            )
        else:
            lines.append(
                f"    would pass with atol >= {_g(entry['min_atol'], '.3g')} (at rtol "
                f"{_g(entry['rtol'], 'g')}) or {rtol_text} (at atol {_g(entry['atol'], 'g')})"
            )
    return lines


def format_text(doc: dict, stats: bool = False) -> str:
    """The document for a person; `stats` adds the passes' statistic counters."""
    outputs = doc["outputs"]
    good = sum(1 for entry in outputs if entry["passed"])
    orc = doc["oracle"]
    checked = [c for c in doc.get("checkpoints") or [] if c["verifiable"]]
    bad = sum(1 for c in checked if not c["passed"])
    lines = [
        f"{'PASS' if doc['passed'] else 'FAIL'}  {doc['model']}: {good}/{len(outputs)} "
        f"outputs match {orc['name']} {orc['version']} ({orc['graph_optimization_level']})"
        + (", rounding where the program rounds" if doc.get("casts") else "")
        + (f"; {bad} of {len(checked)} checked intermediates do not" if bad else "")
    ]
    lines += [f"  note: {note['flag']}: {note['message']}" for note in doc.get("notes", [])]
    seed = "" if doc["seed"] is None else f", seed {doc['seed']}"
    for entry in doc["inputs"]:
        lines.append(
            f"  input {entry['name']} {entry['dtype']}{entry['shape']}: {entry['source']}{seed}"
        )
    if "autocast" in doc:
        lines.append(
            f"  autocast: {doc['autocast']} (attention kernel: "
            f"{doc['compile_options']['native_kernel_cast_type']})"
        )
    if "emulation" in doc:
        lines += _emulation_text(doc)
    lines.append(f"  rule: {doc['tolerance']['rule']}")
    lines.append(f"  schedule: {doc.get('schedule', 'program')}; races: {_races_text(doc)}")
    for race in doc.get("races") or []:
        lines.append(f"  {race['message']}")
    for difference in doc.get("schedule_differences") or []:
        lines.append(f"  schedule {doc['schedule']} changed an output: {difference}")
    lines += _checkpoint_text(doc.get("checkpoints") or [])
    for entry in outputs:
        lines += [""] + format_output(entry)
    if "localize" in doc:
        lines += [""] + format_localize(doc["localize"])
    if stats:
        lines += ["", "  pass statistics:"] + [
            f"    {stat['pass']}.{stat['name']} = {stat['value']}  ({stat['description']})"
            for stat in doc.get("pass_statistics", [])
        ]
    lines += ["", "  timings: " + ", ".join(_timing(k, v) for k, v in doc["timings"].items())]
    return "\n".join(lines)


def _emulation_text(doc: dict) -> list[str]:
    emulation = doc["emulation"]
    if not emulation["casts"] and not emulation["unemulated"]:
        return ["  oracle: the program rounds nothing; onnxruntime as the model is"]
    inexact = f" ({emulation['inexact_casts']} approximately)" if emulation["inexact_casts"] else ""
    lines = [
        f"  oracle: onnxruntime rounding at the program's {emulation['casts']} cast points"
        f"{inexact}; {emulation['probes_read']} intermediates read from the machine, "
        f"{emulation['resynchronised']} checked and fed on (docs/validation.md#verdict)"
    ]
    for entry in emulation["unemulated"]:
        lines.append(f"  not emulated: {entry['node']}: {entry['reason']}")
    if emulation["statistical"]:
        names = ", ".join(emulation["statistical"][:6])
        more = len(emulation["statistical"]) - 6
        lines.append(
            f"  statistical bound (the oracle is approximate there): {names}"
            + (f" and {more} more" if more > 0 else "")
        )
    return lines


def _checkpoint_text(checkpoints: list[dict]) -> list[str]:
    if not checkpoints:
        return []
    failing = [c for c in checkpoints if not c["passed"]]
    judged = sum(1 for c in checkpoints if c["verifiable"])
    lines = [
        f"  checkpoints: {judged - len(failing)} of {judged} intermediates within their bound"
        + (
            f" ({len(checkpoints) - judged} too small to judge)"
            if judged < len(checkpoints)
            else ""
        )
    ]
    for c in failing[:MAX_NODE_ROWS]:
        readers = ", ".join(c["readers"][:3]) or "-"
        lines.append(
            f"    FAIL {c['name']} (read by {readers}, stored {c['stored']}): "
            f"{c['mismatches']} of {c['size']} elements over atol {_g(c['atol'], 'g')} + rtol "
            f"{_g(c['rtol'], 'g')}·|ref|, max abs err {_g(c['max_abs_err'])}"
        )
    return lines


def _drift_text(entry: dict) -> list[str]:
    record = entry.get("drift")
    if record is None:
        return []
    r = "-" if record["r"] is None else f"{record['r']:.3f}"
    lines = [
        f"    drift vs {record['against']} (what the casts cost): cosine "
        f"{_g(record['cosine'], '.6f')}  SNR {_g(record['snr_db'], '.1f')} dB  max abs "
        f"{_g(record['max_abs_err'])}  R {r}"
    ]
    for failure in entry.get("drift_failures") or []:
        lines.append(f"    FAIL --max-drift: {failure}")
    return lines


def _timing(key: str, seconds: float) -> str:
    label = "onnxruntime (session creation + run)" if key == "onnxruntime" else key
    return f"{label} {seconds:.3f}s"


def _races_text(doc: dict) -> str:
    races = doc.get("races")
    if races is None:
        return "not checked (--check-races)"
    return f"{len(races)} found" if races else "none found"


def _kernel_text(record: dict) -> str:
    if record.get("kernel"):
        return record["kernel"]
    if record.get("fallback_reason"):
        return f"GENERIC ({record['fallback_reason'].split(';')[0]}; ...)"
    return record.get("lowering", "")


def format_localize(loc: dict) -> list[str]:
    statuses = Counter(n["status"] for n in loc["nodes"])
    skipped = []
    if statuses.get("fused"):
        skipped.append(
            f"{statuses['fused']} fused into a raised kernel block (their tensors never exist "
            "on the machine; the block's output is compared)"
        )
    if statuses.get("not compared"):
        skipped.append(
            f"{statuses['not compared']} not compared (constants computed at compile time, or "
            "values the program keeps on chip and never writes to DRAM)"
        )
    lines = [
        f"localize: {loc['nodes_compared']} of {loc['nodes_total']} nodes compared "
        f"({loc['tensors_compared']} tensors, {loc['oracle_batches']} onnxruntime run(s))"
    ] + [f"  skipped: {text}" for text in skipped]
    first = loc["first_failing"]
    if first is None:
        lines.append("  first node over tolerance: none - every intermediate is within tolerance")
    else:
        lines.append(
            f"  first node over tolerance: {first['node']} ({first['op_type']}, "
            f"{_kernel_text(first)})"
        )
        lines.append(
            f"    in the model: max abs {_g(first['max_abs_err'])}, max rel "
            f"{_g(first['max_rel_err'])}, {first['mismatches']} elements over atol "
            f"{_g(first['atol'], 'g')} + rtol {_g(first['rtol'], 'g')}·|ref|"
        )
        local = first["local"]
        if local.get("error"):
            lines.append(f"    alone: not run ({local['error']})")
        else:
            lines.append(
                f"    alone on onnxruntime's inputs: max abs {_g(local['max_abs_err'])},"
                f" {'within' if local['passed'] else 'OVER'} tolerance"
            )
        lines.append(f"    inputs arrive with max abs error {_g(first['input_max_abs_err'])}")
        lines.append(f"    verdict: {first['verdict']} - {first['explanation']}")
    for side in ("machine", "onnxruntime"):
        nan = loc[f"first_nonfinite_{side}"]
        where = "the machine" if side == "machine" else side
        if nan is None:
            lines.append(f"  first NaN/inf on {where}: none")
        else:
            origin = (
                "its inputs are finite" if nan["inputs_finite"] else "its inputs already are not"
            )
            lines.append(
                f"  first NaN/inf on {where}: {nan['node']} ({nan['op_type']}, "
                f"{nan['count']} values; {origin})"
            )
    nodes = loc["nodes"]
    rows = (
        nodes
        if len(nodes) <= MAX_NODE_ROWS
        else [n for n in nodes if n["status"] == "FAIL"][:MAX_NODE_ROWS]
    )
    if rows:
        width = max(len(n["node"]) for n in rows)
        lines += [
            "",
            "  max abs/rel err: this node's output vs onnxruntime; inputs' err: the largest "
            "abs error already in its inputs (carried in from earlier nodes); PE dtype: the "
            "matmul operand dtype under the autocast",
            f"  {'node':<{width}}  {'op type':<12} {'max abs err':>11} {'max rel err':>11} "
            f"{'inputs err':>11}  {'status':<6} {'PE dtype':<9} lowering (kernel or generic op)",
        ]
        for n in rows:
            lines.append(
                f"  {n['node']:<{width}}  {n['op_type']:<12} "
                f"{_g(n.get('max_abs_err'), '10.3e') if 'max_abs_err' in n else '-':>11} "
                f"{_g(n.get('max_rel_err'), '10.3e') if 'max_rel_err' in n else '-':>11} "
                f"{_g(n['input_max_abs_err'], '10.3e'):>11}  {n['status']:<6} "
                f"{n.get('pe_dtype') or '-':<9} {n['lowering']}"
            )
        if len(rows) < len(nodes):
            lines.append(f"  ({len(nodes) - len(rows)} more nodes in --json)")
    else:
        lines.append(
            f"  (no node over tolerance; the table of all {len(nodes)} nodes is in --json)"
        )
    if loc["convs"]:
        width = max(len(c["node"]) for c in loc["convs"])
        lines += [
            "",
            "  convolutions: status, PE operand dtype, max abs error, kernel (or GENERIC and why)",
        ]
        for c in loc["convs"]:
            lines.append(
                f"  {c['node']:<{width}}  {c['status'] or '-':<6} {c.get('pe_dtype') or '-':<9} "
                f"max abs {_g(c['max_abs_err'])}  {_kernel_text(c)}"
            )
    return lines


def save_outputs(path: str | Path, outputs: dict[str, np.ndarray]) -> Path:
    return oracle.save_arrays(path, outputs, "output")


def save_inputs(path: str | Path, feeds: dict[str, np.ndarray]) -> Path:
    return oracle.save_arrays(path, feeds, "input")
