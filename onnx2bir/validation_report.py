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
from onnx2bir.runtime.compare import compare_output, json_safe
from onnx2bir.runtime.localize import DEFAULT_BUDGET_BYTES, localize
from onnx2bir.runtime.prepared import output_values, prepare, simulate
from onnx2bir.runtime.progress import progress_for
from onnx2bir.runtime.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.tolerance import (
    FP32_ATOL,
    FP32_RTOL,
    LOW_PRECISION_RTOL,
    TolerancePolicy,
    cast_depths,
    reduction_length,
    tensor_paths,
)
from onnx2bir.validation_inputs import TIMINGS_EXPLAINED, check_arrays, check_policy_names

RULE = "|machine - onnxruntime| <= atol + rtol * |onnxruntime|"
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
) -> tuple[dict, dict, dict]:
    """(document, feeds, machine outputs); the CLI prints and saves them.

    `inputs`: a file or folder, or arrays already read (`inputs_label` says where from).
    `on_compiled(compilation)` runs before the simulation; `factories` make machine observers
    for `simulate` (test hooks; they imply --localize's machine-level run). Names in the
    policy's `tensors` and `op_types` must exist in the model (`check_policy_names`).
    `schedule` (`runtime/schedule.py`) orders the instructions; `check_races` runs the race
    detector, and a race fails the validation.
    """
    plan = parse_schedule(schedule)
    if localize_nodes:
        # Every intermediate must have a DRAM copy to compare (docs/memory_planner.md#localize).
        options = dataclasses.replace(options, memory_plan=False)
    prepared = prepare(model, options, input_shapes, dims)
    check_validate_fits(prepared.pristine)  # before any input or machine array is made
    if on_compiled is not None:
        on_compiled(prepared.compilation)
    compilation, graph = prepared.compilation, prepared.pristine
    check_policy_names(policy, graph)
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
    bar = progress_for(function, progress)
    machine_run = bool(localize_nodes or factories)
    machine = None
    start = time.perf_counter()
    races = None
    try:
        if localize_nodes or factories:
            machine = simulate(compilation, feeds, bar.observer if bar else None, factories)
            actual = output_values(compilation, machine)
        if check_races or plan.kind != "program":
            run = run_scheduled(
                compilation.module,
                feeds,
                plan,
                check_races,
                observer=None if machine_run else (bar.observer if bar else None),
            )
            races = run.races
            actual = {
                tensor: run.outputs[location]
                for tensor, location in zip(
                    compilation.graph.outputs, function.outputs, strict=True
                )
            }
        elif not machine_run:
            raw = interpreter.run_function(
                compilation.module, feeds, observer=bar.observer if bar else None
            )
            actual = {
                tensor: raw[location]
                for tensor, location in zip(
                    compilation.graph.outputs, function.outputs, strict=True
                )
            }
    finally:
        if bar:
            bar.close()
    timings["simulate"] = time.perf_counter() - start
    start = time.perf_counter()
    expected = oracle.run_onnxruntime(model, feeds, graph.outputs)
    timings["onnxruntime"] = time.perf_counter() - start  # session creation + one run
    paths = tensor_paths(graph, compilation.module)
    depths = cast_depths(graph, compilation.module)
    outputs = []
    for name in graph.outputs:
        producer = graph.producer(name)
        op_type = graph.node(producer)["op_type"] if producer else None
        path = paths.get(name, "fp32")
        tol = policy.for_tensor(
            name,
            op_type,
            path,
            expected[name],
            reduction_length(graph, producer) if producer else 1,
            depths.get(name, 1),
        )
        result = compare_output(name, actual[name], expected[name], tol.atol, tol.rtol, tol.source)
        entry = result.to_json()
        entry.update(path=path, producer=producer, op_type=op_type)
        outputs.append(entry)
    doc = {
        "model": model if isinstance(model, str) else "<ModelProto>",
        "passed": all(entry["passed"] for entry in outputs) and not races,
        "schedule": str(plan),
        # null: not checked; [] checked and none found
        "races": None if races is None else [race.to_json() for race in races],
        "outputs": outputs,
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
        doc["localize"] = localize(
            prepared, machine, feeds, policy, options, budget_bytes, factories
        )
        timings["localize"] = time.perf_counter() - start
        del machine
    doc["timings"] = {key: round(value, 6) for key, value in timings.items()}
    doc["timings_explained"] = TIMINGS_EXPLAINED
    doc["pass_statistics"] = [stat.to_json() for stat in compilation.passes.statistics]
    return doc, feeds, actual


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
    lines = [
        f"  {entry['name']}  {_shape(entry)}  {verdict}   atol {_g(entry['atol'], 'g')} + "
        f"rtol {_g(entry['rtol'], 'g')}·|ref|  ({entry['tolerance_source']})"
    ]
    if entry.get("shape_error"):
        return lines + [f"    {entry['shape_error']}"]
    abs_err, rel_err = entry["abs_err"], entry["rel_err"]
    note = (
        ""
        if entry["finite_pairs"] == entry["size"]
        else f"   (over the {entry['finite_pairs']} elements finite on both sides)"
    )
    lines.append(
        f"    {'error':<8} {'|m - ort|':>11} {'/ |ort|':>11}{note}   (m machine, ort onnxruntime)"
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
            f"{_g(worst['machine'], '.9g')}  onnxruntime {_g(worst['onnxruntime'], '.9g')}"
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
    lines = [
        f"{'PASS' if doc['passed'] else 'FAIL'}  {doc['model']}: {good}/{len(outputs)} "
        f"outputs match {orc['name']} {orc['version']} ({orc['graph_optimization_level']})"
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
    lines.append(f"  rule: {doc['tolerance']['rule']}")
    lines.append(f"  schedule: {doc.get('schedule', 'program')}; races: {_races_text(doc)}")
    for race in doc.get("races") or []:
        lines.append(f"  {race['message']}")
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
