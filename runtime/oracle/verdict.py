"""The verdict: each output and each checkpoint against the emulating oracle; drift apart.

In: the graph as imported, the cast plan, the machine's outputs and probed intermediates,
the emulating oracle's values (resynchronised at the probes), the plain emulation's and
plain fp32 onnxruntime's outputs, and the tolerance policy. Out: per output an
`OutputComparison` with the bound it was judged by, a verifiability check and its drift; per
probed intermediate a checkpoint record (docs/validation.md#verdict).

Bounds. The emulating oracle rounds where the machine rounds, so what is left between the two
is fp32 arithmetic in another order: every compared tensor gets the fp32 bound (atol 1e-4,
rtol 1e-3, the `--auto-cast none` rule), a matmul's or convolution's output with its
summation order's allowance added per element (docs/validation.md#reductions) — unless its
oracle value depends, through no probe, on a rounding the oracle can only approximate: inside
the raised attention kernel, inside an op the plan lists as unemulated, or in a model whose
own tensors are fp16/bf16 (onnxruntime computes those in its own way). Such a tensor is
*tainted* and gets the statistical bound of `runtime/oracle/tolerance.py` for its path and the
count D of approximate roundings on its longest chain since the last probe (a recurrent op
puts one per step there: `chained_roundings`). The user's overrides apply as before.

Checkpoints. A probed tensor the machine stores in fp32 is compared as an output is. One it
stores narrow (`--auto-cast all`, operand-only tensors) is compared after rounding: it passes
when each element is the rounding of some value within the bound of the oracle's,
round(o − tol) ≤ m ≤ round(o + tol) (rounding is monotone), so a flipped rounding at a
half-way point passes and a wrong value does not.

Verifiability. A bound with rtol ≥ 1, or atol ≥ rms(reference) for a reference that is not
all zeros, accepts an output of zeros: such an output is *unverifiable* and fails. A probe
whose bound is unverifiable, or whose NaN and ±inf are not where the plain emulation has
them, is not resynchronised: the oracle rounds its own value there, so an error at the probe
is carried to a checked tensor instead of hidden, and a NaN is seen where it arose.

Drift (`drift`): the machine against plain fp32 onnxruntime (or the user's reference), the
error the device's casts cause: cosine, SNR in dB, max abs error, and R = ‖machine − fp32‖ /
‖emulation − fp32‖, the emulation's own distance from fp32 on the same casts (R near 1: the
machine's error is the casts'). It changes the verdict only through `--max-drift`.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from onnx2bir.bir.cast_plan import CastPlan
from onnx2bir.bir.dtypes import store_as
from onnx2bir.bir.enums import Dtype
from onnx2bir.errors import UserError
from onnx2bir.graph import Graph
from onnx2bir.runtime.oracle import ort
from onnx2bir.runtime.oracle.blas_dot import dots, one_thread
from onnx2bir.runtime.oracle.compare import OutputComparison, compare_output
from onnx2bir.runtime.oracle.emulating import ACCUMULATION_SUFFIX, ALLOWANCE_SUFFIX, accumulates
from onnx2bir.runtime.oracle.tolerance import (
    Tolerance,
    TolerancePolicy,
    chained_roundings,
    looser,
    path_of_dtype,
    reduction_length,
)

DRIFT_KEYS = {"cosine": "cosine", "snr": "snr_db", "r": "r"}


# --- where the oracle is exact ---------------------------------------------------------------
@dataclass(frozen=True)
class Taint:
    """Why a tensor's oracle value is only approximately the device's: the loosest path of
    the approximate roundings it depends on, and how many lie on its longest chain."""

    path: str
    depth: int
    cause: str


def taints(graph: Graph, plan: CastPlan, resynced: set[str]) -> dict[str, Taint]:
    """Tensor → Taint for every tensor whose oracle value depends on an approximate rounding
    through no resynchronised probe (module docstring)."""
    inexact: dict[str, tuple[str, str]] = {}  # node → (path, cause)
    for point in plan.points:
        if not point.exact:
            inexact[point.node] = (path_of_dtype(point.dtype), point.reason or "approximate")
    for node, reason in plan.unemulated.items():
        inexact[node] = (_plan_path(plan), reason)
    # Every reader of a resynchronised tensor takes the machine's value.
    through_probe = {(node, t) for t in resynced for node, _ in graph.consumers(t)}
    found: dict[str, Taint] = {}
    for name, data in graph.nodes():
        carried: Taint | None = None
        for tensor in data["inputs"]:
            taint = found.get(tensor)
            if taint is None or (name, tensor) in through_probe:
                continue
            if carried is None or taint.depth > carried.depth:
                carried = Taint(
                    looser(taint.path, carried.path) if carried else taint.path,
                    taint.depth,
                    taint.cause,
                )
        own = inexact.get(name) or _native_low_precision(graph, data)
        if own is not None:
            path, cause = own
            depth = (carried.depth if carried else 0) + chained_roundings(graph, name)
            carried = Taint(looser(path, carried.path) if carried else path, depth, cause)
        if carried is not None:
            for tensor in data["outputs"]:
                if tensor and graph.tensors.get(tensor) and graph.tensors[tensor].dtype.is_float:
                    found[tensor] = carried
    return found


def _plan_path(plan: CastPlan) -> str:
    paths = [path_of_dtype(p.dtype) for p in plan.points] or ["bf16"]
    result = paths[0]
    for path in paths[1:]:
        result = looser(result, path)
    return result


def _native_low_precision(graph: Graph, data: dict) -> tuple[str, str] | None:
    """A node computing in the model's own fp16/bf16: onnxruntime sums those its own way."""
    for tensor in [*data["inputs"], *data["outputs"]]:
        info = graph.tensors.get(tensor) if tensor else None
        if info is not None and info.dtype in (Dtype.BF16, Dtype.FP16):
            path = path_of_dtype(info.dtype)
            return path, f"{data['op_type']} computes in the model's {info.dtype}"
    return None


# --- the bound of one tensor -------------------------------------------------------------------
def bound_for(
    policy: TolerancePolicy,
    graph: Graph,
    tensor: str,
    reference: np.ndarray,
    taint: Taint | None,
) -> tuple[Tolerance, str]:
    """(tolerance, bound kind) for a compared tensor: "fp32", "exact" or "statistical"."""
    producer = graph.producer(tensor)
    op_type = graph.node(producer)["op_type"] if producer else None
    info = graph.tensors[tensor]
    if not info.dtype.is_float:
        path, kind, depth = "exact", "exact", 1
    elif taint is None:
        path, kind, depth = "fp32", "fp32", 1
    else:
        path, kind, depth = taint.path, "statistical", taint.depth
    reduction = reduction_length(graph, producer) if producer else 1
    tol = policy.for_tensor(tensor, op_type, path, reference, reduction, depth)
    if kind == "statistical":
        tol = Tolerance(tol.atol, tol.rtol, f"{tol.source}; {taint.cause}")
    return tol, kind


def same_nonfinite(machine: np.ndarray, oracle: np.ndarray) -> bool:
    """Whether NaN and ±inf sit at the same places with the same values on both sides (a
    probe that made a NaN is not fed on: the NaN must be seen where it arose)."""
    if np.shape(machine) == np.shape(oracle) and _all_finite(machine) and _all_finite(oracle):
        return True  # the usual case, without float64 copies
    m, o = np.asarray(machine, np.float64), np.asarray(oracle, np.float64)
    if m.shape != o.shape:
        return False
    bad_m, bad_o = ~np.isfinite(m), ~np.isfinite(o)
    if not (bad_m.any() or bad_o.any()):
        return True
    return bool(np.array_equal(bad_m, bad_o) and np.array_equal(m[bad_m], o[bad_o], equal_nan=True))


def unverifiable_reason(tol: Tolerance, reference: np.ndarray) -> str | None:
    """Why a bound cannot tell the right answer from zeros (module docstring), or None."""
    if tol.rtol >= 1.0:
        return f"rtol {tol.rtol:.3g} >= 1 accepts any value of the right sign or zero"
    rms = _rms(reference)
    if rms > 0 and tol.atol >= rms:
        return f"atol {tol.atol:.3g} >= rms of the reference {rms:.3g} accepts zeros"
    return None


def _all_finite(values: np.ndarray) -> bool:
    """Whether every element is finite (integers and booleans always are)."""
    v = np.asarray(values)
    if v.dtype.kind in "biu":
        return True
    if v.dtype.kind == "V":  # ml_dtypes' narrow floats
        v = v.astype(np.float32)
    return bool(np.isfinite(v).all())


def _rms(values: np.ndarray) -> float:
    """The RMS of the finite values (0 for none, and for integers)."""
    v = np.asarray(values)
    if v.dtype.kind not in "fV" or not v.size:
        return 0.0
    if _all_finite(v):  # the same values, in the same order, as the masked copy below
        v = v.astype(np.float64).reshape(-1)
    else:
        v = v.astype(np.float64)
        v = v[np.isfinite(v)]
    return float(np.sqrt(np.mean(v * v))) if v.size else 0.0


# --- checkpoints -----------------------------------------------------------------------------
def check_narrow(
    name: str,
    machine: np.ndarray,
    stored: Dtype,
    oracle: np.ndarray,
    tol: Tolerance,
    allowance: np.ndarray | None = None,
) -> OutputComparison:
    """A probed tensor the machine stores in `stored`: each element must be the rounding of a
    value within the bound of the oracle's (module docstring). The statistics are those of
    the plain comparison; only the verdict and the mismatch count follow the rounding rule."""
    plain = compare_output(name, machine, oracle, tol.atol, tol.rtol, tol.source)
    if plain.shape_error:
        return plain
    o = np.asarray(oracle, np.float64)
    m = np.asarray(machine, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        slack = tol.atol + tol.rtol * np.abs(o)
        if allowance is not None and np.shape(allowance) == o.shape:
            slack = slack + np.asarray(allowance, np.float64)
        low = _rounded(o - slack, stored)
        high = _rounded(o + slack, stored)
        inside = (m >= low) & (m <= high)
        same_special = (np.isnan(m) & np.isnan(o)) | (np.isinf(m) & (m == o))
        bad = ~(inside | same_special)
    return replace(plain, passed=not bool(bad.any()), mismatches=int(bad.sum()))


def _rounded(values: np.ndarray, dtype: Dtype) -> np.ndarray:
    return np.asarray(store_as(values.astype(np.float32), dtype), np.float64)


# --- drift -----------------------------------------------------------------------------------
def drift(
    machine: np.ndarray, reference: np.ndarray, emulated: np.ndarray | None, against: str
) -> dict | None:
    """The machine's distance from `reference` (plain fp32, or the user's), beside the
    emulation's (module docstring); None for integer and bool outputs."""
    if np.asarray(reference).dtype.kind not in "fV" or np.shape(machine) != np.shape(reference):
        return None
    m = np.asarray(machine, np.float64).reshape(-1)
    f = np.asarray(reference, np.float64).reshape(-1)
    finite = np.isfinite(m) & np.isfinite(f)
    error = np.where(finite, m - f, 0.0)
    ref = np.where(finite, f, 0.0)
    kept = np.where(finite, m, 0.0)
    noise, signal, squares, product = (
        float(total) for total in dots((error, error), (ref, ref), (kept, kept), (kept, ref))
    )
    norm = math.sqrt(squares * signal)
    if norm > 0:
        cosine = float(product / norm)
    else:
        cosine = 1.0 if noise == 0 else 0.0
    if noise == 0:
        snr = float("inf")
    elif signal == 0:
        snr = float("-inf")
    else:
        snr = 10.0 * math.log10(signal / noise)
    r = None
    if emulated is not None and np.shape(emulated) == np.shape(reference):
        e = np.asarray(emulated, np.float64).reshape(-1)
        both = finite & np.isfinite(e)
        own = math.sqrt(float(np.sum((e[both] - f[both]) ** 2)))
        if own > 0:
            r = math.sqrt(noise) / own
    return {
        "against": against,
        "cosine": cosine,
        "snr_db": snr,
        "max_abs_err": float(np.max(np.abs(error))) if error.size else 0.0,
        "r": r,
        "nonfinite_mismatches": int(np.sum(~finite & ~(np.isnan(m) & np.isnan(f)) & (m != f))),
    }


def parse_max_drift(texts: list[str] | str | None) -> dict[str, float]:
    """`--max-drift cosine=0.999,snr=30,r=1.2` (repeatable, comma-separated) as limits."""
    if not texts:
        return {}
    if isinstance(texts, str):
        texts = [texts]
    limits: dict[str, float] = {}
    for text in texts:
        for part in str(text).split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or key not in DRIFT_KEYS:
                raise UserError(
                    f"--max-drift {text!r}: expected KEY=VALUE with KEY one of "
                    f"{', '.join(DRIFT_KEYS)} (e.g. cosine=0.999,snr=30,r=1.2)"
                )
            try:
                number = float(value)
            except ValueError:
                raise UserError(f"--max-drift {text!r}: {value!r} is not a number") from None
            if not math.isfinite(number):
                raise UserError(f"--max-drift {text!r}: {value!r} must be finite")
            if key == "cosine" and not -1 <= number <= 1:
                raise UserError(f"--max-drift {text!r}: a cosine is within [-1, 1]")
            if key == "r" and number <= 0:
                raise UserError(f"--max-drift {text!r}: r must be > 0")
            limits[key] = number
    return limits


def drift_failures(record: dict | None, limits: dict[str, float]) -> list[str]:
    """Which of `limits` an output's drift breaks (an R that does not exist breaks none)."""
    if not limits or record is None:
        return []
    failures = []
    if "cosine" in limits and not record["cosine"] >= limits["cosine"]:
        failures.append(f"cosine {record['cosine']:.9g} < {limits['cosine']}")
    if "snr" in limits and not record["snr_db"] >= limits["snr"]:
        failures.append(f"SNR {record['snr_db']:.2f} dB < {limits['snr']}")
    if "r" in limits and record["r"] is not None and not record["r"] <= limits["r"]:
        failures.append(f"R {record['r']:.4f} > {limits['r']}")
    return failures


# --- the whole verdict -----------------------------------------------------------------------
@dataclass
class Evidence:
    """What a verdict is made from (module docstring)."""

    machine: dict[str, np.ndarray]  # the machine's graph outputs
    probes: dict[str, np.ndarray]  # the machine's values of the probed intermediates
    stored: dict[str, Dtype]  # the dtype each probed tensor's location holds
    reference: dict[str, np.ndarray]  # plain fp32 onnxruntime's outputs, or the user's
    reference_kind: str  # "onnxruntime fp32" or where the user's outputs came from


def judge(
    graph: Graph,
    plan: CastPlan,
    evidence: Evidence,
    policy: TolerancePolicy,
    run_oracle,
    max_drift: dict[str, float] | None = None,
) -> tuple[list[dict], list[dict], dict]:
    """(output entries, checkpoint entries, emulation summary).

    `run_oracle(machine_values, outputs)` runs the emulating oracle: resynchronised at the
    tensors of `machine_values`, or plain when it is empty."""
    probed = [t for t in evidence.probes if t in graph.tensors]
    allowances = [t + ALLOWANCE_SUFFIX for t in plan.boundaries if t in evidence.probes]
    allowances += [
        t + ACCUMULATION_SUFFIX
        for t in dict.fromkeys([*probed, *graph.outputs])
        if accumulates(graph, t) or t in plan.online or t in plan.expanded
    ]
    wanted = list(dict.fromkeys([*graph.outputs, *probed, *allowances]))
    emulated = run_oracle({}, wanted)
    first = taints(graph, plan, set(probed))

    def fed_on(tensor: str) -> bool:
        return (
            same_nonfinite(evidence.probes[tensor], emulated[tensor])
            and unverifiable_reason(
                bound_for(policy, graph, tensor, emulated[tensor], first.get(tensor))[0],
                emulated[tensor],
            )
            is None
        )

    resync = {tensor for tensor, fed in zip(probed, _each(fed_on, probed), strict=True) if fed}
    oracle = run_oracle({t: evidence.probes[t] for t in resync}, wanted) if resync else emulated
    emulated = {name: emulated[name] for name in graph.outputs}  # for drift; the rest is freed
    final = taints(graph, plan, resync)
    readers: dict[str, list[str]] = {}
    for point in plan.points:
        readers.setdefault(point.input, []).append(point.node)
    checkpoints = []
    rank = {name: index for index, (name, _) in enumerate(graph.nodes())}

    def checked(tensor: str):
        tol, kind = bound_for(policy, graph, tensor, oracle[tensor], final.get(tensor))
        stored = evidence.stored.get(tensor, Dtype.FP32)
        allowance = _allowance(oracle, tensor)
        if stored.mantissa_bits < Dtype.FP32.mantissa_bits:
            result = check_narrow(
                tensor, evidence.probes[tensor], stored, oracle[tensor], tol, allowance
            )
        else:
            result = compare_output(
                tensor,
                evidence.probes[tensor],
                oracle[tensor],
                tol.atol,
                tol.rtol,
                tol.source,
                allowance,
            )
        return tol, kind, stored, result

    ordered = sorted(probed, key=lambda t: rank.get(graph.producer(t), len(rank)))
    for tensor, (tol, kind, stored, result) in zip(ordered, _each(checked, ordered), strict=True):
        entry = _record(result)
        entry.update(_allowance_record(oracle, tensor))
        why = None if tensor in resync else unverifiable_reason(tol, oracle[tensor])
        entry.update(
            producer=graph.producer(tensor),
            op_type=graph.node(graph.producer(tensor))["op_type"],
            readers=readers.get(tensor, []),
            stored=str(stored),
            bound=kind,
            resynchronised=tensor in resync,
            verifiable=why is None,
            unverifiable_reason=why,
        )
        if why is not None:
            entry["passed"] = True  # not judged here: its error reaches a checked tensor
        checkpoints.append(entry)
    reach = _downstream_outputs(graph, [c["name"] for c in checkpoints if not c["passed"]])
    rounded = _reached_outputs(graph, _outputs_of(graph, {p.node for p in plan.points}))
    outputs = []
    for name in graph.outputs:
        tol, kind = bound_for(policy, graph, name, oracle[name], final.get(name))
        result = compare_output(
            name,
            evidence.machine[name],
            oracle[name],
            tol.atol,
            tol.rtol,
            tol.source,
            _allowance(oracle, name),
        )
        entry = result.to_json()
        entry.update(_allowance_record(oracle, name))
        why = unverifiable_reason(tol, oracle[name])
        producer = graph.producer(name)
        entry.update(
            producer=producer,
            op_type=graph.node(producer)["op_type"] if producer else None,
            path=final[name].path if name in final else ("fp32" if kind == "fp32" else kind),
            bound=kind,
            verifiable=why is None,
            unverifiable_reason=why,
        )
        if why is not None:
            entry["passed"] = False
        record = drift(
            evidence.machine[name],
            evidence.reference[name],
            emulated.get(name) if name in rounded else None,  # R only where casts reach
            evidence.reference_kind,
        )
        entry["drift"] = record
        broken = drift_failures(record, max_drift or {})
        entry["drift_failures"] = broken
        if broken:
            entry["passed"] = False
        # An output computed from an intermediate that is wrong is wrong, however well its
        # last segment matches the oracle fed that intermediate.
        entry["failed_upstream"] = reach.get(name, [])
        if entry["failed_upstream"]:
            entry["passed"] = False
        outputs.append(entry)
    summary = {
        "resynchronised_tensors": sorted(resync),
        "casts": len(plan.points),
        "inexact_casts": sum(1 for p in plan.points if not p.exact),
        "unemulated": [{"node": n, "reason": r} for n, r in plan.unemulated.items()],
        "probes": len({p.whole or t for t, p in plan.probes.items()}),
        "probes_read": len(probed),
        "resynchronised": len(resync),
        "statistical": sorted(t for t in [*graph.outputs, *probed] if t in final),
    }
    return outputs, checkpoints, summary


def _each(function, items: list) -> list:
    """[function(item) for item in items], two at a time where two cores are ours: each
    comparison is numpy on its own arrays, which lets the other run (`blas_dot.one_thread`
    keeps their sums of products the bits one thread at a time gives)."""
    workers = min(len(items), _workers())
    if workers < 2:
        return [function(item) for item in items]
    with one_thread() as parallel:
        if not parallel:
            return [function(item) for item in items]
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(function, items))


def _workers() -> int:
    """Threads for the comparisons: the cores this process may use, at most two, or the
    share onnxruntime was given (`ort.share_cores`: processes that share the cores)."""
    shared = ort._THREADS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(2, shared if shared is not None else (cores or 1)))


def _allowance(oracle: dict[str, np.ndarray], tensor: str) -> np.ndarray | None:
    """The allowance added to each element's bound: a kernel boundary's flips and a
    reduction's summation order, where the oracle computed them."""
    parts = [oracle.get(tensor + s) for s in (ALLOWANCE_SUFFIX, ACCUMULATION_SUFFIX)]
    # A non-finite allowance (Σ|t| past the fp32 range) is no allowance: it must never accept.
    parts = [
        np.nan_to_num(np.array(p, np.float64), copy=False, nan=0, posinf=0)
        for p in parts
        if p is not None
    ]
    if not parts:
        return None
    total = parts[0]
    for part in parts[1:]:
        total = total + part if np.shape(part) == np.shape(total) else total
    return total


def _allowance_record(oracle: dict[str, np.ndarray], tensor: str) -> dict:
    record = {}
    for suffix, key in (
        (ALLOWANCE_SUFFIX, "flip_allowance_max"),
        (ACCUMULATION_SUFFIX, "accumulation_allowance_max"),
    ):
        values = oracle.get(tensor + suffix)
        if values is not None:
            finite = np.asarray(values, np.float64).reshape(-1)
            if not _all_finite(values):
                finite = finite[np.isfinite(finite)]
            record[key] = float(finite.max()) if finite.size else 0.0
    return record


def _downstream_outputs(graph: Graph, tensors: list[str]) -> dict[str, list[str]]:
    """Graph output → the tensors of `tensors` it is computed from."""
    found: dict[str, list[str]] = {}
    outputs = set(graph.outputs)
    for start in tensors:
        seen, stack = set(), [start]
        while stack:
            tensor = stack.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if tensor in outputs:
                found.setdefault(tensor, []).append(start)
            for node, _ in graph.consumers(tensor):
                stack.extend(t for t in graph.node(node)["outputs"] if t)
    return found


def _reached_outputs(graph: Graph, tensors: list[str]) -> set[str]:
    """The graph outputs computed from any tensor of `tensors`: the keys of
    `_downstream_outputs`, in one walk whatever their number (every tensor of a 20,000-node
    chain under --auto-cast all is rounded)."""
    outputs, seen, stack = set(graph.outputs), set(), list(tensors)
    found = set()
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in outputs:
            found.add(tensor)
        for node, _ in graph.consumers(tensor):
            stack.extend(t for t in graph.node(node)["outputs"] if t)
    return found


def _outputs_of(graph: Graph, nodes: set[str]) -> list[str]:
    return [t for node in nodes if node in graph.nx for t in graph.node(node)["outputs"] if t]


def _record(result: OutputComparison) -> dict:
    keys = (
        "name",
        "shape",
        "passed",
        "max_abs_err",
        "max_rel_err",
        "cosine",
        "atol",
        "rtol",
        "mismatches",
        "size",
        "min_atol",
        "min_rtol",
        "worst",
        "tolerance_source",
        "shape_error",
    )
    doc = result.to_json()
    return {key: doc[key] for key in keys}
