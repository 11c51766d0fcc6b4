"""Graph inputs that the program needs as constants: they reach an operand the lowerings read
at compile time (reduction axes, pads, slice bounds, split sizes, Resize scales, a shape).

Such an input makes the model refuse to compile unless its value is fixed (`--input-value`,
docs/input_contracts.md#input-values). When the user hands `validate` a file of inputs, the
values are there: `validate` fixes these inputs to them and says so in a note, and
onnxruntime is fed the same values, so the verdict is for exactly the inputs given.
"""

from __future__ import annotations

import onnx

MAX_ELEMENTS = 4096
_REDUCTIONS = ("L1", "L2", "LogSum", "LogSumExp", "Max", "Mean", "Min", "Prod", "Sum", "SumSquare")
_QLINEAR = frozenset({1, 2, 4, 5, 6, 7})  # scales and zero points
# op type → the input positions a lowering reads at compile time.
COMPILE_TIME_OPERANDS: dict[str, frozenset[int]] = {
    **{f"Reduce{kind}": frozenset({1}) for kind in _REDUCTIONS},
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Split": frozenset({1}),
    "Pad": frozenset({1, 2, 3}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "CumSum": frozenset({1}),
    "CumProd": frozenset({1}),
    "TopK": frozenset({1}),
    "OneHot": frozenset({1}),
    "ConstantOfShape": frozenset({0}),
    "Range": frozenset({0, 1, 2}),
    "Trilu": frozenset({1}),
    "Dropout": frozenset({1, 2}),
    "CenterCropPad": frozenset({1}),
    "GRU": frozenset({3, 4}),
    "LSTM": frozenset({3, 4}),
    "RNN": frozenset({3, 4}),
    "QuantizeLinear": frozenset({1, 2}),
    "DequantizeLinear": frozenset({1, 2}),
    "QLinearMatMul": _QLINEAR,
    "QLinearConv": _QLINEAR,
    "MatMulInteger": frozenset({2, 3}),
    "ConvInteger": frozenset({2, 3}),
}


def compile_time_inputs(model: onnx.ModelProto) -> dict[str, str]:
    """{graph input: the first node and operand that needs it at compile time}, for the
    inputs (not initializers) from which such an operand is computed."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [v.name for v in graph.input if v.name not in initializers]
    producers = {out: node for node in graph.node for out in node.output if out}
    found: dict[str, str] = {}
    for index, node in enumerate(graph.node):
        positions = COMPILE_TIME_OPERANDS.get(node.op_type, frozenset())
        if node.domain not in ("", "ai.onnx"):
            continue
        for position in sorted(positions):
            if position >= len(node.input) or not node.input[position]:
                continue
            label = f"{node.op_type} {node.name or f'#{index}'!r} input {position}"
            for source in _sources(node.input[position], producers, set(inputs)):
                found.setdefault(source, label)
    return found


SHAPE_ONLY = frozenset({"Shape", "Size"})  # their output depends on a shape, not on values


def _sources(tensor: str, producers: dict, inputs: set[str]) -> set[str]:
    """The graph inputs whose values `tensor` is computed from (a Shape reads none)."""
    sources, seen, stack = set(), set(), [tensor]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            sources.add(name)
        elif name in producers and producers[name].op_type not in SHAPE_ONLY:
            stack.extend(t for t in producers[name].input if t)
    return sources


def fixed_from_inputs(
    model: onnx.ModelProto, arrays: dict, already: set[str], limit: int = MAX_ELEMENTS
) -> tuple[dict, list[str]]:
    """The given arrays of compile-time inputs not already fixed (small ones only: a value
    that large is data, not a parameter) and a note for each."""
    fixed, notes = {}, []
    for name, reader in compile_time_inputs(model).items():
        if name in already or name not in arrays or arrays[name].size > limit:
            continue
        if arrays[name].dtype.kind not in "biuf":  # bfloat16: not a number --input-value takes
            continue
        fixed[name] = arrays[name]
        notes.append(
            f"input {name!r} fixed to its value in the inputs given: {reader} is read at "
            f"compile time (as --input-value {name}=... would; onnxruntime is fed the same)"
        )
    return fixed, notes
