"""`onnx2bir validate`'s document for a person: the verdict first, the oracle and the
checkpoints, one table per output with its drift, then the localisation.

In: the document `onnx2bir.validation.run.run_validate` (or `check_program`) builds. Out:
text. `to_json_text` writes the same document as strict JSON (non-finite floats as null).
"""

from __future__ import annotations

import json
import shlex
from collections import Counter

import numpy as np

from onnx2bir.runtime.oracle.compare import json_safe

MAX_NODE_ROWS = 60

# A passing output whose drift from fp32 is beyond either of these gets a note
# (docs/validation.md#drift): the verdict judges the compiler, not what the autocast costs.
DRIFT_NOTE_COSINE = 0.999
DRIFT_NOTE_SNR_DB = 30.0


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


def format_output(entry: dict, model: str | None = None) -> list[str]:
    """One output's block; `model` (the path validated) goes into the commands it suggests."""
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
    unverifiable = entry.get("verifiable") is False
    if unverifiable:
        lines += _unverifiable_text(entry)
    lines += _drift_text(entry)
    note = drift_note(entry.get("drift"), model) if entry["passed"] else None
    if note:
        lines.append(f"    note: {note}")
    if entry.get("shape_error"):
        return lines + [f"    {entry['shape_error']}"]
    abs_err, rel_err = entry["abs_err"], entry["rel_err"]
    note = (
        ""
        if entry["finite_pairs"] == entry["size"]
        else f"   (over the {entry['finite_pairs']} elements finite on both sides)"
    )
    zeros = entry.get("zero_references", 0)
    nonzero = entry["finite_pairs"] - zeros
    if zeros:
        note += f"   (/ |o| over the {nonzero} nonzero references: {zeros} exact zeros left out)"
    lines.append(
        f"    {'error':<8} {'|m - o|':>11} {'/ |o|':>11}{note}   (m machine, o the oracle)"
    )
    for key in ("max", "mean", "median", "p99"):
        relative = _g(rel_err.get(key)) if nonzero or not zeros else "-"
        lines.append(f"    {key:<8} {_g(abs_err.get(key)):>11} {relative:>11}")
    worst = entry.get("worst")
    if worst:
        allowance = entry["atol"] + entry["rtol"] * abs(worst["onnxruntime"])
        share = (
            f", {100 * worst['abs_err'] / allowance:.0f}% of its allowance"
            if allowance > 0 and np.isfinite(worst["abs_err"])
            else ""
        )
        lines.append(
            f"    {'furthest over' if entry['mismatches'] else 'closest to'} its tolerance: "
            "element "
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
    elif unverifiable:
        pass  # its bound already accepts zeros: a smaller bound is what it needs, not a margin
    elif entry["passed"]:
        lines.append(
            f"    margin: it would still pass down to atol {_g(entry['min_atol'], '.3g')} "
            f"(at rtol {_g(entry['rtol'], 'g')}) or rtol "
            f"{_g(entry['min_rtol'], '.3g')} (at atol {_g(entry['atol'], 'g')}); "
            "0 means that term is not needed"
        )
    elif entry["mismatches"]:
        rtol_text = (
            "no rtol (the oracle is 0 where the error exceeds atol)"
            if not np.isfinite(entry["min_rtol"])
            else f"rtol {_g(entry['min_rtol'], '.3g')} (at atol {_g(entry['atol'], 'g')})"
        )
        lines.append(
            f"    smallest bound holding this error: atol {_g(entry['min_atol'], '.3g')} (at "
            f"rtol {_g(entry['rtol'], 'g')}) or {rtol_text}; a wider bound would hide the "
            "error, not fix it"
        )
    return lines


def _unverifiable_text(entry: dict) -> list[str]:
    """Why an output's bound cannot judge it (runtime/oracle/verdict.py `unverifiable_reason`:
    rtol >= 1, or atol >= the RMS of a reference that is not all zeros), and what to do."""
    name = entry["name"]
    if entry["rtol"] >= 1.0 or "reference_rms" not in entry:
        return [
            f"    its bound cannot tell a right answer from zeros: {entry['unverifiable_reason']}"
            f"; lower it (--tolerance {name}=ATOL,RTOL, --atol, --rtol)"
        ]
    return [
        f"    the output is near zero for its bound: the oracle's RMS "
        f"{_g(entry['reference_rms'], '.3g')} is not above atol {_g(entry['atol'], 'g')}, so "
        "the bound cannot tell a right answer from zeros (docs/validation.md#verdict)",
        "    give it real inputs with --inputs FILE.npz|DIR (random inputs can leave a trained "
        "model's output near zero: a detector that finds nothing), or judge it at a smaller "
        f"atol with --tolerance {name}=ATOL,",
    ]


def drift_note(record: dict | None, model: str | None = None) -> str | None:
    """The note for an output whose drift from fp32 is beyond cosine `DRIFT_NOTE_COSINE` or
    SNR `DRIFT_NOTE_SNR_DB` (docs/validation.md#drift), or None. Only where the program's casts
    reach the output (R is not null): elsewhere drift is not the autocast's to fix."""
    if record is None or record.get("r") is None:
        return None
    cosine, snr = record.get("cosine"), record.get("snr_db")  # None: not finite, from JSON
    beyond = []
    if cosine is not None and not cosine >= DRIFT_NOTE_COSINE:
        beyond.append(f"cosine {_g(cosine, '.4f')} < {DRIFT_NOTE_COSINE:g}")
    if snr is not None and not snr >= DRIFT_NOTE_SNR_DB:
        beyond.append(f"SNR {_g(snr, '.1f')} dB < {DRIFT_NOTE_SNR_DB:g} dB")
    if not beyond:
        return None
    named = shlex.quote(model) if model and not model.startswith("<") else "MODEL"
    return (
        f"large autocast drift ({', '.join(beyond)}; docs/validation.md#drift), which the "
        "verdict does not judge: find the nodes to keep in fp32 with onnx2bir debug precision "
        f"{named} -o exclude.txt --max-drift cosine={DRIFT_NOTE_COSINE:g},"
        f"snr={DRIFT_NOTE_SNR_DB:g} and compile with --auto-cast-exclude-file exclude.txt (or "
        "--auto-cast-exclude NODE|OP_TYPE); --max-drift makes drift fail the verdict"
    )


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
    for check in doc.get("import_rewrite_check") or []:
        if not check["passed"]:
            lines.append(
                f"  the import's rewrite ({', '.join(check['rewrites'])}) changes output "
                f"{check['output']!r}: onnxruntime on the rewritten model is "
                f"{check['max_abs_err']:.3g} from onnxruntime on the model as given"
            )
    lines += _checkpoint_text(doc.get("checkpoints") or [])
    for entry in outputs:
        lines += [""] + format_output(entry, doc.get("model"))
    if "localize" in doc:
        lines += [""] + format_localize(doc["localize"])
    if stats:
        lines += ["", "  pass statistics:"] + [
            f"    {stat['pass']}.{stat['name']} = {stat['value']}  ({stat['description']})"
            for stat in doc.get("pass_statistics", [])
        ]
    lines += ["", "  timings: " + ", ".join(_timing(k, v) for k, v in doc["timings"].items())]
    return "\n".join(lines)


def format_segments_text(doc: dict) -> str:
    """`validate --segments`: a line per segment (its own worst error and wall time), then the
    graph outputs as `format_text` shows them, each from its segment."""
    pieces, how = doc["segments"], doc["segmenting"]
    failed = [p for p in pieces if not p["passed"]]
    runner = "Ray tasks" if how["runner"] == "ray" else f"{how['workers']} processes"
    orc = doc["oracle"]
    lines = [
        f"{'PASS' if doc['passed'] else 'FAIL'}  {doc['model']}: "
        f"{len(pieces) - len(failed)}/{len(pieces)} segments match {orc['name']} "
        f"{orc['version']}, each from onnxruntime's values at its inputs ({runner}, "
        f"{how['segments_wall_seconds']:.1f} s; docs/validation.md#segments)"
    ]
    seed = "" if doc["seed"] is None else f", seed {doc['seed']}"
    for entry in doc["inputs"]:
        lines.append(
            f"  input {entry['name']} {entry['dtype']}{entry['shape']}: {entry['source']}{seed}"
        )
    lines.append(f"  autocast: {doc['autocast']}; schedule: {doc['schedule']}")
    lines.append(
        f"  {'segment':<8}{'nodes':<16}{'work':>6}  {'in':>3} {'out':>4}  {'verdict':<9}"
        f"{'worst |m - o| (tensor)':<42}{'wall':>7}{'peak':>10}"
    )
    for piece in pieces:
        lines.append(_segment_line(piece))
        if piece["error"]:
            lines.append(f"      {piece['error']['message']}")
        lines += ["    " + line for line in _checkpoint_text(piece["checkpoints"])[1:]]
        for entry in piece["outputs"]:
            if not entry["passed"]:
                lines += ["    " + line for line in format_output(entry)[:1]]
    for entry in doc["outputs"]:
        block = format_output(entry, doc.get("model"))
        block[0] += f"  (segment {entry['segment']})"
        lines += ["", *block]
    lines += [
        "",
        "  timings: onnxruntime (the cut tensors, segment by segment) "
        + (
            "in the Ray tasks, "
            if how["onnxruntime_seconds"] is None
            else f"{how['onnxruntime_seconds']:.3f}s, "
        )
        + f"segments {how['segments_wall_seconds']:.3f}s, total {doc['timings']['total']:.3f}s",
    ]
    return "\n".join(lines)


def _segment_line(piece: dict) -> str:
    span = f"{piece['first_node']}-{piece['last_node']} ({piece['nodes']})"
    verdict = "ok" if piece["passed"] else ("error" if piece["error"] else "FAIL")
    judged = [*piece["outputs"], *[c for c in piece["checkpoints"] if c["verifiable"]]]
    worst = max(judged, key=lambda e: e["max_abs_err"] or 0.0, default=None)
    where = "-" if worst is None else f"{_g(worst['max_abs_err'])} ({worst['name'][:28]})"
    return (
        f"  {piece['index']:<8}{span:<16}{piece['work_share'] * 100:>5.1f}%  "
        f"{len(piece['inputs']):>3} {len(piece['outputs_cut']):>4}  {verdict:<9}{where:<42}"
        f"{piece['wall_seconds']:>6.1f}s{_size(piece.get('peak_bytes')):>10}"
    )


def _size(size: int | None) -> str:
    return "-" if not size else f"{size / (1 << 30):.2f} GiB"


def _emulation_text(doc: dict) -> list[str]:
    emulation = doc["emulation"]
    if not emulation["casts"] and not emulation["unemulated"]:
        if not emulation["probes_read"]:
            return ["  oracle: the program rounds nothing; onnxruntime as the model is"]
        return [
            "  oracle: onnxruntime as the model is (the program rounds nothing; its integer "
            f"matmuls sum exactly); {emulation['probes_read']} intermediates read from the "
            f"machine, {emulation['resynchronised']} checked and fed on "
            "(docs/quantization.md#exactness)"
        ]
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
    for c in failing[:MAX_NODE_ROWS]:  # in graph order: the first is where it went wrong
        rounded = f"; read rounded by {', '.join(c['readers'][:3])}" if c["readers"] else ""
        fused = f", fused into {c['fused_into']}" if c.get("fused_into") else ""
        lines.append(
            f"    FAIL {c['name']} (from {c['op_type']} {c['producer']}{fused}, "
            f"stored {c['stored']}"
            f"{rounded}): "
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
            "  max abs/rel err: this node's output vs onnxruntime (rel over the nonzero "
            "references); inputs' err: the largest "
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
