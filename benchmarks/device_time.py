"""Estimated device time beside published Inf2 latencies: BERT-base, DistilBERT-base, BERT-large.

Usage (after `nice -n 10 /work/venv-export/bin/python models/calibration.py`):
    python benchmarks/device_time.py                  # prints a markdown table
    python benchmarks/device_time.py --markdown benchmarks/device_time_table.md

Each model is compiled with its 1-layer and 2-layer exports (models/calibration.py: sequence
128, batch 4, random weights) under the default options (matmul operands autocast to bf16, the
memory plan on) and estimated with the device-time model (docs/device_time.md); the table's
`CostTable(pe_dtype=Dtype.BF16)` changes nothing for those and costs any fp32 operand left (an
export compiled with `--auto-cast none`) at the bf16 rate. The full depth is
extrapolated linearly: t(L) = t(1) + (L - 1) x (t(2) - t(1)); when the full depth was exported
too (`models/calibration.py --full`), it is compiled and estimated as a check. Published:
Inf2 per-batch P50 latency on one NeuronCore-v2 (batch 4, sequence 128, matmul autocast to
bf16).

`--inf2` prints the other rows of the same published table instead (models/inf2_table.py:
ResNet-18/34/50/101/152, VGG-11/16, ViT-base, BERT-base and RoBERTa-base at batch 1,
ResNet-18/50 at batch 8), each with the published throughput, the calls in flight and the
most device time a call can take at that throughput (`Row.core_ms_per_call`), and with where
its time goes:

    nice -n 10 /work/venv-export/bin/python models/inf2_table.py --full
    python benchmarks/device_time.py --inf2 [ROW ...] [--markdown OUT.md]

A CNN row is compiled whole. An encoder row is compiled at 1 and 2 layers and extrapolated as
above, and at its full depth when that was exported (`--full`): the full depth's program is
then the one the breakdown describes, and the extrapolation is shown beside it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models import inf2_table  # noqa: E402
from models.calibration import MODELS, VOCAB, path_of  # noqa: E402
from onnx2bir.api import commands as api  # noqa: E402
from onnx2bir.bir.enums import Dtype, Engine, MemoryKind, MemoryType  # noqa: E402
from onnx2bir.runtime.timing.cost import DEFAULT_TABLE, CostTable, estimate  # noqa: E402
from onnx2bir.runtime.timing.device_time import simulate  # noqa: E402
from onnx2bir.runtime.timing.summary import cost_report  # noqa: E402

PUBLISHED_MS = {"bert_base": 2.95, "distilbert_base": 1.67, "bert_large": 8.73}
TABLE = CostTable(pe_dtype=Dtype.BF16)


def _layer_figures(name: str, layers: int, vocab: int = VOCAB) -> dict:
    module = api.compile(str(path_of(name, layers, vocab))).module
    report = estimate(module, table=TABLE)
    return {
        "seconds": report.total_seconds,
        "pe": report.busy_seconds.get(Engine.PE, 0.0),
        "busiest": max(report.stream_busy_seconds.values()),
        "dma_bytes": report.dma_bytes,
        "compulsory": report.compulsory_dma_bytes,
        "flops": report.flops,
    }


def extrapolate(one: float, two: float, depth: int) -> float:
    return one + (depth - 1) * (two - one)


def rows(names=MODELS, vocab: int = VOCAB) -> list[dict]:
    out = []
    for name in names:
        depth = MODELS[name][4]
        one, two = _layer_figures(name, 1, vocab), _layer_figures(name, 2, vocab)
        row = {key: extrapolate(one[key], two[key], depth) for key in one}
        row.update(name=name, depth=depth, published_ms=PUBLISHED_MS[name], vocab=vocab)
        # What the same program would take if it moved only its compulsory bytes and the PE
        # ran flat out: the larger of the PE busy time and those bytes at the core's DMA rate.
        row["bound"] = max(row["pe"], row["compulsory"] / TABLE.dma_core_bytes_per_s)
        # The full depth itself, when it was exported (`models/calibration.py --full`): a
        # check of the extrapolation.
        full = path_of(name, depth, vocab)
        row["full"] = _layer_figures(name, depth, vocab)["seconds"] if full.exists() else None
        out.append(row)
    return out


def markdown(table: list[dict]) -> str:
    lines = [
        "| model | layers | vocabulary | published (ms) | estimate (ms) | estimate / published "
        "| PE busy (ms) "
        "| full depth compiled (ms) | DMA GB (compulsory) | matmul GFLOP "
        "| PE-and-compulsory-DMA bound (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        full = "not exported" if r["full"] is None else f"{r['full'] * 1e3:.2f}"
        lines.append(
            f"| {r['name']} | {r['depth']} | {r['vocab']:,} | {r['published_ms']:.2f} "
            f"| {r['seconds'] * 1e3:.2f} "
            f"| {r['seconds'] * 1e3 / r['published_ms']:.2f}x | {r['pe'] * 1e3:.2f} | {full} "
            f"| {r['dma_bytes'] / 1e9:.2f} ({r['compulsory'] / 1e9:.2f}) "
            f"| {r['flops'] / 1e9:.0f} | {r['bound'] * 1e3:.2f} |"
        )
    return "\n".join(lines) + "\n"


# --- the Inf2 table's other rows (models/inf2_table.py) -------------------------------------

ENGINES = ("PE", "ACT", "DVE", "POOL")


def model_flops(model) -> int:
    """2 x multiply-adds of every Conv, MatMul and Gemm of an ONNX model (after shape inference),
    the FLOPs the model asks for: unlike the simulation's count, no PE transposes, no padding."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    shapes: dict[str, list[int]] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        dims = info.type.tensor_type.shape.dim
        shapes[info.name] = [d.dim_value for d in dims]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    total = 0
    for node in graph.node:
        if node.op_type == "Conv":
            weight, out = shapes[node.input[1]], shapes[node.output[0]]
            # every output element: (input channels / groups) x kernel window multiply-adds
            total += 2 * math.prod(out) * math.prod(weight[1:])
        elif node.op_type == "MatMul":
            a, out = shapes[node.input[0]], shapes[node.output[0]]
            total += 2 * math.prod(out) * a[-1]
        elif node.op_type == "Gemm":
            a, out = shapes[node.input[0]], shapes[node.output[0]]
            trans_a = any(x.name == "transA" and x.i for x in node.attribute)
            total += 2 * math.prod(out) * (a[0] if trans_a else a[1])
    return total


def critical_path_split(slices) -> dict[str, Counter]:
    """Seconds of the critical path by stream kind, by rule or kernel and by (stream, opcode).

    The path is followed back from the last slice to end through each slice's `cause` (what
    made it wait: its stream's previous slice, a dependency or the shared DMA bandwidth), each
    step counted from the end of the slice it waited for, so the steps add up to the estimate;
    a loop's steady-state trips, which the simulation stands for by shifting its last trip, are
    counted on the slice after the shift."""
    split = {"stream": Counter(), "rule": Counter(), "opcode": Counter()}
    if not slices:
        return split
    index = max(range(len(slices)), key=lambda i: slices[i].end)
    seen: set[int] = set()
    while index >= 0 and index not in seen:
        seen.add(index)
        step = slices[index]
        begin = slices[step.cause].end if step.cause >= 0 else 0.0
        stream = "DMA" if step.stream.startswith("DMA") else step.stream
        split["stream"][stream] += step.end - begin
        split["rule"][step.ins.origin.rule or "(no rule)"] += step.end - begin
        split["opcode"][f"{stream} {step.ins.opcode.value}"] += step.end - begin
        index = step.cause
    return split


def spill_bytes(sim, function) -> int:
    """DMA bytes to or from DRAM tensors of the program's own (intermediates in DRAM)."""
    locations = function.memory_locations
    total = 0
    for s in sim.slices:
        if s.ins.engine is not Engine.DMA:
            continue
        for ap in (*s.ins.srcs.values(), s.ins.dst):
            location = locations.get(ap.loc) if ap is not None else None
            if (
                location is not None
                and location.memory is MemoryType.DRAM
                and location.kind is MemoryKind.INTERNAL
            ):
                total += s.dma_bytes
                break
    return total


def program_figures(path: Path) -> dict:
    """Compile and estimate one export; the figures of the Inf2 table, wall times included."""
    import onnx

    start = time.perf_counter()
    compiled = api.compile(str(path))
    compile_s = time.perf_counter() - start
    function = compiled.module.functions[0]
    start = time.perf_counter()
    sim = simulate(function, TABLE)
    report = cost_report(function, sim, TABLE)
    estimate_s = time.perf_counter() - start
    queues = {k: v for k, v in report.stream_busy_seconds.items() if k.startswith("DMA")}
    busiest_queue = max(queues, key=queues.get) if queues else "-"
    figures = {
        "seconds": report.total_seconds,
        # `onnx2bir report`'s figure: the default table, fp32 PE operands (the transposes of
        # fp32 tiles against the fp32 identity) at a quarter of the rate
        "report_seconds": simulate(function, DEFAULT_TABLE).total_seconds,
        **{e.lower(): report.stream_busy_seconds.get(e, 0.0) for e in ENGINES},
        "dma": sum(queues.values()),
        "dma_queue": queues.get(busiest_queue, 0.0),
        "dma_bytes": report.dma_bytes,
        "compulsory": report.compulsory_dma_bytes,
        "spill": spill_bytes(sim, function),
        "flops": report.flops,
        "model_flops": model_flops(onnx.load(str(path))),
    }
    walls = {
        "compile_s": compile_s,
        "estimate_s": estimate_s,
        "instructions": compiled.instruction_count,
    }
    return {
        "figures": figures,
        "walls": walls,
        "queue": busiest_queue,
        "path": critical_path_split(sim.slices),
        "top_nodes": report.top_nodes,
    }


def inf2_row(name: str) -> dict:
    """One Inf2 row: the program's figures, for an encoder also its extrapolation."""
    row = inf2_table.ROWS[name]
    exports = [p for p in inf2_table.exports_of(name, full=True) if p.exists()]
    measured = {p.name: program_figures(p) for p in exports}
    walls = {p.name: measured[p.name]["walls"] for p in exports}
    out = {"name": name, "row": row, "walls": walls, "extrapolated": None}
    if not row.encoder:
        program = measured[exports[0].name]
        out.update(program=program, depth_note="whole model")
    else:
        one = measured[inf2_table.path_of(name, 1).name]["figures"]
        two = measured[inf2_table.path_of(name, 2).name]["figures"]
        out["extrapolated"] = {k: extrapolate(one[k], two[k], row.depth) for k in one}
        full = inf2_table.path_of(name, row.depth)
        if full.name in measured:
            out.update(program=measured[full.name], depth_note=f"{row.depth} layers compiled")
        else:  # the breakdown of the 2-layer program, the figures extrapolated
            program = dict(measured[inf2_table.path_of(name, 2).name])
            program["figures"] = out["extrapolated"]
            out.update(program=program, depth_note="extrapolated from 1 and 2 layers")
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 1e-2 else f"{seconds * 1e3:.2f}"


def _top(counter: Counter, total: float, count: int = 3) -> str:
    return ", ".join(f"{k} {v / total:.0%}" for k, v in counter.most_common(count))


def inf2_markdown(table: list[dict]) -> str:
    lines = [
        "| row | batch | depth | published (ms) | estimate (ms) | estimate / published "
        "| published − estimate (ms) | published (inf/s) | calls in flight "
        "| core time per call (ms) | estimate / core time "
        "| extrapolated from 1, 2 layers (ms) | `report` (ms) "
        "| PE busy (ms) | ACT busy (ms) | DVE busy (ms) | POOL busy (ms) "
        "| DMA busy, 16 queues summed (ms) | busiest DMA queue (ms) "
        "| matmul GFLOP simulated (model) | PE share of peak, simulated (model) "
        "| DMA MB | compulsory MB | DMA / compulsory | intermediates through DRAM MB |",
        "|---|" + "---|" * 24,
    ]
    peak = TABLE.pe_peak_flops
    for r in table:
        row, f = r["row"], r["program"]["figures"]
        t = f["seconds"]
        extra = r["extrapolated"]
        lines.append(
            f"| {r['name']} | {row.batch} | {r['depth_note']} | {row.published_ms:.3f} "
            f"| {_ms(t)} | {t * 1e3 / row.published_ms:.2f}x "
            f"| {row.published_ms - t * 1e3:.3f} "
            f"| {row.throughput:,.0f} | {row.calls_in_flight:.2f} | {row.core_ms_per_call:.3f} "
            f"| {t * 1e3 / row.core_ms_per_call:.2f}x "
            f"| {_ms(extra['seconds']) if extra else '-'} | {_ms(f['report_seconds'])} "
            + "".join(f"| {_ms(f[e.lower()])} " for e in ENGINES)
            + f"| {_ms(f['dma'])} | {_ms(f['dma_queue'])} ({r['program']['queue']}) "
            f"| {f['flops'] / 1e9:.1f} ({f['model_flops'] / 1e9:.1f}) "
            f"| {f['flops'] / (t * peak):.1%} ({f['model_flops'] / (t * peak):.1%}) "
            f"| {f['dma_bytes'] / 1e6:.1f} | {f['compulsory'] / 1e6:.1f} "
            f"| {f['dma_bytes'] / f['compulsory']:.2f} | {f['spill'] / 1e6:.1f} |"
        )
    lines += [
        "",
        "Where the time goes: the critical path (docs/device_time.md#what-the-report-shows) "
        "split by stream, by rule or kernel and by instruction, each a share of the estimate "
        "(the program of the `depth` column).",
        "",
        "| row | critical path by stream | by rule or kernel | by instruction |",
        "|---|---|---|---|",
    ]
    for r in table:
        path, t = r["program"]["path"], r["program"]["figures"]["seconds"]
        if r["depth_note"].startswith("extrapolated"):
            t = sum(path["stream"].values())  # the 2-layer program's own path
        lines.append(
            f"| {r['name']} | {_top(path['stream'], t)} | {_top(path['rule'], t)} "
            f"| {_top(path['opcode'], t)} |"
        )
    lines += [
        "",
        "Wall time (this machine: 2 cores shared, `nice -n 10`): compiling each export "
        "(`api.compile`, the work of `onnx2bir convert` without writing the files) and "
        "simulating it.",
        "",
        "| export | instructions | compile (s) | estimate (s) |",
        "|---|---|---|---|",
    ]
    for r in table:
        for export, walls in r["walls"].items():
            lines.append(
                f"| `{export}` | {walls['instructions']:,} | {walls['compile_s']:.1f} "
                f"| {walls['estimate_s']:.1f} |"
            )
    return "\n".join(lines) + "\n"


# --- every export form of a row (models/inf2_table.py --export-form) -------------------------


def form_seconds(name: str, form: str) -> float | None:
    """In: a row and an export form. Out: the estimated device time of the row's program in
    that form (an encoder's full depth when exported, else extrapolated from its 1- and 2-layer
    exports), or None when the form's exports are missing."""
    row = inf2_table.ROWS[name]
    full = [p for p in inf2_table.exports_of(name, full=True, form=form) if p.exists()]
    if not row.encoder:
        return _seconds(full[0]) if full else None
    deepest = inf2_table.path_of(name, row.depth, form)
    if deepest.exists():
        return _seconds(deepest)
    one, two = (inf2_table.path_of(name, layers, form) for layers in (1, 2))
    if not (one.exists() and two.exists()):
        return None
    return extrapolate(_seconds(one), _seconds(two), row.depth)


def _seconds(path: Path) -> float:
    return estimate(api.compile(str(path)).module, table=TABLE).total_seconds


def form_rows(names: list[str], forms: list[str]) -> list[dict]:
    """In: rows and export forms. Out: per row, its published latency and the estimate in
    every form that applies and was exported."""
    out = []
    for name in names:
        applicable = [f for f in forms if f in inf2_table.forms_of(name)]
        seconds = {form: form_seconds(name, form) for form in applicable}
        out.append({"name": name, "row": inf2_table.ROWS[name], "seconds": seconds})
    return out


# Rows of one architecture at different depths, shallow to deep: the per-call term is where
# the line through two of them (published against estimate) meets an estimate of zero.
DEPTH_FAMILIES = {
    "ResNet b1": ("resnet18_b1", "resnet34_b1", "resnet50_b1", "resnet101_b1", "resnet152_b1"),
    "BERT-base encoders b1": ("distilbert_base_b1", "bert_base_b1"),
}


def host_terms(estimates: dict[str, float]) -> list[dict]:
    """In: the estimate of each row (seconds, default form). Out: per pair of rows of one
    family, consecutive in depth: the slope published/estimate of the line through them and
    its intercept, the published latency at an estimate of zero (ms): the per-call term the
    table's own depth pairs give, device work that grows with depth taken out."""
    terms = []
    for family, names in DEPTH_FAMILIES.items():
        known = [n for n in names if estimates.get(n) is not None]
        for low, high in zip(known, known[1:], strict=False):
            p1, p2 = (inf2_table.ROWS[n].published_ms for n in (low, high))
            e1, e2 = (estimates[n] * 1e3 for n in (low, high))
            slope = (p2 - p1) / (e2 - e1)
            intercept = p1 - slope * e1
            terms.append(
                {"family": family, "pair": (low, high), "slope": slope, "intercept": intercept}
            )
    return terms


def forms_markdown(table: list[dict], forms: list[str], terms: list[dict]) -> str:
    """The per-form table, the host term from the depth pairs, and the targets."""
    lines = [
        "| row | published (ms) | "
        + " | ".join(f"{f} (ms)" for f in forms)
        + " | worst / best form | published − worst estimate (ms) |",
        "|---|---|" + "---|" * len(forms) + "---|---|",
    ]
    for r in table:
        known = {f: t for f, t in r["seconds"].items() if t is not None}
        cells = [
            f"{r['seconds'][f] * 1e3:.3f}" if r["seconds"].get(f) is not None else "-"
            for f in forms
        ]
        spread = f"{max(known.values()) / min(known.values()):.3f}" if known else "-"
        margin = f"{r['row'].published_ms - max(known.values()) * 1e3:.3f}" if known else "-"
        lines.append(
            f"| {r['name']} | {r['row'].published_ms:.3f} | "
            + " | ".join(cells)
            + f" | {spread} | {margin} |"
        )
    lines += [
        "",
        "The per-call term from the table's own depth pairs: for two rows of one architecture "
        "at different depths, the line through (estimate, published) and its value at an "
        "estimate of zero (the default form's estimates).",
        "",
        "| family | pair | slope published / estimate | per-call term, intercept (ms) |",
        "|---|---|---|---|",
    ]
    for t in terms:
        lines.append(
            f"| {t['family']} | {t['pair'][0]} → {t['pair'][1]} | {t['slope']:.2f} "
            f"| {t['intercept']:.3f} |"
        )
    if terms:
        values = sorted(t["intercept"] for t in terms)
        median = (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2
        lines += [
            "",
            f"Per-call term: median {median:.3f} ms, spread {values[0]:.3f} to "
            f"{values[-1]:.3f} ms over {len(values)} pairs.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", metavar="OUT.md", help="also write the table here")
    parser.add_argument(
        "--vocab", type=int, default=VOCAB, help="the exports' vocabulary (default %(default)s)"
    )
    parser.add_argument(
        "--inf2",
        action="store_true",
        help="the other Inf2 rows (models/inf2_table.py) with their breakdown",
    )
    parser.add_argument(
        "--export-form",
        action="append",
        choices=[*inf2_table.FORMS, "all"],
        help="with --inf2: the estimate of each row under these export forms "
        "(models/inf2_table.py --export-form; 'all': every form) and the per-call term of the "
        "depth pairs, instead of the breakdown",
    )
    parser.add_argument("names", nargs="*", help="models, or with --inf2 rows (default all)")
    args = parser.parse_args(argv)
    if args.inf2 and args.export_form:
        names = args.names or list(inf2_table.ROWS)
        forms = list(inf2_table.FORMS) if "all" in args.export_form else args.export_form
        table = form_rows(names, forms)
        default = {r["name"]: r["seconds"].get(inf2_table.DEFAULT_FORM) for r in table}
        family = [n for f in DEPTH_FAMILIES.values() for n in f if n not in default]
        for r in form_rows(family, [inf2_table.DEFAULT_FORM]):
            default[r["name"]] = r["seconds"].get(inf2_table.DEFAULT_FORM)
        text = forms_markdown(table, forms, host_terms(default))
    elif args.inf2:
        names = args.names or list(inf2_table.ROWS)
        unknown = [n for n in names if n not in inf2_table.ROWS]
        if unknown:
            parser.error(f"unknown rows {unknown}; rows: {', '.join(inf2_table.ROWS)}")
        missing = [str(p) for n in names for p in inf2_table.exports_of(n) if not p.exists()]
        if missing:
            print(f"missing exports (run models/inf2_table.py): {', '.join(missing)}")
            return 2
        text = inf2_markdown([inf2_row(n) for n in names])
    else:
        names = args.names or list(MODELS)
        missing = [
            str(path_of(n, k, args.vocab))
            for n in names
            for k in (1, 2)
            if not path_of(n, k, args.vocab).exists()
        ]
        if missing:
            print(f"missing exports (run models/calibration.py): {', '.join(missing)}")
            return 2
        text = markdown(rows(names, args.vocab))
    print(text, end="")
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
