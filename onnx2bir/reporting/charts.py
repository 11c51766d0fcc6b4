"""Inline SVG charts for the report page: no script, no network, no external font.

- `error_chart`: the error of every node along the graph (`validate --localize`), one mark
  per node in topological order on a log scale, the node's tolerance beside it;
- `kernel_bars`: how many convolutions each kernel got (GENERIC: the fallback lowering);
- `timeline_chart`: the engine timeline of the cost model's schedule.
Every mark carries a `<title>`, which a browser shows as a tooltip.
"""

from __future__ import annotations

import math
from html import escape

from onnx2bir.reporting.timeline import Timeline

STATUS_COLOURS = {"ok": "#2e7d32", "FAIL": "#c62828", "fused": "#9e9e9e"}
ENGINE_COLOURS = {"PE": "#1565c0", "ACT": "#6a1b9a", "DVE": "#00838f", "POOL": "#ef6c00"}
DMA_COLOUR = "#757575"
FLOOR = 1e-12  # the log scale reaches no lower; errors of exactly 0 get their own row


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">'
        + "".join(body)
        + "</svg>"
    )


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 11) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
        f'font-family="sans-serif">{escape(text)}</text>'
    )


def error_chart(nodes: list[dict], width: int = 960, height: int = 320) -> str:
    """Max abs error per node (dots, coloured by status), its atol (grey ticks), the error
    carried in by its inputs (a thin line); log scale."""
    left, right, top, bottom = 60, 20, 20, 70  # below the plot: a row for errors of exactly 0
    values = [
        n["max_abs_err"]
        for n in nodes
        if isinstance(n.get("max_abs_err"), (int, float)) and math.isfinite(n["max_abs_err"])
    ]
    values += [n["atol"] for n in nodes if isinstance(n.get("atol"), (int, float))]
    positive = [v for v in values if v > 0] or [1e-8]
    lo = math.floor(math.log10(max(min(positive), FLOOR))) - 1
    hi = math.ceil(math.log10(max(positive))) + 1
    if hi <= lo:
        hi = lo + 1
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / max(1, len(nodes))

    zero_y = top + plot_h + 14

    def y_of(value: float) -> float:
        if value <= 0:
            return zero_y
        v = math.log10(max(value, 10.0**lo))
        return top + plot_h * (1 - (v - lo) / (hi - lo))

    body = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fafafa" />']
    for exponent in range(lo, hi + 1):
        y = y_of(10.0**exponent)
        body.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd" />'
        )
        body.append(_text(left - 6, y + 4, f"1e{exponent}", "end", 10))
    body.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{zero_y}" y2="{zero_y}" stroke="#ddd" '
        'stroke-dasharray="4 3" />'
    )
    body.append(_text(left - 6, zero_y + 4, "0", "end", 10))
    carried = []
    for index, node in enumerate(nodes):
        x = left + step * (index + 0.5)
        if isinstance(node.get("input_max_abs_err"), (int, float)) and math.isfinite(
            node["input_max_abs_err"]
        ):
            carried.append(f"{x:.1f},{y_of(node['input_max_abs_err']):.1f}")
        if isinstance(node.get("atol"), (int, float)):
            y = y_of(node["atol"])
            body.append(
                f'<line x1="{x - 3:.1f}" x2="{x + 3:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                'stroke="#888" stroke-width="2" />'
            )
        error = node.get("max_abs_err")
        if not isinstance(error, (int, float)):
            continue
        y = y_of(error) if math.isfinite(error) else top
        colour = STATUS_COLOURS.get(node["status"], "#000")
        tip = (
            f"{node['node']} ({node['op_type']}): max abs err {error:.3g}, status "
            f"{node['status']}, {node.get('lowering', '')}"
        )
        body.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}">'
            f"<title>{escape(tip)}</title></circle>"
        )
    if len(carried) > 1:
        body.append(
            f'<polyline points="{" ".join(carried)}" fill="none" stroke="#1565c0" '
            'stroke-width="1" stroke-opacity="0.6" />'
        )
    body.append(_text(left + plot_w / 2, height - 28, "nodes in topological order", "middle"))
    body.append(
        _text(
            left + plot_w / 2,
            height - 10,
            "dot: the node's max abs error (green ok, red over tolerance); grey tick: its atol; "
            "blue line: error already in its inputs; no dot: fused into a kernel or not compared",
            "middle",
            10,
        )
    )
    body.append(
        f'<text x="14" y="{top + plot_h / 2:.1f}" font-size="11" font-family="sans-serif" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})" text-anchor="middle">'
        "max abs error (log)</text>"
    )
    return _svg(width, height, body, "error of each node along the graph")


def kernel_bars(per_kernel: dict[str, int], generic: int, width: int = 960) -> str:
    """One bar per kernel that got a convolution, and one for the generic fallback."""
    rows = [(name, count) for name, count in per_kernel.items() if count]
    if generic:
        rows.append(("GENERIC (fallback lowering)", generic))
    if not rows:
        return ""
    label_w, bar_h = 330, 20
    height = bar_h * len(rows) + 10
    most = max(count for _, count in rows)
    body = []
    for index, (name, count) in enumerate(rows):
        y = 5 + index * bar_h
        w = (width - label_w - 60) * count / most
        colour = "#c62828" if name.startswith("GENERIC") else "#1565c0"
        body.append(_text(label_w - 8, y + 14, name, "end"))
        body.append(
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{bar_h - 6}" '
            f'fill="{colour}"><title>{escape(name)}: {count}</title></rect>'
        )
        body.append(_text(label_w + w + 6, y + 14, str(count)))
    return _svg(width, height, body, "convolutions per kernel")


def timeline_chart(timeline: Timeline, width: int = 960) -> str:
    """One row per engine (DMA: per queue); time in microseconds."""
    resources = timeline.resources
    if not resources or timeline.total_seconds <= 0:
        return ""
    left, right, top, row_h = 70, 20, 10, 16
    height = top + row_h * len(resources) + 40
    plot_w = width - left - right
    scale = plot_w / timeline.total_seconds
    row_of = {name: index for index, name in enumerate(resources)}
    body = []
    for name, index in row_of.items():
        body.append(_text(left - 6, top + index * row_h + 12, name, "end", 10))
    for interval in timeline.intervals:
        y = top + row_of[interval.resource] * row_h + 2
        x = left + interval.start * scale
        w = max(0.5, (interval.end - interval.start) * scale)
        engine = interval.resource.split(" ")[0]
        colour = ENGINE_COLOURS.get(engine, DMA_COLOUR)
        tip = (
            f"{interval.resource}: {interval.label} "
            f"{interval.start * 1e6:.2f}-{interval.end * 1e6:.2f} us"
        )
        body.append(
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 4}" fill="{colour}">'
            f"<title>{escape(tip)}</title></rect>"
        )
    axis_y = top + row_h * len(resources) + 4
    for tick in range(6):
        t = timeline.total_seconds * tick / 5
        x = left + t * scale
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{axis_y}" stroke="#eee" />')
        body.append(_text(x, axis_y + 14, f"{t * 1e6:.1f} us", "middle", 10))
    return _svg(width, height, body, "engine timeline")
