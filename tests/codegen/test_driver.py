"""The code generator's structure: Block1, per-node scope regions, loops with their axes,
dependency edges from buffer overlap, Ordered edges in a no_reorder scope."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import ENTRY_BLOCK, LOOP_BODY_BLOCK, DepKind, Opcode
from onnx2bir.bir.ir import Loop
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_every_node_is_a_scope_region_in_block1_and_ids_are_program_order():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [300, 5000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [300, 5000])
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["y"], name="neg"),
        ],
        [x],
        [y],
    )
    fn = compile_model(model).module.functions[0]
    assert fn.entry.name == ENTRY_BLOCK
    scopes = [item for item in fn.entry.items if isinstance(item, Loop)]
    assert [s.trip_count for s in scopes] == [1, 1, 1]  # relu, neg, the epilogue
    assert all(s.body.name == LOOP_BODY_BLOCK for s in scopes)
    ids = [inst.id for inst in fn.instructions()]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # 300 rows x 5000 columns: whole 128 x 2048 tiles become a loop, with a loop axis in the
    # offsets of the instructions inside it.
    inner = [item for s in scopes for item in s.body.items if isinstance(item, Loop)]
    assert inner and all(loop.trip_count >= 2 for loop in inner)
    looped = [i for i in fn.instructions() if len(i.loopnest) >= 2]
    assert any(term for i in looped for ap in i.srcs.values() for term in ap.offset_terms)


def test_flow_edges_follow_the_data_and_anti_edges_guard_reused_tiles():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["y"], name="neg"),
        ],
        [x],
        [y],
    )
    # Every tensor in DRAM (docs/memory_planner.md covers the on-chip version).
    fn = compile_model(model, CompileOptions(memory_plan=False)).module.functions[0]
    by_node = {}
    for inst in fn.instructions():
        by_node.setdefault(inst.origin.node, []).append(inst)
    relu_store = by_node["relu"][-1]
    neg_load = by_node["neg"][0]
    assert relu_store.opcode is Opcode.DMA_COPY and neg_load.opcode is Opcode.DMA_COPY
    # neg reads the DRAM tensor relu wrote: a Flow edge.
    assert (relu_store.id, DepKind.FLOW) in {(d.source, d.kind) for d in neg_load.deps}
    # neg's load reuses relu's SBUF arena: it must wait until relu's store has read it.
    kinds = {d.kind for d in neg_load.deps if d.source in {i.id for i in by_node["relu"]}}
    assert DepKind.ANTI in kinds or DepKind.OUTPUT in kinds


def test_outputs_copied_in_the_epilogue_are_ordered():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b", "x")]
    # Constant nodes fold to Const locations, published through copies; x passes through.
    nodes = [
        helper.make_node(
            "Constant", [], [n], value=numpy_helper.from_array(np.ones(4, np.float32) * k)
        )
        for k, n in ((1, "a"), (2, "b"))
    ]
    fn = compile_model(_model(nodes, [x], outs, [])).module.functions[0]
    epilogue = [i for i in fn.instructions() if i.origin.node == "<epilogue>"]
    assert len(epilogue) == 3
    for earlier, later in zip(epilogue, epilogue[1:], strict=False):
        assert (earlier.id, DepKind.ORDERED) in {(d.source, d.kind) for d in later.deps}


def test_axis_names_stay_unique_when_a_hint_ends_in_a_digit():
    from onnx2bir.codegen import GENERIC_LOWERINGS, BirCodeGen
    from onnx2bir.compiler import kernel_table
    from onnx2bir.frontend.importer import import_model
    from onnx2bir.options import CompileOptions

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = import_model(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]))
    cg = BirCodeGen(graph, CompileOptions(), GENERIC_LOWERINGS, kernel_table())
    names = [cg.emitter.axis_name("h") for _ in range(21)]  # h0 .. h20
    later = cg.emitter.axis_name("h2")  # would spell "h20" again
    assert later not in names
    assert len(set(names)) == 21 and later.startswith("h2")
