"""The on-chip memory planner (docs/memory_planner.md).

In: the BIR of a first code-generation pass in which every tensor lives in DRAM, and what
its arenas needed (`ArenaNeeds`, codegen/arena.py): the SBUF arena each node used (bytes per
partition, keyed by the node's position in the entry block), the bytes reserved below the
arenas (the identity tile) and the weights nodes load whole. Out: a `MemoryPlan` saying, for
every Internal DRAM tensor (graph intermediates and node scratch), whether it lives in SBUF
between its producer and its last consumer, where, and why not when it does not.

The rule, per tensor:
- pattern: an Internal DRAM location (not a weight, constant, graph input or output);
- check: every instruction touching it is a DmaCopy (not inside a runtime loop) whose
  access `residency.plan_copy` can rewrite onto an SBUF home of some row length (the
  canonical one first, then each partition stride its accesses use; of those that serve,
  the one leaving the fewest on-chip copies to DMAs); copies between two
  resident tensors must cut at the same partition chunks; and the home fits:
  from its first to its last node, no other live home overlaps it and it stays below that
  node's arena, which sits at the top of SBUF; once the homes are placed, every other node's
  arena moves below its neighbours' where the homes leave room (`_alternate_arenas`);
- rewrite (the second code-generation pass, `BirCodeGen(memory_plan=...)`): the tensor is an
  SBUF location at its address; a DmaCopy between two on-chip operands becomes a TensorCopy,
  and a DmaCopy with one DRAM side keeps its DMA with the on-chip side rewritten.
Each refusal is a reason naming the node and the rule; `report` lists them.

A second rule, for weights (docs/memory_planner.md#shared-weights):
- pattern: one constant loaded whole, the same way (`WeightRequest.key`), by several nodes —
  the clones of a node that `SplitBatch` runs an image at a time;
- check: one SBUF home for it fits, from its first reader to its last, in the room the
  tensor homes and the arenas leave;
- rewrite: the first reader loads it into that home, the others read it there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from onnx2bir.bir.dtypes import on_chip
from onnx2bir.bir.enums import PAYLOAD_KINDS, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    BasicBlock,
    DoWhile,
    DynamicLoop,
    Function,
    Instruction,
    MemoryLocation,
)
from onnx2bir.bir.opcodes import SBUF_BYTES_PER_PARTITION
from onnx2bir.codegen.residency import (
    AxisRanges,
    Home,
    canonical_inner,
    image_group,
    plan_copy,
    preferred_group,
)
from onnx2bir.graph import Graph


@dataclass(frozen=True, slots=True)
class Access:
    """One DmaCopy touching a candidate tensor, with the loop ranges around it."""

    inst: Instruction
    item: int  # position of its node's scope in the entry block
    ranges: tuple[tuple[str, int, int], ...]

    def axis_ranges(self) -> AxisRanges:
        return {axis: (first, last) for axis, first, last in self.ranges}


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one tensor lives, and why."""

    tensor: str
    resident: bool
    reason: str
    bytes_per_partition: int = 0
    first_item: int = 0
    last_item: int = 0


@dataclass(frozen=True, slots=True)
class WeightRequest:
    """A node's whole copy of a constant, as the code generator asked for it
    (`Arena.weight_tile`): `key` names the constant and the way it is loaded, so two
    requests with one key fill their tiles with the same bytes."""

    item: int  # position of the node's scope in the entry block
    key: tuple
    partitions: int
    nbytes: int  # bytes per partition


@dataclass
class ArenaNeeds:
    """What a code-generation pass allocated (`Arena.needs`), by the position of each node's
    scope in the entry block: the planner's input, and the second pass's check on the first."""

    sbuf: dict[int, int] = field(default_factory=dict)  # bytes per partition
    psum: dict[int, int] = field(default_factory=dict)  # bytes per partition
    nodes: dict[int, str] = field(default_factory=dict)  # the node of each item
    reserved: int = 0  # SBUF bytes per partition below every arena
    weights: list[WeightRequest] = field(default_factory=list)  # every `weight_tile`


@dataclass(frozen=True, slots=True)
class WeightHome:
    """The SBUF home of a constant shared by nodes: loaded by `first`, read by every item."""

    name: str
    key: tuple
    address: int
    nbytes: int
    items: tuple[int, ...]

    @property
    def first(self) -> int:
        return self.items[0]

    @property
    def last(self) -> int:
        return self.items[-1]


@dataclass
class MemoryPlan:
    homes: dict[str, Home] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    weight_homes: list[WeightHome] = field(default_factory=list)
    # shared constants some of whose readers load their own copy, and why
    weight_refusals: dict[tuple, str] = field(default_factory=dict)
    arena_need: dict[int, int] = field(default_factory=dict)
    reserved: int = 0
    allocation_order: str = ""  # the ALLOCATION_ORDERS entry the homes were placed in
    sbuf_high_water: int = 0  # bytes per partition in use at the busiest node
    psum_high_water: int = 0  # set by the second pass
    lowered: dict[int, int] = field(default_factory=dict)  # item -> its arena's start, below

    def arena_base(self, item: int) -> int:
        """Where node `item`'s arena starts: the top of SBUF minus what the node needs, or,
        for a node whose arena was put below its neighbours' (`_alternate_arenas`), lower."""
        return self.lowered.get(item, SBUF_BYTES_PER_PARTITION - self.arena_need.get(item, 0))

    def weight_home(self, key: tuple, item: int) -> WeightHome | None:
        """The home node `item` reads the constant `key` from, if any."""
        for home in self.weight_homes:
            if home.key == key and item in home.items:
                return home
        return None

    def counts(self) -> Counter:
        return Counter("resident" if d.resident else "dram" for d in self.decisions.values())


def _walk(
    block: BasicBlock,
    item: int,
    ranges: dict[str, tuple[int, int]],
    dynamic: bool,
    visit,
) -> None:
    for entry in block.items:
        if isinstance(entry, Instruction):
            visit(entry, item, ranges, dynamic)
            continue
        inner = dict(ranges)
        inner[entry.axis] = (entry.start, entry.last_value)
        runtime = dynamic or isinstance(entry, DynamicLoop | DoWhile)
        _walk(entry.body, item, inner, runtime, visit)


def _candidates(fn: Function) -> dict[str, MemoryLocation]:
    return {
        name: loc
        for name, loc in fn.memory_locations.items()
        if loc.memory is MemoryType.DRAM and loc.kind is MemoryKind.INTERNAL
    }


def _collect(fn: Function, candidates: dict[str, MemoryLocation]):
    """The DmaCopy accesses of each candidate, and a reason for those touched otherwise."""
    accesses: dict[str, list[Access]] = {name: [] for name in candidates}
    refused: dict[str, str] = {}

    def visit(inst: Instruction, item: int, ranges, dynamic: bool) -> None:
        operands = [inst.dst, *inst.srcs.values()] if inst.dst else list(inst.srcs.values())
        touched = [ap.loc for ap in operands if ap.loc in candidates]
        if not touched:
            return
        where = f"node {inst.origin.node!r} ({inst.origin.rule})"
        if inst.opcode is not Opcode.DMA_COPY:
            reason = f"{where} reads or writes it with {inst.opcode}, not a DmaCopy"
        elif dynamic:
            reason = f"{where} copies it inside a runtime loop"
        else:
            access = Access(inst, item, tuple((a, f, last) for a, (f, last) in ranges.items()))
            for name in touched:
                accesses[name].append(access)
            return
        for name in touched:
            refused.setdefault(name, reason)

    for index, entry in enumerate(fn.entry.items):
        if isinstance(entry, Instruction):
            visit(entry, index, {}, False)
        else:
            ranges = {entry.axis: (entry.start, entry.last_value)}
            dynamic = isinstance(entry, DynamicLoop | DoWhile)
            _walk(entry.body, index, ranges, dynamic, visit)
    return accesses, refused


def _rewrite(access: Access, homes: dict[str, Home], fn: Function) -> list | str:
    """`plan_copy` of one access, its first cut only: the copies, or a reason naming the node."""
    inst = access.inst
    result = plan_copy(
        inst.dst,
        inst.srcs["in"],
        homes,
        lambda name: fn.memory_locations[name].memory is not MemoryType.DRAM,
        access.axis_ranges(),
        inst.predicate is not None,
        check_only=True,
    )
    if isinstance(result, str):
        return f"node {inst.origin.node!r} ({inst.origin.rule}): {result}"
    return result


def _check(access: Access, homes: dict[str, Home], fn: Function) -> str | None:
    result = _rewrite(access, homes, fn)
    return result if isinstance(result, str) else None


def _on_chip_dmas(copies: list, homes: dict[str, Home], fn: Function) -> int:
    """How many of an access's copies stay DMAs though both sides are on chip (SBUF to SBUF:
    the lanes do not line up for an engine copy)."""

    def on_chip(name: str) -> bool:
        return name in homes or fn.memory_locations[name].memory is not MemoryType.DRAM

    return sum(
        not copy.on_chip and on_chip(copy.dst.loc) and on_chip(copy.src.loc) for copy in copies
    )


def _layout_candidates(
    loc: MemoryLocation, accesses: list[Access], graph: Graph
) -> list[tuple[int, int]]:
    """(row length, rows per group) pairs to try: the canonical rows, each partition stride
    the accesses use, then, for an operand or result of a batched MatMul, its matrices in
    groups (`residency.preferred_group`)."""
    total = max(1, loc.num_elements)
    found = [canonical_inner(loc.shape)]
    strides: Counter = Counter()
    for access in accesses:
        for ap in (access.inst.dst, access.inst.srcs["in"]):
            if ap.loc != loc.name:
                continue
            dims = [(s, c) for s, c in ap.pattern if c != 1]
            if dims and dims[0][0] > 0:
                strides[dims[0][0]] += 1
    found += [stride for stride, _ in strides.most_common()]
    layouts = [
        (inner, 0) for i, inner in enumerate(found) if total % inner == 0 and inner not in found[:i]
    ]
    group = preferred_group(graph, loc.name, walks=False)
    if group:
        layouts.append((loc.shape[-1], group))
    images = image_group(graph, loc.name)
    if images:
        layouts.append((canonical_inner(loc.shape), images))
    return layouts


def _choose_home(
    loc: MemoryLocation, accesses: list[Access], fn: Function, graph: Graph
) -> Home | str:
    """Of the layouts under which every access, alone, can be rewritten, the one that leaves
    the fewest copies between on-chip operands as SBUF-to-SBUF DMAs (the first tried on a
    tie); else the reason the canonical row length (the first tried) was refused. A batch of
    per-head matrices [1, H, S, S] has the canonical rows of S x S elements, a head to a
    partition, which every access can reach, but only by DMAs that move each row to its
    lane; rows of S elements let the engines copy lane to lane."""
    first_reason = None
    best: tuple[int, Home] | None = None
    for inner, group in _layout_candidates(loc, accesses, graph):
        itemsize = on_chip(loc.dtype).itemsize
        home = Home(loc.name, inner, max(1, loc.num_elements), itemsize, group=group)
        homes = {loc.name: home}
        dmas, reason = 0, None
        for access in accesses:
            result = _rewrite(access, homes, fn)
            if isinstance(result, str):
                reason = result
                break
            dmas += _on_chip_dmas(result, homes, fn)
        if reason is not None:
            first_reason = first_reason or f"in {home.describe()}, {reason}"
        elif best is None or dmas < best[0]:
            best = (dmas, home)
        if best is not None and best[0] == 0:
            break
    if best is not None:
        return best[1]
    return f"no row length serves every access; {first_reason or 'no access'}"


# The orders `_allocate` places homes in, first fit each; the allocation that leaves the fewest
# bytes in DRAM wins, the earlier order on a tie (docs/memory_planner.md#allocation).
ALLOCATION_ORDERS: dict[str, Callable[[Home, tuple[int, int]], tuple]] = {
    "first use": lambda home, span: (span[0], -home.bytes_per_partition),
    "largest first": lambda home, span: (-home.bytes_per_partition, span[0]),
    "largest bytes x nodes first": lambda home, span: (
        -home.bytes_per_partition * (span[1] - span[0] + 1),
        span[0],
    ),
}


class LiveHomes:
    """The homes placed so far, each (first, last, address, end), indexed by the entry items
    they are live at in buckets of `BUCKET` items, so that finding those live during a range
    reads the few homes of its buckets instead of every home placed (a 20,000-node chain:
    120,000 scans of 20,000 homes each before)."""

    BUCKET = 64

    def __init__(self, placed: Iterable[tuple[int, int, int, int]] = ()):
        self._buckets: dict[int, list[tuple[int, int, int, int]]] = {}
        for home in placed:
            self.add(*home)

    def add(self, first: int, last: int, address: int, end: int) -> None:
        home = (first, last, address, end)
        for bucket in range(first // self.BUCKET, last // self.BUCKET + 1):
            self._buckets.setdefault(bucket, []).append(home)

    def live(self, first: int, last: int) -> list[tuple[int, int]]:
        """(address, end) of every home live at some item of [first, last], by address."""
        found = set()
        for bucket in range(first // self.BUCKET, last // self.BUCKET + 1):
            for home in self._buckets.get(bucket, ()):
                if home[0] <= last and first <= home[1]:
                    found.add(home)
        return sorted((a, e) for _, _, a, e in found)


def _allocate(
    homes: dict[str, Home],
    intervals: dict[str, tuple[int, int]],
    arena_need: dict[int, int],
    reserved: int,
) -> tuple[dict[str, Home], dict[str, str], str]:
    """First fit (`_first_fit`) in each of `ALLOCATION_ORDERS`: the homes placed and the
    refusals of the order that refuses the fewest bytes, and its name."""
    best = None
    for label, key in ALLOCATION_ORDERS.items():
        order = sorted(homes, key=lambda name: key(homes[name], intervals[name]))
        placed = LiveHomes()
        result: dict[str, Home] = {}
        refused: dict[str, str] = {}
        for name in order:
            home = homes[name]
            size, (first, last) = home.bytes_per_partition, intervals[name]
            address = _first_fit(size, first, last, placed, arena_need, reserved)
            if isinstance(address, str):
                refused[name] = address
            else:
                placed.add(first, last, address, address + size)
                result[name] = replace(home, address=address)
        left = sum(homes[name].bytes_per_partition for name in refused)
        if best is None or left < best[0]:
            best = (left, result, refused, label)
    return best[1], best[2], best[3]


def _first_fit(
    size: int,
    first: int,
    last: int,
    placed: LiveHomes,
    arena_need: dict[int, int],
    reserved: int,
) -> int | str:
    """The lowest address for `size` bytes a partition, live from item `first` to `last`, that
    overlaps no home of `placed` live at the same time and stays under every arena of that
    range. Else why not (`_no_room`)."""
    ceiling = SBUF_BYTES_PER_PARTITION - max(
        (arena_need.get(item, 0) for item in range(first, last + 1)), default=0
    )
    busy = placed.live(first, last)
    address = reserved
    for start, end in busy:
        if address + size <= start:
            break
        address = max(address, end)
    if address + size > ceiling:
        return _no_room(size, first, last, reserved, ceiling, busy)
    return address


def _no_room(
    size: int, first: int, last: int, reserved: int, ceiling: int, busy: list[tuple[int, int]]
) -> str:
    """Why a home of `size` bytes a partition found no gap: the bytes under the node arenas of
    its live range, those the homes live at the same time take, and the largest gap left."""
    room = max(0, ceiling - reserved)
    taken, gap, address = 0, 0, reserved
    # sorted by address; homes live at different times may share bytes, so count the union
    for start, end in busy:
        start, end = max(start, reserved), min(end, ceiling)
        if end <= max(start, address):
            continue
        gap = max(gap, start - address)
        taken += end - max(start, address)
        address = end
    gap = max(gap, ceiling - address)
    return (
        f"does not fit: needs {size} B per partition from entry item {first} to {last}; "
        f"{room} B lie under the node arenas, {taken} B of them held by {len(busy)} other "
        f"homes live then, largest gap {max(0, gap)} B"
    )


def plan_memory(fn: Function, graph: Graph, needs: ArenaNeeds) -> MemoryPlan:
    """Decide a home for every Internal DRAM tensor of the first pass's function `fn`, then
    for every constant several nodes load whole (`needs.weights`) in the room left."""
    arena_need, reserved = needs.sbuf, needs.reserved
    candidates = _candidates(fn)
    accesses, refused = _collect(fn, candidates)
    homes: dict[str, Home] = {}
    for name, loc in candidates.items():
        if name in refused:
            continue
        if not accesses[name]:
            refused[name] = "never copied"
            continue
        home = _choose_home(loc, accesses[name], fn, graph)
        if isinstance(home, str):
            refused[name] = home
        else:
            homes[name] = home
    intervals = {
        name: (min(a.item for a in accesses[name]), max(a.item for a in accesses[name]))
        for name in homes
    }
    homes = _settle(homes, accesses, fn, graph, refused)
    homes, too_big, plan_order = _allocate(homes, intervals, arena_need, reserved)
    refused.update(too_big)
    homes = _settle(homes, accesses, fn, graph, refused)

    plan = MemoryPlan(arena_need=dict(arena_need), reserved=reserved, allocation_order=plan_order)
    plan.homes = homes
    for name in candidates:
        if name in homes:
            first, last = intervals[name]
            plan.decisions[name] = Decision(
                name,
                True,
                f"in SBUF, {homes[name].describe()}",
                homes[name].bytes_per_partition,
                first,
                last,
            )
        else:
            plan.decisions[name] = Decision(name, False, refused.get(name, "not placed"))
    placed = [
        (*intervals[name], home.address, home.address + home.bytes_per_partition)
        for name, home in homes.items()
    ]
    plan.weight_homes, plan.weight_refusals = _place_weight_homes(
        needs.weights, placed, arena_need, reserved
    )
    placed += [
        (home.first, home.last, home.address, home.address + home.nbytes)
        for home in plan.weight_homes
    ]
    plan.sbuf_high_water = _high_water(plan, placed, len(fn.entry.items))
    plan.lowered = _alternate_arenas(
        arena_need, placed, reserved, len(fn.entry.items), _weight_loaders(fn)
    )
    return plan


def _weight_loaders(fn: Function) -> set[int]:
    """The nodes (entry items) whose DMAs read weights or constants."""
    locations = fn.memory_locations
    found: set[int] = set()
    for index, entry in enumerate(fn.entry.items):
        body = entry.body.instructions() if not isinstance(entry, Instruction) else [entry]
        for ins in body:
            if ins.opcode is Opcode.DMA_COPY:
                loc = locations[ins.srcs["in"].loc]
                if loc.memory is MemoryType.DRAM and loc.kind in PAYLOAD_KINDS:
                    found.add(index)
                    break
    return found


def _place_weight_homes(
    requests: list[WeightRequest],
    placed: list[tuple[int, int, int, int]],
    arena_need: dict[int, int],
    reserved: int,
) -> tuple[list[WeightHome], dict[tuple, str]]:
    """Homes for the constants that several nodes load whole, after the tensor homes (which
    keep their places: a tensor kept on chip saves two DRAM trips of its bytes, a shared
    weight one per reader but the first). Largest saving first, a constant's readers (in
    order) are cut into runs, each as long as one home fits: at the lowest address where it
    overlaps no home live at the same time and stays under every arena from the run's first
    reader to its last. The first reader of a run loads the home; a reader in no run of two
    or more loads its own copy, and the constant's entry in the refusals says why.
    A reader's arena keeps the bytes its own copy took in the first pass, so that both passes
    allocate the same tiles (docs/memory_planner.md#shared-weights)."""
    readers: dict[tuple, list[WeightRequest]] = {}
    for request in requests:
        readers.setdefault(request.key, []).append(request)
    shared = {key: group for key, group in readers.items() if len({r.item for r in group}) > 1}

    def saving(key: tuple) -> int:
        group = shared[key]
        return (len(group) - 1) * group[0].nbytes * group[0].partitions

    live = LiveHomes(placed)
    homes: list[WeightHome] = []
    refused: dict[tuple, str] = {}
    for key in sorted(shared, key=saving, reverse=True):
        items = sorted({r.item for r in shared[key]})
        size = shared[key][0].nbytes
        alone, reason, start = [], "", 0
        while start < len(items):
            for stop in range(len(items), start + 1, -1):  # the longest run that fits
                run = items[start:stop]
                address = _first_fit(size, run[0], run[-1], live, arena_need, reserved)
                if isinstance(address, str):
                    reason = reason or address
                    continue
                live.add(run[0], run[-1], address, address + size)
                name = f"{key[0]}@sbuf{len(homes)}"
                homes.append(WeightHome(name, key, address, size, tuple(run)))
                start = stop
                break
            else:  # not even with the next reader
                alone.append(items[start])
                start += 1
        if alone:
            where = ", ".join(map(str, alone))
            refused[key] = f"the readers at entry items {where} load their own copy: {reason}"
    return homes, refused


def _settle(
    homes: dict[str, Home],
    accesses: dict[str, list[Access]],
    fn: Function,
    graph: Graph,
    refused: dict,
) -> dict[str, Home]:
    """Drop homes until every copy touching one can be rewritten with all the others in place
    (two resident sides must agree on their partition chunks)."""
    homes = dict(homes)
    # Each access alone was rewritable when its home was chosen (`_choose_home`, the other
    # side in DRAM), and a home only ever leaves: only copies between two homes need checking.
    pairs = {
        id(access): access
        for name in homes
        for access in accesses[name]
        if access.inst.dst.loc in homes and access.inst.srcs["in"].loc in homes
    }
    while True:
        victims: dict[str, str] = {}
        for access in pairs.values():
            dst, src = access.inst.dst.loc, access.inst.srcs["in"].loc
            if dst not in homes or src not in homes or dst in victims or src in victims:
                continue
            problem = _check(access, homes, fn)
            if problem is not None:
                # Keep the producer's tensor; the copy's destination goes back to DRAM.
                victims[dst] = problem
        if not victims:
            return homes
        for name, problem in victims.items():
            other = _other_layout(name, homes, accesses[name], fn, graph)
            if other is not None:
                homes[name] = other
                continue
            refused[name] = problem
            del homes[name]


def _other_layout(
    name: str, homes: dict[str, Home], accesses: list[Access], fn: Function, graph: Graph
) -> Home | None:
    """Another layout of `name`'s home, no larger, under which every access to it can be
    rewritten with the other homes in place (a head split of three heads is unrolled, so the
    canonical plane rows serve each of its copies alone, but not beside the tokens' rows they
    copy from)."""
    current = homes[name]
    loc = fn.memory_locations[name]
    for inner, group in _layout_candidates(loc, accesses, graph):
        if (inner, group) == (current.inner, current.group):
            continue
        trial = dict(homes)
        trial[name] = replace(current, inner=inner, group=group)
        if trial[name].bytes_per_partition > current.bytes_per_partition:
            continue  # the bytes allocated to the current layout must hold it
        if all(_check(access, trial, fn) is None for access in accesses):
            return trial[name]
    return None


LOADER_WINDOW = 4  # earlier nodes whose weight-loading arenas a moved weight loader avoids


def _alternate_arenas(
    arena_need: dict[int, int],
    placed: list[tuple[int, int, int, int]],
    reserved: int,
    items: int,
    loaders: set[int] = frozenset(),
) -> dict[int, int]:
    """Arenas put below their neighbours' (item -> start), so that two nodes in a row never
    share SBUF bytes. Every arena ends at the top of SBUF, so node k+1's tiles take the bytes
    of node k's: each load of k+1 then waits for the reads of those bytes in k (a
    write-after-read edge), and no node's loads run ahead of the compute before it. In order,
    a node whose predecessor stays at the top moves down, under the larger of its two
    neighbours' arenas, when the space there is above every home live at it; the homes keep
    their places (docs/memory_planner.md#allocation). A moved node that loads weights also
    keeps clear of the weight loaders among the `LOADER_WINDOW` nodes before it, where they
    are, when the room above the homes allows. `placed`: every home's (first item, last item,
    address, end); `loaders`: the nodes whose DMAs read weights or constants."""
    homes_top = [reserved] * items
    for first, last, _, end in placed:
        for item in range(first, min(last, items - 1) + 1):
            homes_top[item] = max(homes_top[item], end)
    lowered: dict[int, int] = {}
    for item in range(items):
        need = arena_need.get(item, 0)
        if not need or item - 1 in lowered:
            continue
        neighbours = max(arena_need.get(item - 1, 0), arena_need.get(item + 1, 0))
        start = SBUF_BYTES_PER_PARTITION - neighbours - need
        if not neighbours or start < homes_top[item]:
            continue
        lowered[item] = start
        if item not in loaders:
            continue
        # A weight loader also keeps clear of the weight loaders just before it, where they
        # are, so that its loads do not wait for their matmuls.
        earlier = [i for i in range(max(0, item - LOADER_WINDOW), item - 1) if i in loaders]
        bases = [lowered.get(i, SBUF_BYTES_PER_PARTITION - arena_need.get(i, 0)) for i in earlier]
        deeper = min([start + need, *bases]) - need
        window = range(max(0, item - LOADER_WINDOW), item + 1)
        if deeper < start and deeper >= max(homes_top[i] for i in window):
            lowered[item] = deeper
    return lowered


def _high_water(plan: MemoryPlan, placed: list[tuple[int, int, int, int]], items: int) -> int:
    """The most SBUF bytes per partition in use at once: reserved, live homes and the arena."""
    change = [0] * (items + 1)  # homes' bytes coming live (+) and freed (-) at each item
    for first, last, address, end in placed:
        change[first] += end - address
        change[min(last + 1, items)] -= end - address
    peak, live = plan.reserved, 0
    for item in range(items):
        live += change[item]
        peak = max(peak, plan.reserved + live + plan.arena_need.get(item, 0))
    return peak
