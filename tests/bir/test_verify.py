"""verify_module: a valid module passes, and each class of problem is reported on its own."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from onnx2bir.bir.enums import (
    ActFunc,
    DepKind,
    Dtype,
    Engine,
    MemoryKind,
    MemoryType,
    Opcode,
)
from onnx2bir.bir.ir import (
    AccessPattern,
    Dependency,
    Function,
    Instruction,
    Loop,
    MemoryLocation,
    Module,
    Origin,
)
from onnx2bir.bir.verify import verify_module


def _tile(name: str, memory: MemoryType, dtype: Dtype, address: int, nbytes: int):
    shape = (128, nbytes // dtype.itemsize)
    return MemoryLocation(name, memory, MemoryKind.INTERNAL, dtype, shape, 128, address, nbytes)


def _sb(loc: str, free: int, **kwargs) -> AccessPattern:
    return AccessPattern(loc, ((1, free),), num_partitions=128, **kwargs)


def build_module() -> Module:
    """y = relu(x @ w) on one 128x128 weight, the matmul split in two column chunks."""
    fn = Function("main", inputs=["x"], outputs=["y"])
    for loc in (
        MemoryLocation("x", MemoryType.DRAM, MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (128, 64)),
        MemoryLocation("w", MemoryType.DRAM, MemoryKind.CONST, Dtype.BF16, (128, 128)),
        MemoryLocation("y", MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32, (128, 64)),
        _tile("xs", MemoryType.SB, Dtype.FP32, 0, 256),
        _tile("ws", MemoryType.SB, Dtype.BF16, 256, 256),
        _tile("xb", MemoryType.SB, Dtype.BF16, 512, 128),
        _tile("ys", MemoryType.SB, Dtype.FP32, 640, 256),
        _tile("acc", MemoryType.PSUM, Dtype.FP32, 0, 256),
    ):
        fn.add_memory_location(loc)
    mm = Origin("/MatMul", "generic.matmul")
    act = Origin("/Relu", "generic.unary")
    dram = ((64, 128), (1, 64))
    load_x = Instruction(
        Opcode.DMA_COPY, Engine.DMA, _sb("xs", 64), {"in": AccessPattern("x", dram)},
        {"queue": 0}, mm, id=0,
    )  # fmt: skip
    load_w = Instruction(
        Opcode.DMA_COPY, Engine.DMA, _sb("ws", 128),
        {"in": AccessPattern("w", ((128, 128), (1, 128)))}, {"queue": 1}, mm, id=1,
    )  # fmt: skip
    cast = Instruction(
        Opcode.TENSOR_COPY, Engine.DVE, _sb("xb", 64), {"in": _sb("xs", 64)}, {}, mm, id=2,
        deps=[Dependency(0, DepKind.FLOW)],
    )  # fmt: skip
    matmul = Instruction(
        Opcode.MATMULT, Engine.PE, _sb("acc", 32, offset_terms=(("n", 32),)),
        {"stationary": _sb("ws", 128), "moving": _sb("xb", 32, offset_terms=(("n", 32),))},
        {"accumulate": False}, mm, id=3, loopnest=("n",),
        deps=[Dependency(1, DepKind.FLOW), Dependency(2, DepKind.FLOW)],
    )  # fmt: skip
    relu = Instruction(
        Opcode.ACTIVATION, Engine.ACT, _sb("ys", 64), {"in": _sb("acc", 64)},
        {"func": ActFunc.RELU, "scale": 1.0}, act, id=4, loopnest=("scope",),
        deps=[Dependency(3, DepKind.FLOW)],
    )  # fmt: skip
    store = Instruction(
        Opcode.DMA_COPY, Engine.DMA, AccessPattern("y", dram), {"in": _sb("ys", 64)},
        {"queue": 0}, act, id=5, deps=[Dependency(4, DepKind.FLOW)],
    )  # fmt: skip
    loop = Loop("n", 0, 2)
    loop.body.items.append(matmul)
    scope = Loop("scope", 0, 1, no_reorder=True)
    scope.body.items.append(relu)
    fn.entry.items += [load_x, load_w, cast, loop, scope, store]
    weights = np.eye(128, dtype=np.float32).astype(ml_dtypes.bfloat16)
    return Module("mlp", [fn], {"w": weights})


def instruction(module: Module, inst_id: int) -> Instruction:
    return next(i for i in module.functions[0].instructions() if i.id == inst_id)


def replace_location(module: Module, name: str, **changes) -> None:
    locations = module.functions[0].memory_locations
    locations[name] = dataclasses.replace(locations[name], **changes)


def only_problem(module: Module, *fragments: str) -> str:
    problems = verify_module(module)
    assert len(problems) == 1, problems
    for fragment in fragments:
        assert fragment in problems[0], problems[0]
    return problems[0]


def test_valid_module_passes():
    assert verify_module(build_module()) == []


def test_message_names_id_opcode_and_origin():
    module = build_module()
    instruction(module, 4).engine = Engine.DVE
    message = only_problem(module, "instruction 4 Activation", "/Relu", "generic.unary")
    assert "runs on DVE" in message


def test_unknown_memory_location():
    module = build_module()
    instruction(module, 2).srcs["in"] = _sb("nowhere", 64)
    only_problem(module, "instruction 2", "unknown memory location 'nowhere'")


def test_engine_not_allowed():
    module = build_module()
    instruction(module, 3).engine = Engine.DVE
    only_problem(module, "instruction 3 Matmult", "runs on DVE", "PE")


def test_missing_required_src():
    module = build_module()
    del instruction(module, 3).srcs["moving"]
    only_problem(module, "lacks required src 'moving'")


def test_unknown_src_role():
    module = build_module()
    instruction(module, 4).srcs["gate"] = _sb("ys", 64)
    only_problem(module, "unknown src role 'gate'")


def test_missing_required_attr():
    module = build_module()
    del instruction(module, 4).attrs["scale"]
    only_problem(module, "instruction 4", "lacks required attr 'scale'")


def test_missing_dst():
    module = build_module()
    instruction(module, 2).dst = None
    only_problem(module, "instruction 2", "has no dst")


def test_dst_memory_type():
    module = build_module()
    instruction(module, 3).dst = _sb("ys", 32, offset_terms=(("n", 32),))
    only_problem(module, "instruction 3", "dst 'ys' is in SB", "PSUM")


def test_src_memory_type():
    module = build_module()
    instruction(module, 2).srcs["in"] = AccessPattern("x", ((64, 128), (1, 64)))
    only_problem(module, "instruction 2", "in 'x' is in DRAM")


def test_duplicate_id():
    module = build_module()
    instruction(module, 5).id = 2
    only_problem(module, "id 2 is used by an earlier instruction")


def test_missing_id():
    module = build_module()
    instruction(module, 5).id = -1
    only_problem(module, "has no id")


def test_dependency_on_later_instruction():
    module = build_module()
    instruction(module, 2).deps.append(Dependency(5, DepKind.ORDERED))
    only_problem(module, "instruction 2", "depends on 5, not an earlier instruction")


def test_dependency_kind_unknown():
    module = build_module()
    instruction(module, 5).deps.append(Dependency(4, "Sideways"))
    only_problem(module, "unknown kind 'Sideways'")


def test_duplicate_loop_axis():
    module = build_module()
    module.functions[0].entry.items[4].axis = "n"
    instruction(module, 4).loopnest = ("n",)
    only_problem(module, "loop axis 'n' is used twice")


def test_offset_term_outside_loopnest():
    module = build_module()
    instruction(module, 4).srcs["in"] = _sb("acc", 32, offset_terms=(("n", 32),))
    only_problem(module, "instruction 4", "in offset depends on 'n', not in its loopnest")


def test_loopnest_names_non_enclosing_loop():
    module = build_module()
    instruction(module, 2).loopnest = ("n",)
    only_problem(module, "instruction 2", "loopnest names 'n'")


def test_sb_location_past_capacity():
    module = build_module()
    replace_location(module, "ys", address=196608 - 128)
    only_problem(module, "SB location 'ys'", "[196480, 196736)", "196608")


def test_psum_location_past_capacity():
    module = build_module()
    replace_location(module, "acc", address=16384 - 128)
    only_problem(module, "PSUM location 'acc'", "16384")


def test_location_with_too_many_partitions():
    module = build_module()
    replace_location(module, "xb", num_partitions=256, shape=(256, 64))
    only_problem(module, "location 'xb' uses 256 partitions")


def test_partition_start_rule():
    module = build_module()
    instruction(module, 2).srcs["in"] = AccessPattern(
        "xs", ((1, 64),), partition_start=32, num_partitions=64
    )
    only_problem(module, "instruction 2", "starts at partition 32 with 64 partitions")


def test_partition_range_outside_location():
    module = build_module()
    instruction(module, 4).dst = AccessPattern(
        "ys", ((1, 64),), partition_start=64, num_partitions=128
    )
    only_problem(module, "instruction 4", "dst 'ys' partitions [64, 192) outside [0, 128)")


def test_elements_outside_location():
    module = build_module()
    loop = module.functions[0].entry.items[3]
    loop.stop = 3  # n = 2 reads columns 64..95 of a 64-column tile
    problems = verify_module(module)
    assert len(problems) == 2, problems  # the moving tile and the PSUM accumulator
    assert all("touches elements [0, 95] outside [0, 64)" in p for p in problems)


def test_dram_operand_selecting_partitions():
    module = build_module()
    instruction(module, 5).dst = AccessPattern("y", ((1, 64),), num_partitions=128)
    only_problem(module, "instruction 5", "dst 'y' is DRAM but selects partitions")


def test_function_output_not_dram():
    module = build_module()
    module.functions[0].outputs.append("ys")
    only_problem(module, "function 'main': output 'ys' is not a DRAM memory location")


def test_const_location_without_payload():
    module = build_module()
    del module.constants["w"]
    only_problem(module, "Const location 'w' has no payload")


def test_const_payload_of_wrong_dtype():
    module = build_module()
    module.constants["w"] = np.eye(128, dtype=np.float32)
    only_problem(module, "Const location 'w' is bfloat16[128, 128]", "float32[128, 128]")


def test_payload_without_const_location():
    module = build_module()
    module.constants["x"] = np.zeros((128, 64), dtype=np.float32)
    only_problem(module, "module constant 'x' has no Const or parameter memory location")


def test_loop_carried_dependency_inside_its_loop_passes():
    module = build_module()
    # the matmul of iteration n waits for itself in iteration n - 1 (any instruction of the
    # loop body may be the source, later in the body included)
    instruction(module, 3).deps.append(Dependency(3, DepKind.OUTPUT, "n", 1))
    assert verify_module(module) == []


def test_loop_carried_dependency_on_a_loop_not_enclosing_both():
    module = build_module()
    instruction(module, 4).deps.append(Dependency(3, DepKind.ANTI, "n", 1))
    only_problem(module, "instruction 4", "carried by 'n', which does not enclose both")


def test_loop_carried_dependency_needs_a_positive_distance():
    module = build_module()
    instruction(module, 3).deps.append(Dependency(3, DepKind.OUTPUT, "n", 0))
    only_problem(module, "instruction 3", "has distance 0, must be >= 1")
