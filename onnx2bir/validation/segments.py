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
2. **Values.** onnxruntime runs the whole model once, the tensors that cross a cut its outputs
   (`subgraph.all_values`).
3. **Segments.** Each piece is a model of its own (`Cutter.segment`): a tensor made before it
   is a graph input fed with onnxruntime's value (a float that depends on the inputs) or a
   constant; every tensor it makes that a later piece or the graph reads is an output. Each is
   validated as `validate` validates a model, so its error is its own: its inputs are
   onnxruntime's, not the previous segment's machine values.
4. **Parallel.** Segments run in forked processes (`jobs` at a time), or as Ray tasks.

The verdict is PASS when every segment passes. Drift is each segment's own (what its casts
cost, from fp32 inputs), so `--max-drift` is refused with segments, as are `--localize` and
`--reference`, which speak of the whole model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import onnx

from onnx2bir.errors import MachineError, UserError
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.validation.subgraph import Cutter, all_values

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


# --- one segment ---------------------------------------------------------------------------
@dataclasses.dataclass
class SegmentTask:
    """What a worker needs to validate one segment (picklable: the model as bytes)."""

    index: int
    model: bytes
    feeds: dict[str, np.ndarray]
    options: CompileOptions
    policy: TolerancePolicy
    schedule: str
    check_races: bool
    threads: int | None = None  # onnxruntime's threads in the worker (None: its default)


def validate_segment(task: SegmentTask) -> dict:
    """Validate one segment; never raises for the model's own failures: {"index", "document"
    (the validate document, or None), "error" ({"kind", "message"} or None), "outputs" (the
    machine's), "wall_seconds"}."""
    from onnx2bir.runtime.machine.blas import blas_threads
    from onnx2bir.runtime.oracle.ort import share_cores
    from onnx2bir.validation.run import run_validate

    limits = contextlib.nullcontext()
    if task.threads is not None:
        # Workers share the cores: idle BLAS and onnxruntime threads that spin while they wait
        # for work slow every process down (a BERT segment's verdict took 4x longer).
        share_cores(task.threads)
        limits = blas_threads(task.threads)
    start = time.perf_counter()
    document, outputs, error = None, {}, None
    try:
        with limits:
            document, _, outputs = run_validate(
                onnx.load_from_string(task.model),
                task.options,
                task.policy,
                input_shapes={name: tuple(v.shape) for name, v in task.feeds.items()},
                inputs=task.feeds,
                inputs_label="onnxruntime's values at the cut",
                schedule=task.schedule,
                check_races=task.check_races,
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
        "wall_seconds": time.perf_counter() - start,
    }


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
# The tasks of the running `_run_processes`: forked workers inherit them, so a task travels to
# its worker as an index rather than as a pickle of its model and arrays.
_FORKED_TASKS: list[SegmentTask] = []


def _validate_inherited(index: int) -> dict:
    return validate_segment(_FORKED_TASKS[index])


def _run_processes(tasks: list[SegmentTask], jobs: int, done) -> None:
    # Forked: the worker starts with onnx2bir imported and the tasks in memory.
    context = multiprocessing.get_context("fork")
    _FORKED_TASKS[:] = tasks
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context) as pool:
            for result in pool.map(_validate_inherited, range(len(tasks))):
                done(result)
    finally:
        _FORKED_TASKS.clear()


def _run_ray(tasks: list[SegmentTask], address: str | None, done) -> None:
    from onnx2bir.ray_cluster import connect

    ray = connect(address)
    remote = ray.remote(validate_segment)
    refs = [remote.options(num_cpus=1, max_retries=0).remote(task) for task in tasks]
    for task, ref in zip(tasks, refs, strict=True):
        try:
            done(ray.get(ref))
        except Exception as exc:  # the task's worker died
            error = {"kind": "internal", "message": f"Ray task failed: {type(exc).__name__}"}
            done({"index": task.index, "document": None, "error": error, "outputs": {}})


def validate_segments(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    shapes: dict[str, tuple[int, ...]],
    options: CompileOptions,
    policy: TolerancePolicy,
    segments: int,
    *,
    jobs: int | None = None,
    ray_address: str | None = None,
    use_ray: bool = False,
    schedule: str = "program",
    check_races: bool = False,
    progress=lambda line: None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """(the segmented document, the machine's values of the graph outputs). `shapes`: every
    tensor's shape, as the import found them."""
    if segments < 2:
        raise UserError(f"--segments {segments}: must be at least 2")
    nodes = len(model.graph.node)
    if segments > nodes:
        raise UserError(f"--segments {segments}: the model has only {nodes} nodes")
    cutter = Cutter(model, feeds, None)
    costs = node_costs(model, shapes)
    cuts = choose_cuts(costs, crossings(cutter), segments)
    bounds = list(zip([0, *cuts], [c - 1 for c in cuts] + [nodes - 1], strict=True))
    # onnxruntime's values of what crosses a cut: each segment's inputs and outputs.
    start = time.perf_counter()
    cutter.values = all_values(model, feeds, crossing_tensors(cutter, cuts))
    ort_seconds = time.perf_counter() - start
    cores = os.cpu_count() or 1
    workers = min(jobs or cores, segments)
    threads = 1 if use_ray else max(1, cores // workers)  # a Ray task asks for one CPU
    tasks, pieces = [], []
    for index, (first, last) in enumerate(bounds):
        cut = cutter.segment(first, last)
        tasks.append(
            SegmentTask(
                index,
                cut.model.SerializeToString(),
                cut.feeds,
                _segment_options(options, cut.model),
                _segment_policy(policy, cut.model),
                schedule,
                check_races,
                threads,
            )
        )
        pieces.append(
            {
                "index": index + 1,
                "first_node": first,
                "last_node": last,
                "nodes": last - first + 1,
                "first_name": cutter.nodes[first].name,
                "last_name": cutter.nodes[last].name,
                "work_share": round(sum(costs[first : last + 1]) / sum(costs), 4),
                "inputs": [i.name for i in cut.model.graph.input],
                "outputs_cut": [o.name for o in cut.model.graph.output],
                "frozen": cut.frozen,
            }
        )
    results: dict[int, dict] = {}

    def done(result: dict) -> None:
        results[result["index"]] = result
        piece = pieces[result["index"]]
        verdict = "error" if result["error"] else "ok"
        if result["document"] is not None and not result["document"]["passed"]:
            verdict = "FAIL"
        progress(
            f"segment {piece['index']}/{len(pieces)} (nodes {piece['first_node']}-"
            f"{piece['last_node']}): {verdict} in {result.get('wall_seconds', 0):.1f} s"
        )

    start = time.perf_counter()
    if use_ray:
        _run_ray(tasks, ray_address, done)
    else:
        _run_processes(tasks, workers, done)
    wall = time.perf_counter() - start
    graph_outputs = [o.name for o in model.graph.output]
    outputs, machine = [], {}
    for piece in pieces:
        result = results[piece["index"] - 1]
        doc, error = result["document"], result["error"]
        piece.update(
            passed=bool(doc and doc["passed"]),
            error=error,
            wall_seconds=round(result.get("wall_seconds", 0.0), 3),
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
            "runner": "ray" if use_ray else "processes",
            "workers": None if use_ray else workers,
            "work": "multiply-accumulates of MatMul/Gemm/Conv/ConvTranspose, elements "
            "written by other nodes",
            "onnxruntime_seconds": round(ort_seconds, 3),
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
    segments: int,
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

    model = load_model(source)
    # Fixed inputs become constants of the model itself: every segment and its onnxruntime
    # session see them so.
    pin_input_values(model, input_values or {}, runtime_inputs(model), input_shapes)
    graph = import_model(model, input_shapes, dims)
    check_policy_names(policy, graph)
    check_exclusions(graph, options.auto_cast_exclude)
    feeds, sources = model_feeds(graph, inputs, inputs_label, seed)
    start = time.perf_counter()
    shapes = {name: tuple(info.shape) for name, info in graph.tensors.items()}
    document, outputs = validate_segments(model, feeds, shapes, options, policy, segments, **how)
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
