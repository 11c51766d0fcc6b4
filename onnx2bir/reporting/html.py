"""`report --html` and `validate --html`: one self-contained HTML page.

In: the report document (`onnx2bir.reporting.document`), optionally the validate document (with
`--localize`, the per-node errors), and the compilation (for the engine timeline). Out: one
HTML file with inline CSS and inline SVG — no script, no external resource — so it opens
offline and can be mailed as it is. Sections: model summary and notes, validation (outputs,
the error of each node along the graph; with `--segments`, each segment's own error and wall
time), convolutions (kernels per conv, fallback reasons),
attention and MLP blocks, the engine timeline of the cost model, the ops.

Written atomically: a temporary file in the same folder, then renamed over the target.
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path

from onnx2bir import output_paths
from onnx2bir.compiler import Compilation
from onnx2bir.reporting import charts as html_charts
from onnx2bir.reporting.document import GEOMETRY_LEGEND, _conv_geometry, rank_refusals

CSS = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #2e7d32; font-weight: bold; } .fail { color: #c62828; font-weight: bold; }
.note { background: #fff8e1; border-left: 4px solid #f9a825; padding: 4px 8px; margin: 4px 0; }
.muted { color: #666; font-size: 0.9em; } td.geo { white-space: nowrap; }
code { background: #f4f4f4; padding: 0 3px; }
"""


def _td(value, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{escape(str(value))}</td>"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>" + "".join(f"<tr>{''.join(r)}</tr>" for r in rows) + "</table>"


def _num(value, spec: str = ".3e") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _summary(doc: dict, validation: dict | None) -> list[str]:
    status = (
        '<span class="ok">compiles</span>'
        if doc["compiles"]
        else f'<span class="fail">does not compile</span>: {escape(doc["codegen_error"] or "")}'
    )
    parts = [f"<h1>onnx2bir report: {escape(str(doc['model']))}</h1>", f"<p>{status}</p>"]
    rows = [
        [_td("ops in the model"), _td(sum(doc["ops"].values()), "num")],
        [_td("convolutions matched to kernels"), _td(_conv_share(doc), "num")],
        [_td("attention blocks found / raised"), _td(_block_share(doc["attention"]), "num")],
        [_td("MLP blocks found / raised"), _td(_block_share(doc["mlp"]), "num")],
    ]
    if doc.get("instructions"):
        per_engine = ", ".join(f"{e} {n}" for e, n in doc["instructions"]["per_engine"].items())
        rows.append(
            [_td("BIR instructions"), _td(f"{doc['instructions']['total']} ({per_engine})")]
        )
    if doc.get("cost"):
        rows.append(
            [
                _td("estimated device time (cost model)"),
                _td(f"{doc['cost']['estimated_seconds'] * 1e6:.1f} us", "num"),
            ]
        )
    if validation is not None:
        verdict = "PASS" if validation["passed"] else "FAIL"
        cls = "ok" if validation["passed"] else "fail"
        good = sum(1 for o in validation["outputs"] if o["passed"])
        rows.append(
            [
                _td("validation against onnxruntime"),
                _td(f"{verdict}: {good}/{len(validation['outputs'])} outputs", cls),
            ]
        )
    parts.append(_table(["", "value"], rows))
    for note in doc.get("notes", []):
        parts.append(
            f'<div class="note"><b>{escape(note["flag"])}</b>: {escape(note["message"])}</div>'
        )
    return parts


def _conv_share(doc: dict) -> str:
    stats = doc["statistics"]
    if not stats.get("total_conv_ops"):
        return "none in the model"
    return (
        f"{stats['matched_conv_ops']} of {stats['total_conv_ops']} "
        f"({stats['conv_kernel_match_percentage']:.1f}%)"
    )


def _block_share(blocks: list[dict]) -> str:
    return f"{len(blocks)} / {sum(1 for b in blocks if b.get('target'))}"


def _validation(validation: dict) -> list[str]:
    parts = ['<h2 id="validation">Validation against onnxruntime</h2>']
    emulation = validation.get("emulation")
    if emulation and emulation["casts"]:
        parts.append(
            f"<p>The oracle is onnxruntime rounding where the program rounds "
            f"({emulation['casts']} cast points); {emulation['resynchronised']} intermediates "
            "were read from the machine, checked and fed on. The error columns compare with "
            "that oracle; the drift columns with plain fp32 onnxruntime (what the casts cost; "
            "R = |machine − fp32| / |emulation − fp32|).</p>"
        )
    rows = []
    for out in validation["outputs"]:
        cls = "ok" if out["passed"] else "fail"
        drift = out.get("drift") or {}
        verdict = "ok" if out["passed"] else f"FAIL ({out['mismatches']} of {out['size']})"
        if out.get("verifiable") is False:
            verdict = "UNVERIFIABLE"
        rows.append(
            [
                _td(out["name"]),
                _td(verdict, cls),
                _td(_num(out["max_abs_err"]), "num"),
                _td(_num(out["max_rel_err"]), "num"),
                _td(f"{_num(out['atol'], 'g')} + {_num(out['rtol'], 'g')}·|ref|"),
                _td(_num(drift.get("cosine"), ".6f"), "num"),
                _td(_num(drift.get("snr_db"), ".1f"), "num"),
                _td(_num(drift.get("max_abs_err")), "num"),
                _td(_num(drift.get("r"), ".3f"), "num"),
            ]
        )
    parts.append(
        _table(
            [
                "output",
                "verdict",
                "largest |machine - oracle|",
                "largest relative error",
                "bound (atol + rtol·|oracle|)",
                "drift: cosine",
                "drift: SNR dB",
                "drift: max abs error",
                "drift: R",
            ],
            rows,
        )
    )
    failing = [c for c in validation.get("checkpoints") or [] if not c["passed"]]
    if failing:
        parts.append(
            _table(
                ["intermediate over its bound", "from node", "elements over", "max abs error"],
                [
                    [
                        _td(c["name"]),
                        _td(f"{c.get('op_type', '')} {c.get('producer', '')}"),
                        _td(f"{c['mismatches']} of {c['size']}", "fail"),
                        _td(_num(c["max_abs_err"]), "num"),
                    ]
                    for c in failing
                ],
            )
        )
    loc = validation.get("localize")
    if loc is None:
        parts.append(
            '<p class="muted">Run <code>validate --localize --html</code> for the error of '
            "every node along the graph.</p>"
        )
        return parts
    parts.append("<h3>Error of each node along the graph</h3>")
    first = loc.get("first_failing")
    if first:
        parts.append(
            f"<p>First node over tolerance: <b>{escape(first['node'])}</b> "
            f"({escape(first['op_type'])}): {escape(first['verdict'])} — "
            f"{escape(first['explanation'])}</p>"
        )
    else:
        parts.append("<p>Every compared intermediate is within its tolerance.</p>")
    parts.append(html_charts.error_chart(loc["nodes"]))
    return parts


def _segments(validation: dict) -> list[str]:
    """`validate --segments`: each segment's nodes, cut tensors, verdict, worst error and wall
    time."""
    how = validation["segmenting"]
    runner = "Ray tasks" if how["runner"] == "ray" else f"{how['workers']} processes"
    parts = [
        '<h2 id="segments">Segments</h2>',
        f"<p>The model was cut into {len(validation['segments'])} consecutive pieces of about "
        "equal work, each validated on its own from onnxruntime's values at its inputs, so each "
        f"error below is that segment's own ({runner}, {how['segments_wall_seconds']:.1f} s).</p>",
    ]
    rows = []
    for piece in validation["segments"]:
        judged = [*piece["outputs"], *[c for c in piece["checkpoints"] if c["verifiable"]]]
        worst = max(judged, key=lambda e: e["max_abs_err"] or 0.0, default=None)
        verdict, cls = ("ok", "ok") if piece["passed"] else ("FAIL", "fail")
        if piece["error"]:
            verdict = f"error: {piece['error']['message']}"
        failing = [e["name"] for e in judged if not e["passed"]]
        rows.append(
            [
                _td(f"segment {piece['index']}"),
                _td(
                    f"{piece['first_node']}-{piece['last_node']} "
                    f"({piece['first_name']} … {piece['last_name']})"
                ),
                _td(f"{piece['work_share'] * 100:.1f}%", "num"),
                _td(", ".join(piece["inputs"])),
                _td(", ".join(piece["outputs_cut"])),
                _td(verdict + (f" ({', '.join(failing[:3])})" if failing else ""), cls),
                _td("-" if worst is None else f"{_num(worst['max_abs_err'])} ({worst['name']})"),
                _td(f"{piece['wall_seconds']:.2f} s", "num"),
            ]
        )
    headers = ["", "nodes", "work", "inputs", "outputs", "verdict", "worst |m − o|", "wall"]
    parts.append(_table(headers, rows))
    return parts


def _convs(doc: dict) -> list[str]:
    convs = doc["convs"]
    if not convs:
        return []
    stats = doc["statistics"]
    generic = sum(1 for c in convs if not c["kernel"])
    parts = ['<h2 id="convolutions">Convolutions: kernel or fallback</h2>']
    parts.append(html_charts.kernel_bars(stats.get("per_kernel", {}), generic))
    rows = []
    for conv in convs:
        ranked = conv.get("closest_refusals") or rank_refusals(conv)
        reasons = "; ".join(f"{s['entry']}: {s['refused']}" for s in ranked[:3])
        if not ranked:  # the registry was not walked (a 3-D conv): the one reason
            reasons = conv.get("fallback_reason") or ""
        rows.append(
            [
                _td(conv["node"]),
                _td(conv["op_type"]),
                _td(_conv_geometry(conv), "geo"),
                _td(conv["kernel"] or "GENERIC", "" if conv["kernel"] else "fail"),
                _td("" if conv["kernel"] else reasons + (" …" if len(ranked) > 3 else "")),
            ]
        )
    parts.append(f'<p class="muted">{escape(GEOMETRY_LEGEND)}.</p>')
    parts.append(
        _table(
            [
                "node",
                "op type",
                "geometry",
                "kernel (GENERIC: the generic lowering)",
                "why no kernel: the closest registry entries' refusals",
            ],
            rows,
        )
    )
    return parts


def _blocks(doc: dict) -> list[str]:
    parts = ['<h2 id="attention">Attention and MLP blocks</h2>']
    if not doc["attention"] and not doc["mlp"]:
        parts.append("<p>No attention or MLP block was found in this model.</p>")
        return parts
    rows = []
    for a in doc["attention"]:
        rows.append(
            [
                _td("attention"),
                _td(a["nodes"][0] if a["nodes"] else "?"),
                _td(a.get("variant") or "-"),
                _td(
                    f"seq {a.get('seq_q', '?')}x{a.get('seq_k', '?')}, head dim "
                    f"{a.get('head_dim', '?')}, {a.get('dtype', '?')}"
                ),
                _td(a["target"] or f"not raised: {a['reason']}", "" if a["target"] else "fail"),
            ]
        )
    for m in doc["mlp"]:
        rows.append(
            [
                _td("MLP"),
                _td(m["nodes"][0]),
                _td(m.get("activation") or "-"),
                _td(f"{len(m['nodes'])} nodes"),
                _td(m["target"] or f"not raised: {m.get('reason')}"),
            ]
        )
    parts.append(
        _table(["block", "first node", "variant / activation", "shape", "raised to"], rows)
    )
    return parts


def _timeline(compilation: Compilation | None) -> list[str]:
    if compilation is None or compilation.module is None:
        return []
    from onnx2bir.reporting.timeline import engine_timeline

    timeline = engine_timeline(compilation.module)
    chart = html_charts.timeline_chart(timeline)
    if not chart:
        return []
    return [
        '<h2 id="timeline">Engine timeline (cost model estimate)</h2>',
        '<p class="muted">The schedule behind the estimated device time (runtime/timing/cost.py): '
        "each bar is an instruction, or a whole loop with its trip count, on its engine or DMA "
        "queue. An estimate, not a measurement; hover a bar for its node.</p>",
        chart,
    ]


def _ops(doc: dict) -> list[str]:
    rows = [[_td(op), _td(count, "num")] for op, count in doc["ops"].items()]
    return ['<h2 id="ops">Ops in the model</h2>', _table(["op type", "count"], rows)]


def render_page(doc: dict, validation: dict | None, compilation: Compilation | None) -> str:
    body = _summary(doc, validation)
    if validation is not None:
        body += _validation(validation)
    if validation is not None and "segments" in validation:
        body += _segments(validation)
    body += _convs(doc) + _blocks(doc) + _timeline(compilation) + _ops(doc)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>onnx2bir: {escape(str(doc['model']))}</title>"
        f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_page(
    path: str | os.PathLike,
    doc: dict,
    validation: dict | None,
    compilation: Compilation | None,
) -> Path:
    """Render the page and write it through `onnx2bir.output_paths` (never over a non-file)."""
    path = output_paths.check_file(path, "--html")
    text = render_page(doc, validation, compilation)
    return output_paths.replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
