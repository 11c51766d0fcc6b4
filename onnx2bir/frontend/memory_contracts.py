"""Byte-size contracts: every tensor fits the modelled device, and validate fits the host.

`check_tensor_sizes` (at import, every command) refuses a model with a tensor larger than the
modelled device DRAM, `DEVICE_DRAM_BYTES`; `check_host_memory` (validate, before any input is
made) refuses a run whose arrays would not fit the host's physical memory. Both run before
anything of that size is allocated. Figures and reasons: `docs/input_contracts.md#memory`.
"""

from __future__ import annotations

import math
import os

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


def validate_host_bytes(
    sizes: dict[str, int], inputs: list[str], outputs: list[str], probes: tuple[str, ...] = ()
) -> int:
    """About what validate holds at once: the machine's DRAM (every tensor, once),
    onnxruntime's copies of the inputs and outputs, the comparison's float64 copies of both
    sides of each output (twice the bytes of an fp32 output, each), and for each probed
    intermediate the machine's copy, the emulating oracle's value and its allowance."""
    machine = sum(sizes.values())
    oracle = sum(sizes.get(name, 0) for name in [*inputs, *outputs])
    comparison = 4 * sum(sizes.get(name, 0) for name in outputs)
    probed = 3 * sum(sizes.get(name, 0) for name in probes)
    return machine + oracle + comparison + probed


def check_host_memory(needed: int, available: int | None = None) -> None:
    available = host_memory_bytes() if available is None else available
    if available is not None and needed > available:
        raise UserError(
            f"validate would hold about {_gib(needed)} of arrays; this host has "
            f"{_gib(available)} of memory"
        )


def check_validate_fits(graph, probes=()) -> None:
    """Refuse a validate run of `graph` (an `onnx2bir.graph.Graph`) that the host cannot hold;
    `probes`: the intermediates the run reads from the machine (the cast plan's)."""
    sizes = {
        name: math.prod(int(d) for d in info.shape) * np.dtype(info.dtype.numpy).itemsize
        for name, info in graph.tensors.items()
    }
    check_host_memory(validate_host_bytes(sizes, graph.inputs, graph.outputs, tuple(probes)))
