"""`validate --segments N`: the model cut into N consecutive pieces, each validated on its own.

In: a model, its inputs, the compile options and tolerance policy of `validate`, a segment count.
Out: the segmented validate document (docs/validation.md#segments).

1. **Cuts.** The nodes, in the model's order, are split at N−1 places so that each piece has
   about the same work (`node_costs`, from the shapes the import found: multiply-accumulates
   of a matmul or convolution, the elements each node writes, and the weights it reads, which
   the oracle rounds in each of its runs). Near each ideal place, within an eighth of a
   segment's work either side, the cut that the fewest tensors cross wins — between two
   encoder layers or two residual blocks one tensor crosses, inside an attention block several
   do, so a cut rarely splits an idiom the passes would raise whole.
2. **Values.** onnxruntime's values of the tensors that cross a cut, segment after segment:
   each segment run alone from the values of the earlier ones it reads, loading only its own
   weights (`segment_values`). The parent reads the model without its large external weights
   (`read_model(weights=False)`); with `--segment-memory` the count is planned so that each
   segment fits (`plan_for_memory`).
3. **Segments.** Each piece is a model of its own (`Cutter.segment`): a tensor made before it
   is a graph input fed with onnxruntime's value (a float that depends on the inputs) or a
   constant; every tensor it makes that a later piece or the graph reads is an output. Each is
   validated as `validate` validates a model, so its error is its own: its inputs are
   onnxruntime's, not the previous segment's machine values.
4. **Parallel.** Segments run in forked processes (`jobs` at a time), or as Ray tasks whose
   values travel through Ray's object store.

The verdict is PASS when every segment passes. Drift is each segment's own (what its casts
cost, from fp32 inputs), so `--max-drift` is refused with segments, as are `--localize` and
`--reference`, which speak of the whole model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import resource
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import onnx

from onnx2bir.errors import MachineError, UserError
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.validation.subgraph import Cut, Cutter

# What one weight element costs a segment's validation, in multiply-accumulates: the weight is
# cast, stored and sent to the segment's process, and the oracle rounds it once (a dozen
# elementwise onnxruntime ops for fp8 and tf32, a Cast pair for bf16 and fp16). On light
# resnet50 the four segments' walls spread 1.6-3.6 s without it and 1.6-3.0 s with it. A fit
# of the segments' walls (BERT-12 h256 and light resnet50, 2 and 4 segments) gave about 75 per
# weight and 200 per written element; cutting by those evened the walls but did not shorten
# the runs (docs/validation.md#measured), so the simpler weights stay.
WEIGHT_COST = 20
WINDOW = 1 / 8  # how far from its ideal place a cut may move, as a share of a segment's work


# --- where to cut --------------------------------------------------------------------------
def node_costs(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> list[int]:
    """The work of each node, from its tensors' shapes (the import's): multiply-accumulates of
    MatMul, Gemm, Conv and ConvTranspose, plus the elements it writes, plus WEIGHT_COST per
    element of the weights it reads; at least 1."""

    def size(tensor: str) -> int:
        return int(np.prod(shapes[tensor])) if tensor in shapes else 0

    def trailing(tensor: str) -> int:  # the elements of one output channel's kernel
        return int(np.prod(shapes[tensor][1:])) if tensor in shapes else 0

    weights = {i.name for i in model.graph.initializer}
    costs = []
    for node in model.graph.node:
        written = sum(size(t) for t in node.output if t)
        macs = 0
        if node.op_type in ("MatMul", "Gemm") and node.input[0] in shapes:
            a = shapes[node.input[0]]
            transposed = any(x.name == "transA" and x.i for x in node.attribute)
            macs = written * ((a[0] if transposed else a[-1]) if a else 1)
        elif node.op_type == "Conv":  # an output element: its group's channels x the window
            macs = written * trailing(node.input[1])
        elif node.op_type == "ConvTranspose":  # an input element meets C_out/g x window weights
            macs = size(node.input[0]) * trailing(node.input[1])
        read = sum(size(t) for t in node.input if t in weights)
        costs.append(max(1, macs + written + WEIGHT_COST * read))
    return costs


def crossings(cutter: Cutter) -> list[int]:
    """crossings[p]: how many tensors depending on the inputs a cut before node p separates
    from a reader at or after p."""
    n = len(cutter.nodes)
    produced = {t: i for i, node in enumerate(cutter.nodes) for t in node.output if t}
    last_read: dict[str, int] = {}
    for i, reads in enumerate(cutter.reads):
        for t in reads:
            if t in produced and t in cutter.dynamic:
                last_read[t] = i
    delta = [0] * (n + 2)
    for t, last in last_read.items():
        delta[produced[t] + 1] += 1  # crosses every cut p with produced < p <= last
        delta[last + 1] -= 1
    counts, running = [], 0
    for p in range(n + 1):
        running += delta[p]
        counts.append(running)
    return counts


def crossing_tensors(cutter: Cutter, cuts: list[int]) -> set[str]:
    """The tensors made before a cut and read after it."""
    found = set()
    for cut in cuts:
        made = {t for node in cutter.nodes[:cut] for t in node.output if t}
        found.update(t for reads in cutter.reads[cut:] for t in reads if t in made)
    return found


def choose_cuts(costs: list[int], crossing: list[int], segments: int) -> list[int]:
    """The first node of each segment after the first: N−1 places, strictly increasing, each
    near k/N of the work (module docstring)."""
    n = len(costs)
    before = np.concatenate([[0], np.cumsum(costs)])  # before[p]: the work of nodes 0..p-1
    total = float(before[-1])
    window = WINDOW * total / segments
    cuts: list[int] = []
    for k in range(1, segments):
        low = (cuts[-1] if cuts else 0) + 1
        high = n - (segments - k)  # leave a node for each later segment
        ideal = total * k / segments
        places = [p for p in range(low, high + 1) if abs(before[p] - ideal) <= window]
        if not places:
            places = [min(range(low, high + 1), key=lambda p: abs(before[p] - ideal))]
        cuts.append(min(places, key=lambda p: (crossing[p], abs(before[p] - ideal))))
    return cuts


# --- how much memory a segment needs -------------------------------------------------------
# A segment's validate holds its weights several times (the arrays, the machine's narrowed
# copies, the oracle's roundings, onnxruntime's sessions) and each tensor it computes about 5
# times (the machine's values, plain onnxruntime's, the emulating oracle's, its resynchronised
# run's, the probes'). The weight factor is the measured one with a margin: a 7B-class
# decoder's two-layer segments peaked at about 3.2x their weights plus the process
# (docs/validation.md#segment-memory). On top, the process itself: Python, numpy, onnx and
# onnxruntime loaded.
PLANNED_WEIGHT_COPIES = 3.5
PLANNED_TENSOR_COPIES = 5
PROCESS_BYTES = 600 << 20
# onnxruntime is given each segment as one serialized model, its weights inside: protobuf
# refuses a message over 2 GiB, so a segment's weights stay below this (room for the rest).
SERIALIZED_WEIGHT_BYTES = 1900 << 20


def node_bytes(model: onnx.ModelProto, sizes: dict[str, int]):
    """(weights, written): for each node, the bytes of the initializers it reads (by name, so
    that a segment counts a weight once) and the bytes of the tensors it writes. `sizes`:
    every tensor's bytes, as the import found them."""
    from onnx2bir.frontend.memory_contracts import element_bytes

    stored = {
        init.name: int(np.prod(init.dims, dtype=np.int64)) * element_bytes(init.data_type)
        for init in model.graph.initializer
    }
    weights, written = [], []
    for node in model.graph.node:
        weights.append({t: stored[t] for t in node.input if t in stored})
        written.append(sum(sizes.get(t, 0) for t in node.output if t))
    return weights, written


def planned_peak(weights: list[dict[str, int]], written: list[int], first: int, last: int) -> int:
    """The planned peak of validating nodes first..last on their own (the factors above)."""
    held = segment_weight_bytes(weights, first, last)
    made = sum(written[first : last + 1])
    return int(PROCESS_BYTES + PLANNED_WEIGHT_COPIES * held + PLANNED_TENSOR_COPIES * made)


def segment_weight_bytes(weights: list[dict[str, int]], first: int, last: int) -> int:
    held = {}
    for reads in weights[first : last + 1]:
        held.update(reads)
    return sum(held.values())


def plan_for_memory(
    model: onnx.ModelProto,
    sizes: dict[str, int],
    crossing: list[int],
    limit: int | None,
    at_least: int = 2,
) -> list[int]:
    """The fewest cuts (at least `at_least` segments) whose every segment's weights serialize
    (`SERIALIZED_WEIGHT_BYTES`) and, with a `limit`, whose planned peak is within `limit`
    bytes: the cuts balance the planned bytes as `choose_cuts` balances work."""
    weights, written = node_bytes(model, sizes)
    n = len(weights)

    def fits(a: int, b: int) -> bool:
        if segment_weight_bytes(weights, a, b) > SERIALIZED_WEIGHT_BYTES:
            return False
        return limit is None or planned_peak(weights, written, a, b) <= limit

    costs = [
        max(1, int(PLANNED_WEIGHT_COPIES * sum(w.values()) + PLANNED_TENSOR_COPIES * m))
        for w, m in zip(weights, written, strict=True)
    ]
    for index in range(n):
        if not fits(index, index):
            node = model.graph.node[index]
            need = planned_peak(weights, written, index, index)
            raise UserError(
                f"node {node.name or index} ({node.op_type}) alone is planned to need "
                f"{_gib(need)} and reads {_gib(segment_weight_bytes(weights, index, index))} "
                f"of weights; --segment-memory {_gib(limit or 0)} or onnxruntime's "
                f"{_gib(SERIALIZED_WEIGHT_BYTES)} per segment cannot hold it "
                "(docs/validation.md#segment-memory)"
            )
    whole = planned_peak(weights, written, 0, n - 1) - PROCESS_BYTES
    count = max(at_least, 2)
    if limit is not None:
        count = max(count, -(-whole // max(1, limit - PROCESS_BYTES)))
    while count <= n:
        cuts = choose_cuts(costs, crossing, count)
        bounds = list(zip([0, *cuts], [c - 1 for c in cuts] + [n - 1], strict=True))
        if all(fits(a, b) for a, b in bounds):
            return cuts
        count += 1
    return list(range(1, n))  # one node a segment (each fits: checked above)


def _serializable(model: onnx.ModelProto, sizes: dict[str, int], cuts: list[int]) -> bool:
    weights, _ = node_bytes(model, sizes)
    bounds = zip([0, *cuts], [c - 1 for c in cuts] + [len(weights) - 1], strict=True)
    return all(segment_weight_bytes(weights, a, b) <= SERIALIZED_WEIGHT_BYTES for a, b in bounds)


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.3g} GiB"


# --- one segment ---------------------------------------------------------------------------
@dataclasses.dataclass
class SegmentPlan:
    """What every worker of one run shares: the model (without its large external weights,
    which stay references to the external-data file: `importer.read_model(weights=False)`),
    the graph inputs' values, and each segment's first and last node."""

    skeleton: bytes
    feeds: dict[str, np.ndarray]
    bounds: list[tuple[int, int]]

    def cut(self, index: int, values: dict[str, np.ndarray]) -> Cut:
        """Segment `index` as a model of its own, its weights still references; `values`:
        onnxruntime's values of the tensors it reads from earlier segments."""
        cutter = Cutter(onnx.load_from_string(self.skeleton), self.feeds, values)
        return cutter.segment(*self.bounds[index])


def _merged(earlier: tuple[dict, ...]) -> dict[str, np.ndarray]:
    values: dict[str, np.ndarray] = {}
    for found in earlier:
        values.update(found)
    return values


def segment_values(plan: SegmentPlan, index: int, *earlier: dict) -> dict[str, np.ndarray]:
    """onnxruntime's values of every tensor segment `index` makes that a later segment or the
    graph reads, run on the segment alone (its own weights read from the external data) from
    the values of the earlier segments it reads (`earlier`, one dict each)."""
    from onnx2bir.frontend.importer import load_external_weights
    from onnx2bir.runtime.oracle.ort import run_onnxruntime

    cut = plan.cut(index, _merged(earlier))
    load_external_weights(cut.model)
    return run_onnxruntime(cut.model, cut.feeds)


@dataclasses.dataclass
class SegmentTask:
    """What a worker needs to validate one segment (picklable). `model` and `feeds`: the
    segment already cut (its large weights may still be external references); else the
    worker cuts it from the plan it is given."""

    index: int
    model: bytes | None
    feeds: dict[str, np.ndarray] | None
    options: CompileOptions
    policy: TolerancePolicy
    schedule: str
    check_races: bool
    threads: int | None = None  # onnxruntime's threads in the worker (None: its default)
    memory_limit: int | None = None  # --segment-memory: the segment's own estimate must fit
    frozen: list[str] = dataclasses.field(default_factory=list)  # of `model`: cut tensors


def validate_segment(task: SegmentTask, plan: SegmentPlan | None = None, *earlier: dict) -> dict:
    """Validate one segment (`task.model`, or cut from `plan` with the values of the earlier
    segments it reads and its own, `earlier`); never raises for the model's own failures:
    {"index", "document" (the validate document, or None), "error" ({"kind", "message"} or
    None), "outputs" (the machine's), "cut" (its inputs, outputs and frozen tensors),
    "weight_bytes" (read from the external data), "wall_seconds", "peak_bytes" (the worker's
    resident peak)}."""
    from onnx2bir.frontend.importer import load_external_weights
    from onnx2bir.runtime.machine.blas import blas_threads
    from onnx2bir.runtime.oracle.ort import share_cores
    from onnx2bir.validation.run import run_validate

    _reset_peak()
    limits = contextlib.nullcontext()
    if task.threads is not None:
        # Workers share the cores: idle BLAS and onnxruntime threads that spin while they wait
        # for work slow every process down (a BERT segment's verdict took 4x longer).
        share_cores(task.threads)
        limits = blas_threads(task.threads)
    start = time.perf_counter()
    document, outputs, error, shape, read = None, {}, None, {}, 0
    try:
        if task.model is not None:
            model, feeds, frozen = onnx.load_from_string(task.model), task.feeds, task.frozen
        else:
            cut = plan.cut(task.index, _merged(earlier))
            model, feeds, frozen = cut.model, cut.feeds, cut.frozen
        shape = {
            "inputs": [i.name for i in model.graph.input],
            "outputs_cut": [o.name for o in model.graph.output],
            "frozen": frozen,
        }
        read = load_external_weights(model)
        with limits:
            document, _, outputs = run_validate(
                model,
                _segment_options(task.options, model),
                _segment_policy(task.policy, model),
                input_shapes={name: tuple(v.shape) for name, v in feeds.items()},
                inputs=feeds,
                inputs_label="onnxruntime's values at the cut",
                schedule=task.schedule,
                check_races=task.check_races,
                memory_limit=task.memory_limit,
            )
    except (UserError, MachineError) as exc:
        error = {"kind": str(exc.kind), "message": str(exc)}
    except Exception as exc:  # a bug: reported with the segment, exit 3 for the whole
        error = {"kind": "internal", "message": f"{type(exc).__name__}: {exc}"}
    return {
        "index": task.index,
        "document": document,
        "error": error,
        "outputs": outputs,
        "cut": shape,
        "weight_bytes": read,
        "wall_seconds": time.perf_counter() - start,
        "peak_bytes": _peak_bytes(),
    }


def _reset_peak() -> None:
    """Start the process's resident peak afresh (Linux: /proc/self/clear_refs), so that a
    worker that ran another segment before reports this one's."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")


def _peak_bytes() -> int | None:
    """The process's resident peak since `_reset_peak` (VmHWM), else its lifetime peak."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _segment_policy(policy: TolerancePolicy, model: onnx.ModelProto) -> TolerancePolicy:
    """The policy with only the --tolerance / --op-tolerance names this segment has (the whole
    model's names were checked already)."""
    tensors = {t for node in model.graph.node for t in node.output} | {
        i.name for i in model.graph.input
    }
    op_types = {node.op_type for node in model.graph.node}
    return dataclasses.replace(
        policy,
        tensors={k: v for k, v in policy.tensors.items() if k in tensors},
        op_types={k: v for k, v in policy.op_types.items() if k in op_types},
    )


def _segment_options(options: CompileOptions, model: onnx.ModelProto) -> CompileOptions:
    """The options with only the --auto-cast-exclude entries this segment has."""
    present = {node.name for node in model.graph.node} | {n.op_type for n in model.graph.node}
    kept = tuple(entry for entry in options.auto_cast_exclude if entry in present)
    return dataclasses.replace(options, auto_cast_exclude=kept)


# --- the whole -----------------------------------------------------------------------------
def earlier_segments(cutter: Cutter, bounds: list[tuple[int, int]]) -> list[list[int]]:
    """For each segment, the earlier segments that make a tensor it reads."""
    made_in = {}
    for index, (first, last) in enumerate(bounds):
        for node in cutter.nodes[first : last + 1]:
            made_in.update({t: index for t in node.output if t})
    found = []
    for index, (first, last) in enumerate(bounds):
        reads = {t for r in cutter.reads[first : last + 1] for t in r}
        found.append(sorted({made_in[t] for t in reads if made_in.get(t, index) < index}))
    return found


def _chain_values(plan: SegmentPlan, needs: list[list[int]], progress) -> list[dict]:
    """Each segment's values, one segment after another in this process."""
    made: list[dict] = []
    for index, (first, last) in enumerate(plan.bounds):
        try:
            made.append(segment_values(plan, index, *(made[j] for j in needs[index])))
        except (UserError, MachineError) as exc:
            raise type(exc)(f"segment {index + 1} (nodes {first}-{last}): {exc}") from exc
        progress(f"onnxruntime: segment {index + 1}/{len(plan.bounds)} run")
    return made


def _run_processes(tasks: list[SegmentTask], jobs: int, done) -> None:
    # Forked: the worker starts with onnx2bir imported; a task carries its own segment only.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context) as pool:
        for result in pool.map(validate_segment, tasks):
            done(result)


def _run_ray(
    plan: SegmentPlan, tasks: list[SegmentTask], needs, address, jobs, memory, done, progress
):
    """The values and then the validations as Ray tasks: a segment's values travel from the
    task that made them to the tasks that read them through Ray's object store."""
    from onnx2bir.ray_cluster import connect

    ray = connect(address)
    resources = {"num_cpus": 1, "max_retries": 0}
    if memory:
        resources["memory"] = memory  # Ray places a task only where this much is free
    shared = ray.put(plan)
    make_values = ray.remote(segment_values)
    values = []
    for index in range(len(plan.bounds)):
        earlier = [values[j] for j in needs[index]]
        values.append(make_values.options(**resources).remote(shared, index, *earlier))
    validate = ray.remote(validate_segment)
    pending, waiting = {}, list(range(len(tasks)))
    while waiting or pending:
        while waiting and (not jobs or len(pending) < jobs):
            index = waiting.pop(0)
            earlier = [values[j] for j in [*needs[index], index]]  # its own type its outputs
            call = validate.options(**resources).remote(tasks[index], shared, *earlier)
            pending[call] = index
        ready, _ = ray.wait(list(pending), num_returns=1)
        index = pending.pop(ready[0])
        try:
            done(ray.get(ready[0]))
        except Exception as exc:  # the task's worker died, or the values before it failed
            done({"index": index, "document": None, "error": _ray_error(exc), "outputs": {}})


def _ray_error(exc: Exception) -> dict:
    """The segment's error from a failed Ray task: the model's own error (onnxruntime could
    not make the values it reads, say) keeps its kind; anything else is internal."""
    cause = exc
    while getattr(cause, "cause", None) is not None and cause.cause is not cause:
        cause = cause.cause  # a RayTaskError wraps the task's exception, perhaps another's
    if isinstance(cause, UserError | MachineError):
        return {"kind": str(cause.kind), "message": f"its input values: {cause}"}
    text = " ".join(str(exc).split())[:300]
    return {"kind": "internal", "message": f"Ray task failed: {type(exc).__name__}: {text}"}


def validate_segments(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    graph,
    options: CompileOptions,
    policy: TolerancePolicy,
    segments: int | None,
    *,
    segment_memory: int | None = None,
    memory_limit: int | None = None,
    jobs: int | None = None,
    ray_address: str | None = None,
    use_ray: bool = False,
    schedule: str = "program",
    check_races: bool = False,
    progress=lambda line: None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """(the segmented document, the machine's values of the graph outputs). `model`: as
    `read_model(weights=False)` reads it; `graph`: its import (`onnx2bir.graph.Graph`), for
    each tensor's shape and type; `segment_memory`: plan the count so that each segment's
    planned peak fits (with `segments`, at least that many), and refuse a segment whose own
    estimate exceeds it; else `memory_limit` (or the memory available) is each segment's."""
    nodes = len(model.graph.node)
    if segments is not None and segments < 2:
        raise UserError(f"--segments {segments}: must be at least 2")
    if segments is not None and segments > nodes:
        raise UserError(f"--segments {segments}: the model has only {nodes} nodes")
    cutter = Cutter(model, feeds, {})
    shapes = {name: tuple(info.shape) for name, info in graph.tensors.items()}
    sizes = {
        name: int(np.prod(info.shape, dtype=np.int64)) * np.dtype(info.dtype.numpy).itemsize
        for name, info in graph.tensors.items()
    }
    costs = node_costs(model, shapes)
    crossing = crossings(cutter)
    if segment_memory is not None:
        cuts = plan_for_memory(model, sizes, crossing, segment_memory, segments or 2)
    else:
        cuts = choose_cuts(costs, crossing, segments)
        if not _serializable(model, sizes, cuts):  # more segments than asked, each loadable
            cuts = plan_for_memory(model, sizes, crossing, None, segments)
    bounds = list(zip([0, *cuts], [c - 1 for c in cuts] + [nodes - 1], strict=True))
    plan = SegmentPlan(model.SerializeToString(), feeds, bounds)
    needs = earlier_segments(cutter, bounds)
    cores = os.cpu_count() or 1
    workers = min(jobs or cores, len(bounds))
    threads = 1 if use_ray else max(1, cores // workers)  # a Ray task asks for one CPU
    tasks = [
        SegmentTask(
            index, None, None, options, policy, schedule, check_races, threads, segment_memory
        )
        for index in range(len(bounds))
    ]
    start = time.perf_counter()
    if not use_ray:
        # onnxruntime's values of what crosses a cut, segment after segment, each reading only
        # its own weights; then each segment is cut here and sent to its worker alone.
        made = _chain_values(plan, needs, progress)
        for index, task in enumerate(tasks):
            # its own values too: they type its outputs
            cut = plan.cut(index, _merged(tuple(made[j] for j in [*needs[index], index])))
            task.model, task.feeds = cut.model.SerializeToString(), cut.feeds
            task.frozen = cut.frozen
        del made
    ort_seconds = time.perf_counter() - start
    weights, written = node_bytes(model, sizes)
    pieces = [
        {
            "index": index + 1,
            "first_node": first,
            "last_node": last,
            "nodes": last - first + 1,
            "first_name": cutter.nodes[first].name,
            "last_name": cutter.nodes[last].name,
            "work_share": round(sum(costs[first : last + 1]) / sum(costs), 4),
            "planned_peak_bytes": planned_peak(weights, written, first, last),
        }
        for index, (first, last) in enumerate(bounds)
    ]
    results: dict[int, dict] = {}

    def done(result: dict) -> None:
        results[result["index"]] = result
        piece = pieces[result["index"]]
        verdict = "error" if result["error"] else "ok"
        if result["document"] is not None and not result["document"]["passed"]:
            verdict = "FAIL"
        peak = result.get("peak_bytes")
        progress(
            f"segment {piece['index']}/{len(pieces)} (nodes {piece['first_node']}-"
            f"{piece['last_node']}): {verdict} in {result.get('wall_seconds', 0):.1f} s"
            + (f", peak {_gib(peak)}" if peak else "")
        )

    start = time.perf_counter()
    if use_ray:
        _run_ray(plan, tasks, needs, ray_address, jobs, segment_memory, done, progress)
    else:
        _run_processes(tasks, workers, done)
    wall = time.perf_counter() - start
    graph_outputs = [o.name for o in model.graph.output]
    outputs, machine = [], {}
    for piece in pieces:
        result = results[piece["index"] - 1]
        doc, error = result["document"], result["error"]
        cut = result.get("cut") or {}
        piece.update(
            inputs=cut.get("inputs", []),
            outputs_cut=cut.get("outputs_cut", []),
            frozen=cut.get("frozen", []),
            passed=bool(doc and doc["passed"]),
            error=error,
            wall_seconds=round(result.get("wall_seconds", 0.0), 3),
            peak_bytes=result.get("peak_bytes"),
            weight_bytes=result.get("weight_bytes"),
            outputs=doc["outputs"] if doc else [],
            checkpoints=doc["checkpoints"] if doc else [],
            timings=doc["timings"] if doc else {},
            races=doc["races"] if doc else None,
            emulation=doc["emulation"] if doc else None,
        )
        for record in piece["outputs"]:
            if record["name"] in graph_outputs:
                outputs.append({**record, "segment": piece["index"]})
        machine.update({k: v for k, v in result["outputs"].items() if k in graph_outputs})
    outputs.sort(key=lambda record: graph_outputs.index(record["name"]))
    document = {
        "passed": all(piece["passed"] for piece in pieces),
        "outputs": outputs,
        "segments": pieces,
        "segmenting": {
            "requested": segments,
            "segment_memory": segment_memory,
            "runner": "ray" if use_ray else "processes",
            "workers": jobs if use_ray else workers,
            "work": "multiply-accumulates of MatMul/Gemm/Conv/ConvTranspose, elements "
            "written by other nodes",
            # with Ray, the values are made in the cluster's tasks, not timed here
            "onnxruntime_seconds": None if use_ray else round(ort_seconds, 3),
            "segments_wall_seconds": round(wall, 3),
        },
        "internal_errors": [
            f"segment {p['index']}: {p['error']['message']}"
            for p in pieces
            if p["error"] and p["error"]["kind"] == "internal"
        ],
    }
    return document, machine


def run_segmented(
    source,
    options: CompileOptions,
    policy: TolerancePolicy,
    segments: int | None,
    *,
    input_shapes=None,
    dims=None,
    input_values=None,
    inputs: dict[str, np.ndarray] | None = None,
    inputs_label: str | None = None,
    seed: int = 0,
    **how,
) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`validate --segments`: (document, feeds, the machine's graph outputs), as `run_validate`
    returns them; `how` is `validate_segments`' keywords."""
    from onnx2bir.codegen.casting import check_exclusions
    from onnx2bir.frontend.importer import import_model, load_model, runtime_inputs
    from onnx2bir.frontend.input_values import pin_input_values
    from onnx2bir.runtime.oracle import ort as oracle
    from onnx2bir.validation.inputs import check_policy_names, describe_inputs, model_feeds

    # The model without its large external weights: the import below maps them from the file
    # (it needs their shapes, and reads few values); each segment reads its own.
    model = load_model(source, weights=False)
    # Fixed inputs become constants of the model itself: every segment and its onnxruntime
    # session see them so.
    pin_input_values(model, input_values or {}, runtime_inputs(model), input_shapes)
    graph = import_model(model, input_shapes, dims)
    check_policy_names(policy, graph)
    check_exclusions(graph, options.auto_cast_exclude)
    feeds, sources = model_feeds(graph, inputs, inputs_label, seed)
    start = time.perf_counter()
    document, outputs = validate_segments(model, feeds, graph, options, policy, segments, **how)
    document = {
        "model": source if isinstance(source, str) else "<ModelProto>",
        **document,
        "seed": None if inputs is not None else seed,
        "inputs": describe_inputs(graph, feeds, sources),
        "oracle": oracle.oracle_info(),
        "autocast": options.autocast_text,
        "schedule": how.get("schedule", "program"),
        "timings": {"total": round(time.perf_counter() - start, 3)},
    }
    return document, feeds, outputs


def check_compatible(**flags) -> None:
    """Refuse the validate flags that speak of the whole model (module docstring)."""
    given = [name for name, value in flags.items() if value]
    if given:
        raise UserError(
            f"--segments cannot be combined with {', '.join(given)}: each segment is validated "
            "from onnxruntime's values at its inputs, so its drift and errors are its own "
            "(docs/validation.md#segments)"
        )
