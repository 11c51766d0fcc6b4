"""Generic lowering of ONNX `Loop`: a BIR loop whose body is the lowered body graph.

In: a Loop node (trip count M, condition cond, loop-carried initial values) and its body
GraphProto. Out: instructions that copy the initial values into the loop state, then one of
(docs/loops.md):

- a static `Loop` when M is a compile-time constant and the condition is trivially true;
- a `DynamicLoop` (InstDynamicForLoop) when M is known only at run time and the condition is
  trivially true: the bound is M's DRAM element, read when the loop is entered;
- a test-before `DoWhile` (InstDoWhile) otherwise: its continue condition is a one-element
  DRAM location holding `cond` (and `0 < M`) before the loop and `cond_out` (and
  `iteration + 1 < M`) after each trip.

"Trivially true": `cond` is absent or a constant true, and the body's condition output is its
condition input passed through (directly or by Identity nodes) or a constant true.

The body is imported like a model of its own (shapes inferred, constants folded) with every
name it defines prefixed by the Loop node's name; names it reads from the enclosing graph keep
their names. The body's loop-carried inputs are renamed to the loop's state locations (the
Loop's outputs), so the body reads the state in place; at the end of each trip the body's
results are copied into the state. The iteration number, when the body reads it (or M bounds
a DoWhile), is a one-element integer counter (int32 on chip) zeroed before the loop and
incremented at the end of each trip. DRAM tensors the body defines live for the loop region
(`local_locations`).

Not supported (a clear error): scan outputs (their length is the trip count), a Loop without
trip count or condition (it never ends), nested subgraphs inside the body.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2bir.bir.enums import PAYLOAD_KINDS, Dtype, MemoryType
from onnx2bir.bir.ir import RuntimeValue
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.data import copy_dram
from onnx2bir.codegen.tiling import Affine
from onnx2bir.errors import UserError
from onnx2bir.graph import Graph, Node, TensorInfo

IR_VERSION = 10


def lower_loop(cg: BirCodeGen, node: Node) -> None:
    body = _LoopBody(cg, node)
    body.initialize()
    trips = body.static_trips()
    if trips is not None:
        if trips > 0:
            with cg.loop("loop", 0, trips):
                body.emit_trip()
        return
    if body.runtime_for():
        item = cg.dynamic_loop("loop", 0, RuntimeValue(cg.dram(body.m).name, 0))
    else:
        item = cg.do_while("while", RuntimeValue(body.continue_location(), 0))
    with cg.runtime_loop(item):
        body.emit_trip()
    item.local_locations = tuple(body.locals)


class _LoopBody:
    """One Loop node: its imported body graph and the state, counter and condition locations."""

    def __init__(self, cg: BirCodeGen, node: Node) -> None:
        self.cg = cg
        self.node = node
        self.prefix = f"{node['name']}/"
        inputs = list(node.inputs)
        self.m = inputs[0] if inputs and inputs[0] else None
        self.cond = inputs[1] if len(inputs) > 1 and inputs[1] else None
        self.initial = inputs[2:]
        count = len(self.initial)
        outputs = list(node.outputs)
        if any(outputs[count:]):
            raise cg.fail("Loop scan outputs are not supported (their length is the trip count)")
        self.states = [
            out if out else f"{self.prefix}state{k}" for k, out in enumerate(outputs[:count])
        ]
        self.outer = cg.graph
        self.body = _import_body(cg, node, self.states)
        self.locals: list[str] = []
        self._continue: str | None = None

    # --- what kind of loop ---------------------------------------------------------------------
    def _const(self, tensor: str | None):
        info = self.outer.tensors.get(tensor) if tensor else None
        return None if info is None or not info.is_const else info.const.reshape(-1)[0]

    def _condition_trivial(self) -> bool:
        cond = self._const(self.cond)
        cond_true = self.cond is None or (cond is not None and bool(cond))
        source = self._identity_source(self.body.cond_out)
        out = self.body.graph.tensors[source]
        out_true = source == self.body.cond_in or (out.is_const and bool(out.const.reshape(-1)[0]))
        return cond_true and out_true

    def _identity_source(self, tensor: str) -> str:
        """The tensor `tensor` copies through a chain of Identity nodes (itself if none)."""
        while True:
            producer = self.body.graph.producer(tensor)
            if producer is None or self.body.graph.node(producer)["op_type"] != "Identity":
                return tensor
            tensor = self.body.graph.node(producer)["inputs"][0]

    def static_trips(self) -> int | None:
        """The trip count when it is known at compile time (a static Loop), else None."""
        cond = self._const(self.cond)
        if self.cond is not None and cond is not None and not bool(cond):
            return 0  # tested before the first trip: the body never runs
        if not self._condition_trivial():
            return None
        if self.m is None:
            raise self.cg.fail(
                "Loop without trip count and with an always-true condition never ends"
            )
        m = self._const(self.m)
        return None if m is None else max(0, int(m))

    def runtime_for(self) -> bool:
        return self._condition_trivial() and self.m is not None

    def _is_while(self) -> bool:
        return self.static_trips() is None and not self.runtime_for()

    def _tracks_condition(self) -> bool:
        """Whether the body's condition input must hold the current condition."""
        return self._is_while() or bool(self.body.graph.consumers(self.body.cond_in))

    # --- emission ------------------------------------------------------------------------------
    def initialize(self) -> None:
        """State ← initial values; counter ← 0; the continue condition for the first test."""
        cg = self.cg
        with self._in_body_graph():
            for initial, state in zip(self.initial, self.states, strict=True):
                self._copy(state, initial)
            if self._needs_counter():
                counter = cg.sb_tile("counter", 1, 1, Dtype.INT64)
                cg.memset(cg.ap(counter), 0)
                cg.dma(self._dram1(self.body.iteration), cg.ap(counter))
            if self._tracks_condition():
                if self.cond is None:
                    true = cg.sb_tile("true", 1, 1, Dtype.INT32)
                    cg.memset(cg.ap(true), 1)
                    cg.dma(self._dram1(self.body.cond_in), cg.ap(true))
                else:
                    self._copy(self.body.cond_in, self.cond)
            if self._is_while():
                self._update_condition(first=True)

    def emit_trip(self) -> None:
        """One trip: the body's nodes, the state update, counter and condition."""
        cg = self.cg
        before = set(cg.function.memory_locations)
        origin = cg.origin
        with self._in_body_graph():
            for name in self.body.graph.topological_order():
                cg.transform_node(name)
            cg.emitter.origin = origin
            self._update_state()
            if self._needs_counter():
                counter = cg.sb_tile("counter", 1, 1, Dtype.INT64)
                cg.dma(cg.ap(counter), self._dram1(self.body.iteration))
                cg.tensor_scalar(cg.ap(counter), cg.ap(counter), "add", 1)
                cg.dma(self._dram1(self.body.iteration), cg.ap(counter))
            if self._tracks_condition() and self.body.cond_out != self.body.cond_in:
                self._copy(self.body.cond_in, self.body.cond_out)
            if self._continue is not None:
                self._update_condition(first=False)
        locations = cg.function.memory_locations
        self.locals = [
            name
            for name in locations
            if name not in before
            and name not in self.outer.tensors
            and locations[name].memory is MemoryType.DRAM
            and locations[name].kind not in PAYLOAD_KINDS
        ]

    def continue_location(self) -> str:
        assert self._continue is not None
        return self._continue

    def _needs_counter(self) -> bool:
        reads_iteration = bool(self.body.graph.consumers(self.body.iteration))
        bounded_while = self.m is not None and not self._condition_trivial()
        return reads_iteration or bounded_while

    def _update_state(self) -> None:
        """state_k ← result_k; results that are themselves states are staged first."""
        staged = []
        for k, (result, state) in enumerate(zip(self.body.results, self.states, strict=True)):
            if result == state:
                continue
            if result in self.states:
                info = self.body.graph.tensors[result]
                scratch = self.cg.dram_scratch(f"stage{k}", info.shape, info.dtype)
                self._copy(scratch.name, result)
                result = scratch.name
            staged.append((state, result))
        for state, result in staged:
            self._copy(state, result)

    def _update_condition(self, first: bool) -> None:
        """continue ← cond_in ∧ (trips < M), computed on one partition of VectorE."""
        cg = self.cg
        if self._continue is None:
            self._continue = cg.dram_scratch("continue", (1,), Dtype.INT32).name
        flag = cg.sb_tile("continue", 1, 1, Dtype.INT32)
        cg.dma(cg.ap(flag), self._dram1(self.body.cond_in))
        if self.m is not None:
            bound = cg.sb_tile("trip_count", 1, 1, Dtype.INT64)
            trips = cg.sb_tile("trips", 1, 1, Dtype.INT64)
            cg.dma(cg.ap(bound), self._dram1(self.m))
            if first:
                cg.memset(cg.ap(trips), 0)
            else:
                cg.dma(cg.ap(trips), self._dram1(self.body.iteration))
            below = cg.sb_tile("below", 1, 1, Dtype.INT32)
            cg.tensor_tensor(cg.ap(below), cg.ap(trips), cg.ap(bound), "is_lt")
            cg.tensor_tensor(cg.ap(flag), cg.ap(flag), cg.ap(below), "logical_and")
        cg.dma(cg.dram_ap(self._continue, Affine(), [(1, 1)]), cg.ap(flag))

    def _dram1(self, tensor: str):
        return self.cg.dram_ap(self.cg.dram(tensor).name, Affine(), [(1, 1)])

    def _copy(self, dst: str, src: str) -> None:
        cg = self.cg
        count = math.prod(cg.graph.tensors[src].shape) if src in cg.graph.tensors else None
        if count is None:
            count = cg.function.memory_locations[src].num_elements
        dst_name = cg.dram(dst).name if dst in cg.graph.tensors else dst
        copy_dram(cg, dst_name, cg.dram(src).name, count)

    class _Swap:
        def __init__(self, cg: BirCodeGen, graph: Graph) -> None:
            self.cg, self.graph, self.saved = cg, graph, cg.graph

        def __enter__(self) -> None:
            self.cg.graph = self.graph

        def __exit__(self, *exc) -> None:
            self.cg.graph = self.saved

    def _in_body_graph(self) -> _LoopBody._Swap:
        """The code generator sees the body's nodes and the tensors of both graphs."""
        return self._Swap(self.cg, self.body.graph)


# --- importing the body ------------------------------------------------------------------------
class _BodyGraph(NamedTuple):
    """A Loop's body as a Graph over the merged tensor table, and its special tensors."""

    graph: Graph
    cond_in: str  # the condition input
    cond_out: str  # the condition output
    iteration: str  # the iteration number
    results: list[str]  # the loop-carried results


def _import_body(cg: BirCodeGen, node: Node, states: list[str]) -> _BodyGraph:
    """The body of Loop `node`, imported (`_BodyGraph`)."""
    from onnx2bir.frontend.folding import fold_constants
    from onnx2bir.frontend.importer import build_graph

    outer = cg.graph
    body: onnx.GraphProto = node.attr("body")
    if not isinstance(body, onnx.GraphProto):
        raise cg.fail("Loop has no body graph")
    count = len(states)
    if len(body.input) != count + 2 or len(body.output) < count + 1:
        raise cg.fail(
            f"Loop body has {len(body.input)} inputs and {len(body.output)} outputs for "
            f"{count} loop-carried values"
        )
    prefix = f"{node['name']}/"
    rename = {body.input[0].name: f"{prefix}iteration", body.input[1].name: f"{prefix}cond_in"}
    rename.update({value.name: state for value, state in zip(body.input[2:], states, strict=True)})
    for body_node in body.node:
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in body_node.attribute
        ):
            raise cg.fail(f"Loop body node {body_node.op_type} has a subgraph: not supported")
        for out in body_node.output:
            if out:
                rename[out] = prefix + out
    # A body's own initializers (valid ONNX: the body is a graph like any other) are constants
    # of the body, named apart from the enclosing graph's.
    own = []
    for init in body.initializer:
        rename[init.name] = prefix + init.name
        constant = onnx.TensorProto()
        constant.CopyFrom(init)
        constant.name = prefix + init.name
        own.append(constant)
    defined = set(rename)
    outer_refs = []
    for body_node in body.node:
        for name in body_node.input:
            if name and name not in defined and name not in outer_refs:
                if name not in outer.tensors:
                    raise cg.fail(f"Loop body reads {name!r}, which no enclosing graph defines")
                outer_refs.append(name)
    nodes = []
    for index, body_node in enumerate(body.node):
        copy = onnx.NodeProto()
        copy.CopyFrom(body_node)
        copy.name = prefix + (body_node.name or f"{body_node.op_type}_{index}")
        copy.input[:] = [rename.get(n, n) for n in body_node.input]
        copy.output[:] = [rename.get(n, n) for n in body_node.output]
        nodes.append(copy)

    def value_info(name: str, info: TensorInfo) -> onnx.ValueInfoProto:
        elem = helper.np_dtype_to_tensor_dtype(info.dtype.numpy)
        return helper.make_tensor_value_info(name, elem, list(info.shape))

    inputs = [
        value_info(f"{prefix}iteration", TensorInfo("", (), Dtype.INT64)),
        value_info(f"{prefix}cond_in", TensorInfo("", (), Dtype.BOOL)),
    ]
    initial = list(node.inputs[2:])
    for state, init in zip(states, initial, strict=True):
        inputs.append(value_info(state, outer.tensors[init]))
    initializers = own
    for name in outer_refs:
        info = outer.tensors[name]
        if info.is_const:
            initializers.append(numpy_helper.from_array(np.asarray(info.const), name))
        else:
            inputs.append(value_info(name, info))
    outputs = [helper.make_empty_tensor_value_info(rename.get(v.name, v.name)) for v in body.output]
    graph = helper.make_graph(nodes, f"{outer.name}.{node['name']}", inputs, [], initializers)
    graph.output.extend(outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", outer.opset)], ir_version=IR_VERSION
    )
    try:
        model = fold_constants(model)
        sub = build_graph(model, graph.name)
    except UserError as exc:
        raise cg.fail(f"Loop body: {exc}") from None
    # One tensor table: the enclosing graph's tensors win for the names they define.
    merged = Graph(
        name=outer.name,
        nx=sub.nx,
        tensors={**sub.tensors, **outer.tensors},
        inputs=outer.inputs,
        outputs=outer.outputs,
        opset=outer.opset,
        producers=sub.producers,
        uses=sub.uses,
        parameters=outer.parameters,
    )
    for k, state in enumerate(states):
        if state not in merged.tensors:
            merged.tensors[state] = TensorInfo(state, *_shape_dtype(outer, initial[k]))
    body_outputs = [rename.get(v.name, v.name) for v in body.output]
    return _BodyGraph(
        merged,
        f"{prefix}cond_in",
        body_outputs[0],
        f"{prefix}iteration",
        body_outputs[1 : count + 1],
    )


def _shape_dtype(graph: Graph, tensor: str) -> tuple[tuple[int, ...], Dtype]:
    info = graph.tensors[tensor]
    return tuple(info.shape), info.dtype
