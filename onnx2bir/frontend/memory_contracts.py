"""Byte-size contracts: every tensor fits the modelled device, and validate fits the host.

`check_tensor_sizes` (at import, every command) refuses a model with a tensor larger than the
modelled device DRAM, `DEVICE_DRAM_BYTES`; `check_validate_fits` (validate, before any input
is made) refuses a run whose estimated peak would not fit the memory available. Both run before
anything of that size is allocated. Figures and reasons: `docs/input_contracts.md#memory`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import onnx

from onnx2bir.errors import UserError

# One NeuronCore's share of a Trainium (trn1) chip: 32 GiB of HBM for two NeuronCores.
DEVICE_DRAM_BYTES = 16 << 30


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.3g} GiB"


def element_bytes(elem_type: int) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 1  # string and other odd types: refused as unsupported later; size unknown


def tensor_bytes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], weights) -> dict:
    """{tensor: bytes} for every tensor of `model` with a static shape."""
    types = {}
    graph = model.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    sizes = {}
    for name, shape in shapes.items():
        if name in weights:
            sizes[name] = int(np.asarray(weights[name]).nbytes)
            continue
        sizes[name] = math.prod(int(d) for d in shape) * element_bytes(types.get(name, 1))
    return sizes


def check_tensor_sizes(sizes: dict[str, int]) -> None:
    for name, size in sizes.items():
        if size > DEVICE_DRAM_BYTES:
            raise UserError(
                f"tensor {name!r} needs {_gib(size)}, more than the modelled device DRAM "
                f"({_gib(DEVICE_DRAM_BYTES)}, one NeuronCore's share of a trn1 chip)"
            )


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def available_memory_bytes() -> int | None:
    """The memory the kernel says a new process may take now without swapping
    (/proc/meminfo's MemAvailable), else the host's physical memory."""
    try:
        with open("/proc/meminfo") as info:
            lines = [line.split() for line in info if line.startswith("MemAvailable:")]
    except OSError:  # no /proc (not Linux)
        lines = []
    if lines and len(lines[0]) >= 2 and lines[0][1].isdigit():
        return int(lines[0][1]) * 1024
    return host_memory_bytes()


# The comparison of one tensor works on about a dozen float64 arrays of its size at once (both
# sides, the errors, the relative errors, the bounds, the positions that differ).
COMPARISON_BYTES_PER_ELEMENT = 12 * 8


@dataclass(frozen=True)
class PeakEstimate:
    """What validate holds at its peak, by part (docs/input_contracts.md#memory)."""

    weights: int  # the model's constants as the compiler holds them
    machine_constants: int  # the machine's copies of them in another dtype or layout
    intermediates: int  # every tensor computed at run time, once
    reference: int  # plain onnxruntime: its copy of the weights and its intermediates
    oracle: int  # the emulating oracle: the weights' roundings, its intermediates, the probes
    comparison: int  # the float64 working arrays of the largest comparison

    @property
    def total(self) -> int:
        held = self.weights + self.machine_constants
        return held + max(self.intermediates, self.reference, self.oracle + self.comparison)

    def describe(self) -> str:
        return (
            f"weights {_gib(self.weights)}, the machine's copies {_gib(self.machine_constants)}, "
            f"plain onnxruntime {_gib(self.reference)}, the emulating oracle "
            f"{_gib(self.oracle)}, the comparison {_gib(self.comparison)}"
        )


def initializer_bytes(model: str | os.PathLike | onnx.ModelProto) -> int:
    """The bytes of a model's initializers, read from its graph alone (external data is not
    loaded): what onnxruntime loads of it. 0 for a file that cannot be read as a model: the
    import then says why."""
    if not isinstance(model, onnx.ModelProto):
        try:
            model = onnx.load(str(model), load_external_data=False)
        except Exception:  # any unreadable file: the import's own error names the problem
            return 0
    return sum(
        math.prod(int(d) for d in init.dims) * element_bytes(init.data_type)
        for init in model.graph.initializer
    )


def estimate_validate_peak(graph, probes, constants, file_weights: int) -> PeakEstimate:
    """In: the compiler's graph (`onnx2bir.graph.Graph`), the probed tensors, the machine's
    constants by name, the bytes of the weights onnxruntime loads from the model file. Out:
    the estimate of validate's peak, part by part."""
    sizes = {
        name: math.prod(int(d) for d in info.shape) * np.dtype(info.dtype.numpy).itemsize
        for name, info in graph.tensors.items()
    }
    held = {name: info.const for name, info in graph.tensors.items() if info.is_const}
    weights = sum(np.asarray(value).nbytes for value in held.values() if value is not None)
    copies, rounded = 0, 0
    for name, value in constants.items():
        mine = held.get(name)
        if mine is not None and np.shares_memory(np.asarray(mine), value):
            continue
        copies += value.nbytes
        if mine is not None and value.dtype.itemsize < np.asarray(mine).dtype.itemsize:
            rounded += np.asarray(mine).nbytes  # the oracle's fp32 copy of a narrowed weight
    intermediates = sum(size for name, size in sizes.items() if name not in held)
    probed = sum(sizes.get(name, 0) for name in probes)
    compared = [*probes, *graph.outputs]
    largest = max((sizes.get(name, 0) // 4 for name in compared), default=0)
    return PeakEstimate(
        weights=weights,
        machine_constants=copies,
        intermediates=intermediates,
        reference=file_weights + intermediates,
        # the machine's probe values, the plain and the resynchronised runs', the allowances
        oracle=rounded + intermediates + 4 * probed,
        comparison=COMPARISON_BYTES_PER_ELEMENT * largest,
    )


# Importing and compiling a model holds its weights about twice (the arrays read from the file
# and the machine's copies; 2.1x measured on a Qwen2-0.5B-sized decoder).
COMPILE_WEIGHT_COPIES = 2


def check_weights_fit(file_weights: int, limit: int | None = None) -> None:
    """Refuse, before the model is even read whole, a validate whose compile alone would not
    fit `limit` (default: the memory available now)."""
    _refuse_over(COMPILE_WEIGHT_COPIES * file_weights, limit, file_weights, "the compile alone")


def _refuse_over(needed: int, limit: int | None, weights: int, what: str) -> None:
    given = limit is not None
    limit = limit if given else available_memory_bytes()
    if limit is None or needed <= limit:
        return
    where = "--memory-limit" if given else "the memory available now"
    pieces = max(2, math.ceil(weights / max(1, limit // 2)))
    raise UserError(
        f"validate would need about {_gib(needed)} at its peak ({what}), more than "
        f"{_gib(limit)} ({where}); validate the model in pieces instead: --segments {pieces} "
        "runs each piece in its own process, holding about its share of the weights, and "
        f"--segment-memory {limit / (1 << 30):.3g}GiB --jobs 1 picks as many pieces as it "
        "takes for each to fit, run one at a time "
        "(docs/validation.md#segments)"
    )


def check_validate_fits(
    graph, probes=(), constants=None, file_weights: int = 0, limit: int | None = None
) -> PeakEstimate:
    """Refuse a validate run of `graph` whose estimated peak exceeds `limit` (default: the
    memory available now), before any input or machine array is made; `probes`: the
    intermediates the run reads from the machine, `constants` the machine's (the program's
    `module.constants`). The estimate is returned."""
    estimate = estimate_validate_peak(graph, tuple(probes), constants or {}, file_weights)
    _refuse_over(estimate.total, limit, estimate.weights, estimate.describe())
    return estimate
