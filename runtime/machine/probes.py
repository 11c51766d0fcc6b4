"""Reading the machine's own value of a tensor while the program runs (the verdict's probes).

In: a BIR function and the cast plan's probes (tensor → location, its producer, its SBUF home
layout). Out: the `before` hooks of `interpreter.execute` that copy each probed tensor out of
the machine, and the copies (`ProbeReader.values`, float32 in the tensor's shape).

A tensor is read once, just before the first instruction that reads its location and does not
belong to its producer (in program order its producer is done then, and no later node has
reused its bytes yet). A DRAM location is the tensor's flat elements; an SBUF home holds rows
of `inner` elements dealt round the partitions, row r in partition r mod 128 at free offset
(r div 128)·inner (docs/memory_planner.md#layout), or, in groups of `group` rows, each group
from a partition chunk of its own (docs/memory_planner.md#groups). A probe whose location
nothing reads (a loop that runs no trip) is simply not read: the oracle then rounds its own
value.
"""

from __future__ import annotations

import numpy as np

from onnx2bir.bir.cast_plan import Probe
from onnx2bir.bir.enums import MemoryType
from onnx2bir.bir.ir import Function, Instruction
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.runtime.machine.machine import Machine


def owned_by(origin: str, node: str) -> bool:
    """Whether an instruction origin belongs to compiled node `node` (or a helper of it)."""
    return origin == node or origin.startswith(node + "/")


class ProbeReader:
    """The hooks that copy probed tensors out of the machine (module docstring)."""

    def __init__(self, function: Function, probes: dict[str, Probe], shapes: dict[str, tuple]):
        self.function = function
        self.shapes = shapes
        self.probes = probes
        self.values: dict[str, np.ndarray] = {}
        # A tensor the program computes one image at a time: its images' probes, in order.
        self.images: dict[str, list[Probe]] = {}
        for probe in sorted(probes.values(), key=lambda p: p.part or 0):
            if probe.whole is not None:
                self.images.setdefault(probe.whole, []).append(probe)
        self._read_images: dict[str, np.ndarray] = {}
        by_location: dict[str, list[Probe]] = {}
        for probe in probes.values():
            if probe.location in function.memory_locations:
                by_location.setdefault(probe.location, []).append(probe)
        self.hooks: dict[Instruction, list[Probe]] = {}
        pending = dict(by_location)
        for ins in function.instructions():
            if not pending:
                break
            for ap, is_write in ins.accesses():
                waiting = pending.get(ap.loc)
                if is_write or not waiting:
                    continue
                ready = [p for p in waiting if not owned_by(ins.origin.node, p.producer)]
                if ready:
                    self.hooks.setdefault(ins, []).extend(ready)
                    rest = [p for p in waiting if p not in ready]
                    if rest:
                        pending[ap.loc] = rest
                    else:
                        del pending[ap.loc]

    def _probe_of(self, tensor: str) -> Probe:
        return self.probes[tensor] if tensor in self.probes else self.images[tensor][0]

    def location(self, tensor: str) -> str:
        return self._probe_of(tensor).location

    def stored(self) -> dict:
        """The dtype each read tensor's location holds (narrower than fp32 when the program
        stores it cast)."""
        locations = self.function.memory_locations
        return {t: locations[self._probe_of(t).location].dtype for t in self.values}

    def before(self) -> dict:
        """`interpreter.execute`'s `before` argument."""
        return {ins: self._read for ins in self.hooks}

    def _read(self, machine: Machine, ins: Instruction, _loop_values) -> None:
        for probe in self.hooks.get(ins, ()):
            if probe.whole is not None:
                self._read_image(machine, probe)
            elif probe.tensor not in self.values:
                self.values[probe.tensor] = self.read(machine, probe)

    def _read_image(self, machine: Machine, probe: Probe) -> None:
        """Keep one image; once every image of the tensor is read, the whole tensor."""
        if probe.tensor not in self._read_images:
            self._read_images[probe.tensor] = self.read(machine, probe)
        images = self.images[probe.whole]
        if all(p.tensor in self._read_images for p in images):
            self.values[probe.whole] = np.concatenate(
                [self._read_images.pop(p.tensor) for p in images], axis=0
            )

    def read(self, machine: Machine, probe: Probe) -> np.ndarray:
        """The tensor as the machine holds it now, as float32 in its shape."""
        if probe.whole is not None:  # a group of images of the whole tensor
            shape = (probe.images or 1, *self.shapes[probe.whole][1:])
        else:
            shape = self.shapes[probe.tensor]
        count = int(np.prod(shape, dtype=np.int64))
        view = machine.location_view(probe.location)
        loc = self.function.memory_locations[probe.location]
        if loc.memory is MemoryType.DRAM or probe.inner is None:
            flat = view.reshape(-1)[:count]
        else:
            inner = probe.inner
            rows = count // inner
            group = probe.group or rows
            per_group = -(-group // NUM_PARTITIONS)  # chunks of one group
            chunks = rows // group * per_group
            partitions = view.shape[0]
            laid = np.zeros((chunks * NUM_PARTITIONS, inner), view.dtype)
            blocks = view[:, : chunks * inner].reshape(partitions, chunks, inner)
            laid.reshape(chunks, NUM_PARTITIONS, inner)[:, :partitions] = blocks.transpose(1, 0, 2)
            grouped = laid.reshape(rows // group, per_group * NUM_PARTITIONS, inner)
            flat = grouped[:, :group].reshape(-1)
        return np.asarray(flat, dtype=np.float32).reshape(shape).copy()


def probe_shapes(probes: dict[str, Probe], graph) -> dict[str, tuple]:
    """The model's shape of every probed tensor (of the whole tensor for an image's probe),
    from `graph`, the model's graph as imported."""
    return {(p.whole or t): tuple(graph.tensors[p.whole or t].shape) for t, p in probes.items()}
