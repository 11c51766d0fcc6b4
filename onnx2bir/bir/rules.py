"""The hardware rules a program must keep, each with a stable id (docs/neuroncore.md#rules).

Beside the opcode table (`opcodes.py`: roles, engines, memories), this is what the verifier and
the machine refuse in the hardware's name. A refusal names the rule id, the instruction (id,
opcode, node, rule of the emitter) and the fact it breaks, so that "does not compile for the
device" comes with the reason a NeuronCore would give. Each fact's source is cited in
docs/neuroncore.md#rules. A program that breaks a rule is refused with exit status 1 (the
machine rejects it), as a NeuronCore would; a program that is malformed (an unknown location,
a missing operand) stays a verification error, exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    applies_to: str
    fact: str


RULES: dict[str, Rule] = {
    rule.id: rule
    for rule in (
        Rule("ENGINE-OPCODE", "every instruction", "each opcode runs only on its engines"),
        Rule(
            "OPERAND-MEMORY",
            "every instruction",
            "each operand role lives in the memories its engine reaches (a matmul reads SBUF "
            "and writes PSUM; a DMA moves between DRAM and SBUF)",
        ),
        Rule("POOL-PSUM", "GpSimd instructions", "GpSimd cannot access PSUM"),
        Rule(
            "PARTITION-START",
            "compute-engine operands on SBUF/PSUM",
            "a tile of more than 64 partitions starts at partition 0, of 33-64 at 0 or 64, of "
            "at most 32 at 0, 32, 64 or 96",
        ),
        Rule(
            "FREE-DIMS",
            "compute-engine operands",
            "an access pattern has at most 4 free dimensions",
        ),
        Rule(
            "PE-SHAPE",
            "Matmult",
            "both inputs have the same K <= 128 partitions; the stationary free size M <= 128, "
            "the moving free size N <= 512, the result M x N",
        ),
        Rule(
            "PE-DTYPE",
            "Matmult",
            "inputs are float8/bfloat16/float16/tfloat32/float32 (no integers); fp32 pairs "
            "only with fp32 or tf32",
        ),
        Rule("PE-PSUM-FP32", "Matmult", "accumulation and results are float32 in PSUM"),
        Rule("PSUM-BANK", "Matmult", "a result lies inside one 2 KiB PSUM bank"),
        Rule("TT-PSUM-INPUTS", "TensorTensor", "the two inputs are not both in PSUM"),
        Rule(
            "INT64-DATAPATH",
            "SBUF and PSUM operands",
            "no engine has a 64-bit datapath: int64 and uint64 tensors are narrowed to 32 "
            "bits on the device, float64 is computed in fp32, 4-bit integers are unpacked to "
            "bytes; these dtypes exist only in DRAM, at the model's boundary",
        ),
        Rule(
            "NARROWING-CHECKED",
            "DmaCopy",
            "a float64 value loaded on chip must lie within fp32's range, and a uint64 value "
            "within uint32's: the narrowing to the on-chip dtype is checked, never silent",
        ),
        Rule(
            "DMA-OOB",
            "DmaGather",
            "an address computed at run time outside its tensor is a runtime error",
        ),
        Rule(
            "PARALLEL-HAZARD",
            "loops marked parallel",
            "no two iterations touch a common byte, one writing (docs/dependencies.md"
            "#parallel-loops)",
        ),
        Rule(
            "ACT-RANGE",
            "Activation",
            "a ScalarE function is valid only inside its input range: sin and cos [-pi, pi] "
            "(no range reduction), log [2^-64, 2^64], sqrt [2^-116, 2^118], rsqrt "
            "[2^-87, 2^97], reciprocal +-[2^-42, 2^42]",
        ),
        Rule(
            "ACT-TENSOR-COPY",
            "TensorCopy",
            "on NeuronCore-v2 TensorCopy runs on VectorE or GpSimd, not ScalarE; ScalarE copies "
            "with an Activation (func copy), through fp32",
        ),
        Rule(
            "FREE-SIZE",
            "VectorE and ScalarE operands",
            "an operand holds at most 65536 elements per partition in SBUF, 4096 in PSUM",
        ),
        Rule(
            "AP-FIELD-BITS",
            "compute-engine operands",
            "each free dimension's size fits uint16 (at most 65535) and, when it walks more "
            "than one element, its stride int16 (-32768..32767 elements)",
        ),
        Rule(
            "ALU-BITVEC",
            "TensorTensor and TensorScalar with a bitvec operator",
            "bitwise_and, bitwise_or, bitwise_xor, invert, left_shift and right_shift "
            "(logical) compute on integer operands' bit patterns, never through fp32: integer "
            "operands and immediates only, on VectorE or GpSimd, and never beside an "
            "arithmetic operator in one TensorScalar",
        ),
        Rule(
            "PSUM-ACCUMULATE",
            "Matmult with accumulate",
            "a matmul accumulates only onto PSUM bytes that hold a matmul's partial sum "
            "(written by a Matmult, not since by another instruction)",
        ),
    )
}


def cite(rule_id: str, detail: str) -> str:
    """`<ID>: <detail> (<the fact>)`, the form every refusal takes."""
    rule = RULES[rule_id]
    return f"{rule.id}: {detail} ({rule.fact})"


def rule_of(problem: str) -> str | None:
    """The rule id a problem message cites, if any."""
    for rule_id in RULES:
        if f"{rule_id}: " in problem:
            return rule_id
    return None
