"""`onnx2bir profile`: the device-time simulation as a Chrome/Perfetto trace and an SVG picture.

In: a compiled Module. Out: `Profile` (the simulation's slices placed on tracks) and its writers:
`trace_document` (Chrome trace-event JSON: one track per engine and DMA queue, one complete
event per instruction instance, named by opcode, with node, rule or kernel, bytes, instruction
id and dependency ids in args) and `svg_document` (the same timeline as a picture).

A program with at most `EXACT_LIMIT` dynamic instructions is simulated trip by trip (every slice
is one real instance); a larger one uses the report's steady-state loops and draws each loop's
remaining trips as copies of its last simulated trip, one iteration interval apart, up to
`MAX_SLICES` (docs/device_time.md#profile).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from dataclasses import dataclass
from pathlib import Path

from onnx2bir import output_paths
from onnx2bir.bir.ir import Module
from onnx2bir.codegen.instances import estimate_instances
from onnx2bir.runtime.timing.cost import DEFAULT_TABLE, CostTable
from onnx2bir.runtime.timing.device_time import Simulation, Slice, simulate

EXACT_LIMIT = 200_000
MAX_SLICES = 400_000
_ORDER = {"PE": 0, "ACT": 1, "DVE": 2, "POOL": 3}
_COLOURS = {"PE": "#d62728", "ACT": "#2ca02c", "DVE": "#1f77b4", "POOL": "#9467bd"}
_DMA_COLOUR = "#ff7f0e"


@dataclass(frozen=True, slots=True)
class Placed:
    """One drawn instance: a simulated slice moved by `offset` seconds; `sources` are the
    indices (in `Profile.placed`) of the instances it waited for."""

    slice: Slice
    offset: float
    sources: tuple[int, ...] = ()

    @property
    def start(self) -> float:
        return self.slice.start + self.offset

    @property
    def end(self) -> float:
        return self.slice.end + self.offset


@dataclass(frozen=True)
class Profile:
    model: str
    total_seconds: float
    exact: bool  # every trip simulated (no steady-state copies)
    truncated: bool  # MAX_SLICES reached: some steady-state copies are not drawn
    placed: tuple[Placed, ...]

    @property
    def tracks(self) -> list[str]:
        return sorted({p.slice.stream for p in self.placed}, key=track_key)


def track_key(name: str) -> tuple[int, int, str]:
    queue = name.rpartition(" q")[2]
    return _ORDER.get(name, 4), int(queue) if queue.isdigit() else -1, name


def _place(sim: Simulation) -> tuple[list[Placed], bool]:
    # An instance is a slice and the copies it is: ((repeat index, trips back), ...).
    copies: list[list[tuple]] = [[()] for _ in sim.slices]
    count, truncated = len(sim.slices), False
    for number, repeat in enumerate(sim.repeats):  # inner loops are listed before outer ones
        for index in range(repeat.first, repeat.stop):
            own = copies[index]
            more = [(*c, (number, j)) for j in range(1, repeat.extra + 1) for c in own]
            if count + len(more) > MAX_SLICES:
                more, truncated = more[: max(0, MAX_SLICES - count)], True
            own.extend(more)
            count += len(more)

    def offset(copy: tuple) -> float:
        return -sum(j * sim.repeats[number].interval for number, j in copy)

    def covers(number: int, index: int) -> bool:
        return sim.repeats[number].first <= index < sim.repeats[number].stop

    instances = [(i, c, offset(c)) for i, own in enumerate(copies) for c in own]
    instances.sort(key=lambda x: (sim.slices[x[0]].start + x[2], sim.slices[x[0]].ins.id))
    where = {(i, c): n for n, (i, c, _) in enumerate(instances)}
    placed = []
    for index, copy, moved in instances:
        s = sim.slices[index]
        # A dependency's instance is the copy made by the same repeats that cover it too.
        sources = []
        for source in s.sources:
            key = (source, tuple(part for part in copy if covers(part[0], source)))
            if key in where:  # absent only when MAX_SLICES cut the copies
                sources.append(where[key])
        placed.append(Placed(s, moved, tuple(sources)))
    return placed, truncated


def build_profile(model: str, module: Module, table: CostTable = DEFAULT_TABLE) -> Profile:
    function = module.functions[0]
    instances = estimate_instances(function)
    exact = instances.dynamic <= EXACT_LIMIT
    if exact:
        table = dataclasses.replace(table, loop_warmup=max(instances.dynamic, 1))
    sim = simulate(function, table)
    placed, truncated = _place(sim)
    return Profile(model, sim.total_seconds, exact, truncated, tuple(placed))


def trace_document(profile: Profile) -> dict:
    """Chrome trace-event JSON (Object Format); times in microseconds."""
    events: list[dict] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "NeuronCore-v2"}},
    ]
    tids = {name: index + 1 for index, name in enumerate(profile.tracks)}
    for name, tid in tids.items():
        events.append(
            {"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )
        events.append(
            {
                "ph": "M",
                "pid": 1,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": tid},
            }
        )
    for n, p in enumerate(profile.placed):
        ins = p.slice.ins
        events.append(
            {
                "ph": "X",
                "pid": 1,
                "tid": tids[p.slice.stream],
                "name": ins.opcode.value,
                "cat": ins.engine.value,
                "ts": p.start * 1e6,
                "dur": (p.end - p.start) * 1e6,
                "args": {
                    "node": ins.origin.node,
                    "rule": ins.origin.rule,
                    "bytes": p.slice.dma_bytes // max(p.slice.weight, 1),
                    "id": ins.id,
                    "deps": [dep.source for dep in ins.deps],
                    "instance": n,
                    "waits_for": list(p.sources),
                },
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "model": profile.model,
            "estimated_seconds": profile.total_seconds,
            "every_trip_simulated": profile.exact,
            "truncated": profile.truncated,
            "cost_model": "docs/device_time.md",
        },
    }


def svg_document(profile: Profile, width: int = 1200) -> str:
    """The timeline as an SVG picture: one row per track, slices merged below half a pixel."""
    tracks = profile.tracks
    label_w, row_h, top = 70, 18, 40
    plot_w = width - label_w - 10
    total = profile.total_seconds or 1.0
    scale = plot_w / total
    height = top + row_h * len(tracks) + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{label_w}" y="16" font-size="13">{html.escape(profile.model)}: estimated '
        f"device time {total * 1e6:.1f} us (cost model; one row per engine and DMA queue)</text>",
    ]
    rows: dict[str, list[Placed]] = {name: [] for name in tracks}
    for p in profile.placed:
        rows[p.slice.stream].append(p)
    for row, name in enumerate(tracks):
        y = top + row * row_h
        colour = _COLOURS.get(name, _DMA_COLOUR)
        out.append(f'<text x="4" y="{y + 12}">{html.escape(name)}</text>')
        out.append(
            f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{row_h - 2}" fill="#f4f4f4"/>'
        )
        for x0, x1, node in _merged(sorted(rows[name], key=lambda p: p.start), scale):
            out.append(
                f'<rect x="{label_w + x0:.2f}" y="{y}" width="{max(x1 - x0, 0.5):.2f}" '
                f'height="{row_h - 2}" fill="{colour}"><title>{html.escape(node)}</title></rect>'
            )
    axis_y = top + row_h * len(tracks) + 14
    for tick in range(6):
        x = label_w + plot_w * tick / 5
        out.append(
            f'<text x="{x:.1f}" y="{axis_y}" text-anchor="middle">'
            f"{total * tick / 5 * 1e6:.0f} us</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _merged(row: list[Placed], scale: float) -> list[tuple[float, float, str]]:
    spans: list[list] = []
    for p in row:
        x0, x1 = p.start * scale, p.end * scale
        if spans and x0 - spans[-1][1] < 0.5:
            spans[-1][1] = max(spans[-1][1], x1)
        else:
            spans.append([x0, x1, p.slice.ins.origin.node or p.slice.ins.opcode.value])
    return [tuple(span) for span in spans]


def write_file(path: str | os.PathLike, text: str, flag: str) -> Path:
    """Write text to path through `onnx2bir.output_paths`: staged beside it and moved over it,
    so a failure leaves nothing half-written; only a regular file is ever replaced."""
    path = output_paths.check_file(path, flag)
    return output_paths.replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def check_outputs(trace: str | os.PathLike, svg: str | os.PathLike | None = None) -> None:
    """Both outputs are checked before any work (`onnx2bir.output_paths`)."""
    for path, flag in ((trace, "--trace"), (svg, "--svg")):
        if path is not None:
            output_paths.check_file(path, flag)


def write_profile(
    profile: Profile, trace: str | os.PathLike, svg: str | os.PathLike | None = None
) -> list[Path]:
    """Write the trace (and the SVG); both outputs are checked before either is written."""
    check_outputs(trace, svg)
    written = [write_file(trace, json.dumps(trace_document(profile)), "--trace")]
    if svg is not None:
        written.append(write_file(svg, svg_document(profile), "--svg"))
    return written


def summary_json(profile: Profile, written: list[Path]) -> dict:
    busy: dict[str, float] = {}
    for p in profile.placed:
        busy[p.slice.stream] = busy.get(p.slice.stream, 0.0) + p.end - p.start
    return {
        "model": profile.model,
        "estimated_seconds": profile.total_seconds,
        "every_trip_simulated": profile.exact,
        "truncated": profile.truncated,
        "tracks": profile.tracks,
        "slices": len(profile.placed),
        "drawn_busy_seconds": busy,
        "written": [str(path) for path in written],
    }


def summary_text(doc: dict) -> str:
    how = (
        "every loop trip simulated"
        if doc["every_trip_simulated"]
        else "loops in steady state, later trips drawn as copies"
        + (" (truncated)" if doc["truncated"] else "")
    )
    lines = [
        f"{doc['model']}: estimated device time {doc['estimated_seconds'] * 1e6:.1f} us ({how})",
        f"  {doc['slices']} slices on {len(doc['tracks'])} tracks: {', '.join(doc['tracks'])}",
    ]
    lines += [f"  wrote {path}" for path in doc["written"]]
    return "\n".join(lines)
