"""Static checks of a BIR module against the opcode table and the hardware geometry.

In: a `bir.Module`. Out: a list of human-readable problems, empty when the module is well
formed. A problem with an instruction names its id, opcode and origin (ONNX node, rule), so it
can be traced to the emitter; other problems name the function and location or loop axis.

Checked, per function:
- memory locations: SB/PSUM tiles use 1..128 partitions and lie inside one partition's
  capacity (address + bytes_per_partition ≤ 196608 for SB, 16384 for PSUM; see
  `opcodes.py`). Overlapping tiles are not reported: that needs lifetimes, which the
  verifier does not compute.
- function inputs and outputs name DRAM locations;
- loop axes are unique within the function;
- each instruction against `OPCODES`: known opcode, allowed engine (`engine_rule`: a TensorCopy
  on ScalarE breaks ACT-TENSOR-COPY, any other misplaced opcode ENGINE-OPCODE), required and no
  unknown src roles, required attrs, a dst, dst/src memory types;
- operands name known locations; partition ranges fit the location (and are absent on DRAM);
  the elements touched in each partition, over all loop values, lie inside the location;
- compute-engine (non-DMA) operands on SB/PSUM keep the partition-start rule
  (`partition_start_allowed`), free dims whose sizes and strides fit the ISA's fields
  (`ap_field_overflow`, rule AP-FIELD-BITS) and, on VectorE and ScalarE, at most
  `free_size_limit` elements per partition (rule FREE-SIZE);
- a bitvec ALU operator (bitwise, shifts) has integer operands and immediates, runs on VectorE
  or GpSimd, and shares no TensorScalar with an arithmetic operator (`bitvec_problem`, rule
  ALU-BITVEC);
- ids are non-negative and unique within the function; every plain dependency names an
  instruction earlier in program order, every loop-carried one an instruction inside the loop
  that carries it, a loop enclosing both, with a distance of at least 1;
- `loopnest` names only enclosing loops and `offset_terms` only axes of the `loopnest`;
- a predicated instruction's predicate names axes of its `loopnest`, and its operand spans are
  checked as the predicate cuts them, at the trips where the cut matters;
- runtime loops (DynamicFor, DoWhile): the runtime value names an element of a DRAM location,
  the step is positive, a dynamic loop is not parallel, and a location local to the loop region
  is touched by no instruction outside it. Spans of operands that move with a runtime axis
  are checked for its first trip only (the machine checks every trip);
- a loop marked `parallel` has no two accesses in different iterations that can touch a common
  byte, one writing (`parallel.py`, rule PARALLEL-HAZARD).

Per module: every Const location has a payload in `module.constants` of its dtype and shape (a
parameter location may have one, of its dtype and shape, or leave it to the caller), and every
payload belongs to a Const or parameter location.
"""

from __future__ import annotations

import numpy as np

from onnx2bir.bir.dtypes import DRAM_ONLY
from onnx2bir.bir.enums import PAYLOAD_KINDS, DepKind, Dtype, Engine, MemoryKind, MemoryType
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    DoWhile,
    DynamicLoop,
    Function,
    Instruction,
    Loop,
    Module,
    RuntimeValue,
    runtime_loops,
)
from onnx2bir.bir.opcodes import (
    NUM_PARTITIONS,
    OPCODES,
    PSUM_BYTES_PER_PARTITION,
    SBUF_BYTES_PER_PARTITION,
    ap_field_overflow,
    bitvec_problem,
    engine_rule,
    free_size_limit,
    partition_start_allowed,
)
from onnx2bir.bir.parallel import parallel_hazards
from onnx2bir.bir.predicates import predicate_cases
from onnx2bir.bir.rules import cite, rule_of
from onnx2bir.errors import MachineError, UserError

_CAPACITY = {MemoryType.SB: SBUF_BYTES_PER_PARTITION, MemoryType.PSUM: PSUM_BYTES_PER_PARTITION}
_DEP_KINDS = frozenset(DepKind)


def verify_module(module: Module) -> list[str]:
    """Every problem found in `module`; an empty list means it passed."""
    problems: list[str] = []
    for fn in module.functions:
        problems += _check_locations(fn)
        problems += _check_io(fn)
        _FunctionWalk(fn, problems).block(fn.entry, [])
        problems += _check_runtime_loops(fn)
        problems += [hazard.message() for hazard in parallel_hazards(fn)]
    problems += _check_constants(module)
    return problems


class VerificationError(UserError):
    """A module that fails `verify_module`; the message lists the first problems."""


class HardwareRuleError(MachineError):
    """A module that breaks a hardware rule (`rules.py`): refused as the machine refuses a
    program, exit status 1, the rule ids in the message."""


def check_module(module: Module, what: str = "BIR") -> None:
    """Raise `HardwareRuleError` when `module` breaks a hardware rule and nothing else, else
    `VerificationError` naming the first problems when it does not verify."""
    problems = verify_module(module)
    if problems and all(rule_of(problem) for problem in problems):
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise HardwareRuleError(f"{what} breaks {len(problems)} hardware rule(s): {shown}{more}")
    if problems:
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise VerificationError(
            f"{what} fails verification, {len(problems)} problem(s): {shown}{more}"
        )


def describe(inst: Instruction) -> str:
    """How a problem message names an instruction: id, opcode, origin."""
    return (
        f"instruction {inst.id} {inst.opcode} "
        f"(node {inst.origin.node!r}, rule {inst.origin.rule!r})"
    )


def _check_locations(fn: Function) -> list[str]:
    problems = []
    for loc in fn.memory_locations.values():
        capacity = _CAPACITY.get(loc.memory)
        if capacity is None:
            continue
        where = f"function {fn.name!r}: {loc.memory} location {loc.name!r}"
        if not 1 <= loc.num_partitions <= NUM_PARTITIONS:
            problems.append(
                f"{where} uses {loc.num_partitions} partitions, allowed 1..{NUM_PARTITIONS}"
            )
        end = loc.address + loc.bytes_per_partition
        if loc.address < 0 or end > capacity:
            problems.append(
                f"{where} occupies bytes [{loc.address}, {end}) of each partition, "
                f"outside [0, {capacity})"
            )
    return problems


def _check_io(fn: Function) -> list[str]:
    problems = []
    for role, names in (("input", fn.inputs), ("output", fn.outputs)):
        for name in names:
            loc = fn.memory_locations.get(name)
            if loc is None or loc.memory != MemoryType.DRAM:
                problems.append(
                    f"function {fn.name!r}: {role} {name!r} is not a DRAM memory location"
                )
    return problems


def _check_constants(module: Module) -> list[str]:
    problems = []
    payload_names = set()
    for fn in module.functions:
        for loc in fn.memory_locations.values():
            if loc.kind not in PAYLOAD_KINDS:
                continue
            payload_names.add(loc.name)
            where = f"function {fn.name!r}: {loc.kind} location {loc.name!r}"
            if loc.name not in module.constants:
                # A parameter without a payload is legal: the caller supplies it at load time.
                if loc.kind == MemoryKind.CONST:
                    problems.append(f"{where} has no payload in module.constants")
                continue
            payload = np.asarray(module.constants[loc.name])
            if payload.dtype != Dtype(loc.dtype).numpy or payload.shape != tuple(loc.shape):
                problems.append(
                    f"{where} is {loc.dtype}{list(loc.shape)} but its payload is "
                    f"{payload.dtype}{list(payload.shape)}"
                )
    for name in sorted(set(module.constants) - payload_names):
        problems.append(f"module constant {name!r} has no Const or parameter memory location")
    return problems


def _check_runtime_loops(fn: Function) -> list[str]:
    problems = []
    for loop in runtime_loops(fn.entry):
        where = f"function {fn.name!r}: {type(loop).__name__} {loop.axis!r}"
        values = []
        if isinstance(loop, DynamicLoop):
            values.append(("bound", loop.stop_value))
            if loop.parallel:
                problems.append(f"{where} is marked parallel; a runtime loop is ordered")
        elif isinstance(loop, DoWhile) and isinstance(loop.continue_condition, RuntimeValue):
            values.append(("continue_condition", loop.continue_condition))
        if loop.step <= 0:
            problems.append(f"{where} has step {loop.step}, must be > 0")
        for role, value in values:
            loc = fn.memory_locations.get(value.loc)
            if loc is None or loc.memory != MemoryType.DRAM:
                problems.append(f"{where}: {role} names {value.loc!r}, not a DRAM location")
            elif not 0 <= value.offset < loc.num_elements:
                problems.append(
                    f"{where}: {role} offset {value.offset} outside {value.loc!r} "
                    f"[0, {loc.num_elements})"
                )
        inside = {inst.id for inst in loop.body.instructions()}
        local = set(loop.local_locations)
        for name in sorted(local - set(fn.memory_locations)):
            problems.append(f"{where}: local location {name!r} is not defined")
        for inst in fn.instructions():
            if inst.id in inside:
                continue
            for role, ap in _operands(inst):
                if ap.loc in local:
                    problems.append(
                        f"{describe(inst)}: {role} {ap.loc!r} lives only inside {where}"
                    )
    return problems


class _FunctionWalk:
    """One pass over a function's block tree, in program order."""

    def __init__(self, fn: Function, problems: list[str]) -> None:
        self.fn = fn
        self.problems = problems
        self.seen_ids: set[int] = set()
        self.seen_axes: set[str] = set()
        self.loopnests = {inst.id: inst.loopnest for inst in fn.instructions()}

    def block(self, block: BasicBlock, loops: list[Loop]) -> None:
        for item in block.items:
            if isinstance(item, Loop):
                if item.axis in self.seen_axes:
                    self.problems.append(
                        f"function {self.fn.name!r}: loop axis {item.axis!r} is used twice"
                    )
                self.seen_axes.add(item.axis)
                self.block(item.body, [*loops, item])
            else:
                self.instruction(item, loops)

    def instruction(self, inst: Instruction, loops: list[Loop]) -> None:
        found: list[str] = []
        self._ids(inst, found)
        self._loopnest(inst, loops, found)
        self._spec(inst, found)
        self._bitvec(inst, found)
        ranges = {loop.axis: (loop.start, loop.last_value) for loop in loops if loop.trip_count > 0}
        # A zero-trip loop never runs its body: its operands touch nothing.
        runs = all(loop.trip_count > 0 for loop in loops)
        if inst.predicate is None or not runs:
            for role, ap in _operands(inst):
                self._operand(inst, role, ap, ranges if runs else None, found)
        else:
            self._predicated(inst, ranges, found)
        label = describe(inst)
        self.problems.extend(f"{label}: {problem}" for problem in found)

    def _predicated(self, inst: Instruction, ranges, found: list[str]) -> None:
        """Operand checks at the trips where the predicate matters (bir/predicates.py)."""
        missing = [axis for axis, _ in inst.predicate.terms if axis not in inst.loopnest]
        if missing:
            found.append(f"predicate depends on {missing[0]!r}, not in its loopnest")
            return
        if any(axis not in ranges for axis, _ in inst.predicate.terms):
            return  # an axis of a loop that never runs
        seen: set[str] = set()
        for narrowed, fixed in predicate_cases(inst, ranges):
            problems: list[str] = []
            for role, ap in _operands(narrowed):
                self._operand(narrowed, role, ap, fixed, problems)
            for problem in problems:
                if problem not in seen:
                    seen.add(problem)
                    found.append(problem)

    def _ids(self, inst: Instruction, found: list[str]) -> None:
        for dep in inst.deps:
            if dep.kind not in _DEP_KINDS:
                found.append(f"dependency on {dep.source} has unknown kind {dep.kind!r}")
            if dep.carried_by is None:
                if dep.source not in self.seen_ids:
                    found.append(f"depends on {dep.source}, not an earlier instruction")
                continue
            source_nest = self.loopnests.get(dep.source)
            if source_nest is None:
                found.append(f"loop-carried dependency on {dep.source}, not an instruction")
            elif dep.carried_by not in inst.loopnest or dep.carried_by not in source_nest:
                found.append(
                    f"dependency on {dep.source} is carried by {dep.carried_by!r}, "
                    "which does not enclose both instructions"
                )
            if dep.distance < 1:
                found.append(
                    f"loop-carried dependency on {dep.source} has distance {dep.distance}, "
                    "must be >= 1"
                )
        if inst.id < 0:
            found.append("has no id")
        elif inst.id in self.seen_ids:
            found.append(f"id {inst.id} is used by an earlier instruction")
        self.seen_ids.add(inst.id)

    @staticmethod
    def _loopnest(inst: Instruction, loops: list[Loop], found: list[str]) -> None:
        enclosing = {loop.axis for loop in loops}
        for axis in inst.loopnest:
            if axis not in enclosing:
                found.append(f"loopnest names {axis!r}, which is not an enclosing loop")
        for role, ap in _operands(inst):
            for axis, _ in ap.offset_terms:
                if axis not in inst.loopnest:
                    found.append(f"{role} offset depends on {axis!r}, not in its loopnest")

    @staticmethod
    def _spec(inst: Instruction, found: list[str]) -> None:
        spec = OPCODES.get(inst.opcode)
        if spec is None:
            found.append("has an opcode missing from the opcode table")
            return
        if inst.engine not in spec.engines:
            allowed = ", ".join(sorted(str(engine) for engine in spec.engines))
            found.append(
                cite(
                    engine_rule(inst.opcode, inst.engine),
                    f"runs on {inst.engine}; {inst.opcode} runs on {allowed}",
                )
            )
        for role in spec.required_srcs:
            if role not in inst.srcs:
                found.append(f"lacks required src {role!r}")
        known = set(spec.required_srcs) | set(spec.optional_srcs)
        for role in sorted(set(inst.srcs) - known):
            found.append(f"has unknown src role {role!r}")
        for attr in spec.required_attrs:
            if attr not in inst.attrs:
                found.append(f"lacks required attr {attr!r}")
        if inst.dst is None:
            found.append("has no dst")

    def _bitvec(self, inst: Instruction, found: list[str]) -> None:
        """A bitvec ALU operator keeps to integer bit patterns (rule ALU-BITVEC)."""
        locations = self.fn.memory_locations
        dtypes = {
            role: locations[ap.loc].dtype for role, ap in _operands(inst) if ap.loc in locations
        }
        problem = bitvec_problem(inst.opcode, inst.engine, inst.attrs, dtypes)
        if problem is not None:
            found.append(cite("ALU-BITVEC", problem))

    def _operand(
        self,
        inst: Instruction,
        role: str,
        ap: AccessPattern,
        ranges: dict[str, tuple[int, int]] | None,
        found: list[str],
    ) -> None:
        loc = self.fn.memory_locations.get(ap.loc)
        if loc is None:
            found.append(f"{role} names unknown memory location {ap.loc!r}")
            return
        spec = OPCODES.get(inst.opcode)
        if spec is not None:
            allowed = spec.dst_memory if role == "dst" else spec.src_memory
            if loc.memory not in allowed:
                names = ", ".join(sorted(str(memory) for memory in allowed))
                found.append(
                    cite(
                        "OPERAND-MEMORY", f"{role} {ap.loc!r} is in {loc.memory}, allowed: {names}"
                    )
                )
        if loc.memory != MemoryType.DRAM and loc.dtype in DRAM_ONLY:
            found.append(
                cite("INT64-DATAPATH", f"{role} {ap.loc!r} is {loc.dtype} in {loc.memory}")
            )
        if loc.memory == MemoryType.DRAM:
            if ap.num_partitions or ap.partition_start:
                found.append(f"{role} {ap.loc!r} is DRAM but selects partitions")
        else:
            end = ap.partition_start + ap.num_partitions
            if ap.num_partitions < 1 or ap.partition_start < 0 or end > loc.num_partitions:
                found.append(
                    f"{role} {ap.loc!r} partitions [{ap.partition_start}, {end}) outside "
                    f"[0, {loc.num_partitions})"
                )
            elif inst.engine != Engine.DMA and not partition_start_allowed(
                ap.partition_start, ap.num_partitions
            ):
                found.append(
                    cite(
                        "PARTITION-START",
                        f"{role} {ap.loc!r} starts at partition {ap.partition_start} with "
                        f"{ap.num_partitions} partitions",
                    )
                )
            if inst.engine != Engine.DMA:
                self._free_fields(inst, role, ap, loc.memory, found)
        touches = ranges is not None and all(count > 0 for _, count in ap.pattern)
        if touches and all(axis in ranges for axis, _ in ap.offset_terms):
            low, high = ap.element_span(ranges)
            if low < 0 or high >= loc.num_elements:
                found.append(
                    f"{role} {ap.loc!r} touches elements [{low}, {high}] outside "
                    f"[0, {loc.num_elements})"
                )

    @staticmethod
    def _free_fields(
        inst: Instruction, role: str, ap: AccessPattern, memory: MemoryType, found: list[str]
    ) -> None:
        """A compute-engine operand's free dims fit the ISA's fields (AP-FIELD-BITS) and, on
        VectorE and ScalarE, the elements per partition the engine takes (FREE-SIZE)."""
        overflow = ap_field_overflow(ap.pattern)
        if overflow is not None:
            found.append(cite("AP-FIELD-BITS", f"{role} {ap.loc!r}: {overflow}"))
        limit = free_size_limit(inst.engine, memory)
        if limit is not None and ap.free_size > limit:
            found.append(
                cite(
                    "FREE-SIZE",
                    f"{role} {ap.loc!r} holds {ap.free_size} elements per partition in {memory} "
                    f"(max {limit} on {inst.engine})",
                )
            )


def _operands(inst: Instruction) -> list[tuple[str, AccessPattern]]:
    """(role, access pattern) for every operand, srcs first, the dst named "dst"."""
    result = sorted(inst.srcs.items())
    if inst.dst is not None:
        result.append(("dst", inst.dst))
    return result
