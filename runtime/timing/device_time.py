"""Event-driven device-time simulation of a BIR function (docs/device_time.md).

In: a Function and a `CostTable`. Out: `Simulation`, one `Slice` per simulated instruction
instance (stream, start, end, the slice that made it wait) and per-stream, per-node totals.

Streams: each compute engine (PE, ACT, DVE, POOL) and each DMA queue runs its instructions in
program order. An instruction starts when its stream is free and every dependency (`deps`) has
finished; a dependency from another stream is a semaphore and adds its latency (docs/device_time.md
#semaphores), during which the waiting stream counts as busy (it is stalled on the semaphore).
A DMA's data phase also takes the core's shared DMA bandwidth (one resource for all queues); a
transfer that finds it taken stalls its queue. Likewise DVE and POOL share SBUF's port, and DVE
and ACT share PSUM's (docs/device_time.md#on-chip-ports): an instruction that needs a port
another engine holds waits for it. Every slice therefore begins where another slice (its
stream's previous one, a dependency, or a shared resource's previous user) ends, so the
estimate never exceeds the sum of all busy time.

Loops: the first `table.loop_warmup` trips are simulated one by one (a dependency on a body
instruction later in program order reads the previous trip; a loop-carried edge reads the
source's last instance before the current trip of the loop that carries it); the remaining
trips follow in steady state, each one iteration interval later (the last simulated trip's end
minus the one before, at least the busiest stream's work per trip and at most all streams'
work). The last simulated trip stands for the others: its slices and the state they leave are
moved to the last trip's time, and its totals are weighted by the number of trips it stands for.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from onnx2bir.bir.enums import Engine, MemoryType, Opcode
from onnx2bir.bir.ir import BasicBlock, Function, Instruction, Loop
from onnx2bir.runtime.timing.cost import CostTable, instruction_cost, matmul_flops

SHARED_DMA = "DMA bandwidth"  # the per-core shared DMA resource (not a stream)
SBUF_PORT = "SBUF port"  # DVE and POOL cannot access SBUF at the same time
PSUM_PORT = "PSUM port"  # DVE and ACT cannot access PSUM at the same time


def stream_of(ins: Instruction) -> str:
    """The stream an instruction runs on: its engine, or "DMA qN" for a DMA queue."""
    if ins.engine is Engine.DMA:
        return f"DMA q{ins.attrs.get('queue', 0)}"
    return ins.engine.value


@dataclass(slots=True)
class Slice:
    """One simulated instance of one instruction; `cause` is the slice it waited for."""

    ins: Instruction
    stream: str
    start: float
    end: float
    cause: int  # index of the slice whose end decided `start`, -1 at time zero
    weight: int  # how many dynamic instances this slice stands for
    dma_bytes: int
    flops: int
    sources: tuple[int, ...] = ()  # the slices of the dependencies it waited for


@dataclass(frozen=True, slots=True)
class Repeat:
    """Slices [first, stop) are a loop's last simulated trip and stand for `extra` more trips,
    each `interval` seconds apart; their times are those of the loop's last trip."""

    first: int
    stop: int
    extra: int
    interval: float


@dataclass
class Simulation:
    slices: list[Slice] = field(default_factory=list)
    repeats: list[Repeat] = field(default_factory=list)
    busy: dict[str, float] = field(default_factory=dict)  # seconds per stream
    counts: dict[Engine, int] = field(default_factory=dict)
    cycles: dict[Engine, float] = field(default_factory=dict)
    node_seconds: dict[str, float] = field(default_factory=dict)  # busy seconds per ONNX node
    dma_bytes: int = 0
    compulsory_bytes: int = 0  # sizes of the weights, constants, inputs, outputs DMAs touch
    compulsory_locations: set[str] = field(default_factory=set)
    # bytes DMAs read out of each weight and constant (payload), every loop trip counted
    payload_bytes: dict[str, int] = field(default_factory=dict)
    flops: int = 0
    total_seconds: float = 0.0


_COMPULSORY_KINDS = {
    "ExternalInput",
    "ExternalInputParameter",
    "ExternalOutput",
    "ExternalOutputParameter",
    "Const",
}
_PAYLOAD_KINDS = {"ExternalInputParameter", "Const"}


class _Timeline:
    """When each user held one shared resource: intervals that never overlap, sorted by start
    (so by end too), as parallel lists (start, end, slice index). A new user takes the first
    gap at or after it is ready, whatever order the simulation meets the users in."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.owners: list[int] = []

    def first_gap(self, earliest: float, duration: float) -> tuple[float, int]:
        """(start of the first gap of `duration` at or after `earliest`, slice of the user it
        waits behind or -1)."""
        begin, blocker = earliest, -1
        j = bisect.bisect_right(self.ends, earliest)
        while j < len(self.starts):
            if self.starts[j] >= begin + duration:
                break
            if self.ends[j] > begin:
                begin, blocker = self.ends[j], self.owners[j]
            j += 1
        return begin, blocker

    def reserve(self, begin: float, duration: float, owner: int) -> None:
        position = bisect.bisect_left(self.starts, begin)
        self.starts.insert(position, begin)
        self.ends.insert(position, begin + duration)
        self.owners.insert(position, owner)

    def shift(self, first: int, by: float) -> None:
        """Move the intervals of slices [first:] by `by` seconds."""
        moved = sorted(
            (start + by, end + by, owner) if owner >= first else (start, end, owner)
            for start, end, owner in zip(self.starts, self.ends, self.owners, strict=True)
        )
        self.starts = [m[0] for m in moved]
        self.ends = [m[1] for m in moved]
        self.owners = [m[2] for m in moved]


def ports_of(ins: Instruction, function: Function) -> tuple[str, ...]:
    """The shared on-chip ports an instruction holds while it runs: SBUF's for DVE and POOL
    touching SBUF, PSUM's for DVE and ACT touching PSUM (docs/device_time.md#on-chip-ports)."""
    if ins.engine not in (Engine.DVE, Engine.POOL, Engine.ACT):
        return ()
    locations = function.memory_locations
    memories = {
        locations[ap.loc].memory
        for ap in (*ins.srcs.values(), ins.dst)
        if ap is not None and ap.loc in locations
    }
    ports = []
    if ins.engine in (Engine.DVE, Engine.POOL) and MemoryType.SB in memories:
        ports.append(SBUF_PORT)
    if ins.engine in (Engine.DVE, Engine.ACT) and MemoryType.PSUM in memories:
        ports.append(PSUM_PORT)
    return tuple(ports)


class _Simulator:
    def __init__(self, function: Function, table: CostTable):
        self.function, self.table = function, table
        self.sim = Simulation()
        self.free: dict[str, tuple[float, int]] = {}  # stream -> (free at, last slice)
        self.finish: dict[int, tuple[float, int, str]] = {}  # ins id -> (end, slice, stream)
        # The core's shared DMA bandwidth and the two on-chip ports.
        self.shared = {name: _Timeline() for name in (SHARED_DMA, SBUF_PORT, PSUM_PORT)}
        self.before: dict[int, tuple[float, int, str]] = {}  # the instance before that one
        # Recent instances of each instruction (oldest first), and the slice at which the
        # current trip of each loop began: a carried edge reads the source's last instance
        # before the current trip of the loop that carries it (docs/buffers.md#device-time).
        self.recent: dict[int, list[tuple[float, int, str]]] = {}
        self.trip_start: dict[str, int] = {}
        # ins id -> (cycles, seconds, DMA bytes, FLOPs, compulsory locations, ports held)
        self.cost_cache: dict[int, tuple[float, float, int, int, tuple[str, ...], tuple]] = {}
        self.payload_reads: dict[int, tuple] = {}  # (payload, bytes) a DMA reads

    def _cost(self, ins: Instruction) -> tuple[float, float, int, int, tuple[str, ...], tuple]:
        cached = self.cost_cache.get(id(ins))
        if cached is None:
            cycles, seconds, moved = instruction_cost(ins, self.function, self.table)
            compulsory: tuple[str, ...] = ()
            self.payload_reads[id(ins)] = ()
            if ins.engine is Engine.DMA:
                locations = self.function.memory_locations
                self.payload_reads[id(ins)] = tuple(
                    (ap.loc, ap.num_elements * locations[ap.loc].dtype.itemsize)
                    for ap in ins.srcs.values()
                    if ap is not None
                    and ap.loc in locations
                    and locations[ap.loc].kind.value in _PAYLOAD_KINDS
                )
                # An indirect DMA reads the rows it gathers, not its whole table.
                touched = [ins.dst, *(ap for r, ap in ins.srcs.items() if r != "in")]
                if ins.opcode is not Opcode.DMA_GATHER:
                    touched = [*ins.srcs.values(), ins.dst]
                compulsory = tuple(
                    ap.loc
                    for ap in touched
                    if ap is not None
                    and ap.loc in locations
                    and locations[ap.loc].kind.value in _COMPULSORY_KINDS
                )
            flops = matmul_flops(ins) if ins.engine is Engine.PE else 0
            ports = ports_of(ins, self.function) if self.table.shared_ports else ()
            cached = (cycles, seconds, moved, flops, compulsory, ports)
            self.cost_cache[id(ins)] = cached
        return cached

    def block(self, block: BasicBlock, weight: int) -> None:
        for item in block.items:
            if isinstance(item, Loop):
                self.loop(item, weight)
            else:
                self.instruction(item, weight)

    def instruction(self, ins: Instruction, weight: int) -> None:
        cycles, seconds, moved, flops, compulsory, ports = self._cost(ins)
        table, stream = self.table, stream_of(ins)
        free, cause = self.free.get(stream, (0.0, -1))
        wait_from, ready = free, free
        sources = []
        for dep in ins.deps:
            done = self.finish.get(dep.source)
            carrier = getattr(dep, "carried_by", None)
            if carrier is not None and carrier in self.trip_start:
                # The previous trip of the carrying loop (every distance is read as one trip):
                # the source's last instance before that loop's current trip began.
                done = self._before_trip(dep.source, self.trip_start[carrier])
            elif getattr(dep, "distance", 0) and dep.source <= ins.id:
                # A loop-carried edge to an instruction this trip already ran: the previous
                # trip's instance (every distance is read as one trip).
                done = self.before.get(dep.source)
            if done is None:  # a later instruction never run yet: nothing to wait for
                continue
            end, source_slice, source_stream = done
            sources.append(source_slice)
            latency = 0.0 if source_stream == stream else table.semaphore_seconds(ins.engine)
            if end > wait_from:
                wait_from, cause = end, source_slice
            ready = max(ready, end + latency)
        start = wait_from
        end = ready + seconds
        if ports:
            begin, blocker = self._first_common_gap(ports, ready, seconds)
            for port in ports:
                self.shared[port].reserve(begin, seconds, len(self.sim.slices))
            if begin > ready:
                end = begin + seconds
                cause = blocker  # waited for another engine's use of the port
        if ins.engine is Engine.DMA and moved:
            # The core's DMA bandwidth drains every queue's bytes: this transfer's data, which
            # may begin after the issue cost, takes bytes / core bandwidth of it, in the first
            # gap other transfers leave (whatever order the simulation met them in).
            data_start = ready + table.dma_issue_s
            held, blocker = self._hold_bandwidth(data_start, moved / table.dma_core_bytes_per_s)
            if held > end:
                end = held
                if blocker >= 0:
                    cause = blocker  # stalled behind other queues' transfers
        index = len(self.sim.slices)
        self.sim.slices.append(
            Slice(
                ins,
                stream,
                start,
                end,
                cause,
                weight,
                moved * weight,
                flops * weight,
                tuple(sources),
            )
        )
        self.free[stream] = (end, index)
        if ins.id in self.finish:
            self.before[ins.id] = self.finish[ins.id]
        self.finish[ins.id] = (end, index, stream)
        recent = self.recent.setdefault(ins.id, [])
        recent.append((end, index, stream))
        if len(recent) > _RECENT:
            del recent[0]
        sim = self.sim
        busy = (end - start) * weight
        sim.busy[stream] = sim.busy.get(stream, 0.0) + busy
        sim.counts[ins.engine] = sim.counts.get(ins.engine, 0) + weight
        sim.cycles[ins.engine] = sim.cycles.get(ins.engine, 0.0) + cycles * weight
        node = ins.origin.node or "(no node)"
        sim.node_seconds[node] = sim.node_seconds.get(node, 0.0) + busy
        sim.dma_bytes += moved * weight
        for name, size in self.payload_reads[id(ins)]:
            sim.payload_bytes[name] = sim.payload_bytes.get(name, 0) + size * weight
        for name in compulsory:
            if name not in sim.compulsory_locations:
                sim.compulsory_locations.add(name)
                location = self.function.memory_locations[name]
                sim.compulsory_bytes += math.prod(location.shape) * location.dtype.itemsize
        sim.flops += flops * weight
        sim.total_seconds = max(sim.total_seconds, end)

    def _before_trip(self, source: int, trip_start: int) -> tuple[float, int, str] | None:
        """The last instance of `source` that began before slice `trip_start`."""
        for instance in reversed(self.recent.get(source, ())):
            if instance[1] < trip_start:
                return instance
        return None

    def _hold_bandwidth(self, earliest: float, duration: float) -> tuple[float, int]:
        """Reserve the shared bandwidth for `duration` from the first gap at or after
        `earliest`; (end of the reservation, slice of the transfer it waited behind or -1)."""
        bandwidth = self.shared[SHARED_DMA]
        begin, blocker = bandwidth.first_gap(earliest, duration)
        bandwidth.reserve(begin, duration, len(self.sim.slices))
        return begin + duration, blocker

    def _first_common_gap(
        self, ports: tuple[str, ...], earliest: float, duration: float
    ) -> tuple[float, int]:
        """The first time at or after `earliest` at which every port in `ports` is free for
        `duration`, and the slice it waited behind (-1: none)."""
        begin, blocker = earliest, -1
        while True:
            moved = False
            for port in ports:
                gap, owner = self.shared[port].first_gap(begin, duration)
                if gap > begin:
                    begin, blocker, moved = gap, owner, True
            if not moved:
                return begin, blocker

    def loop(self, loop: Loop, weight: int) -> None:
        trips = loop.trip_count
        if trips <= 0 or not loop.body.items:
            return
        simulated = min(trips, self.table.loop_warmup)
        ends: list[float] = []
        first = len(self.sim.slices)
        for trip in range(simulated):
            first = len(self.sim.slices)
            self.trip_start[loop.axis] = first
            last = trip == simulated - 1
            self.block(loop.body, weight * (trips - simulated + 1) if last else weight)
            ends.append(max((s.end for s in self.sim.slices[first:]), default=0.0))
        extra = trips - simulated
        if extra <= 0:
            return
        slices = self.sim.slices[first:]
        per_stream: dict[str, float] = {}
        last_weight = weight * (extra + 1)  # the weight the last trip's own slices carry
        for s in slices:  # slices of nested loops stand for more trips: weight / last_weight
            work = (s.end - s.start) * s.weight / last_weight
            per_stream[s.stream] = per_stream.get(s.stream, 0.0) + work
        # Between the busiest stream's work per trip and all streams' work per trip.
        delta = ends[-1] - ends[-2] if len(ends) > 1 else 0.0
        interval = max(min(delta, sum(per_stream.values())), max(per_stream.values()))
        self.shift(first, extra * interval)
        self.sim.repeats.append(Repeat(first, len(self.sim.slices), extra, interval))

    def shift(self, first: int, by: float) -> None:
        """Move slices [first:] and the state they left by `by` seconds."""
        if by <= 0:
            return
        slices = self.sim.slices
        for s in slices[first:]:
            s.start += by
            s.end += by
        for stream, (free, index) in list(self.free.items()):
            if index >= first:
                self.free[stream] = (free + by, index)
        for table in (self.finish, self.before):
            for ins_id, (end, index, stream) in list(table.items()):
                if index >= first:
                    table[ins_id] = (end + by, index, stream)
        for recent in self.recent.values():
            for i, (end, index, stream) in enumerate(recent):
                if index >= first:
                    recent[i] = (end + by, index, stream)
        for timeline in self.shared.values():
            timeline.shift(first, by)
        ends = [s.end for s in slices[first:]]
        self.sim.total_seconds = max(self.sim.total_seconds, *ends)


_RECENT = 16  # instances kept per instruction for carried edges (inner trips per outer trip)


def simulate(function: Function, table: CostTable) -> Simulation:
    """Simulate every stream of function (module docstring)."""
    simulator = _Simulator(function, table)
    simulator.block(function.entry, 1)
    return simulator.sim
