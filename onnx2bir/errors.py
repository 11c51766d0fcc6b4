"""Errors that reach the user as one line (stderr, or `{"error": ...}` with --json).

Each error has a kind and an exit status, the same for every command:
0 ok; 1 the model is readable but fails (a mismatch, it does not compile, the machine rejects
the program); 2 bad input or usage; 3 an internal error (a bug in onnx2bir).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ExitCode(IntEnum):
    OK = 0
    FAILS = 1  # readable, but a mismatch, no compilation, or a rejected program
    BAD_INPUT = 2
    INTERNAL = 3


class ErrorKind(StrEnum):
    """The `kind` of a `{"error": {"kind", "message"}}` document."""

    USAGE = "usage"  # the command line itself is wrong
    BAD_INPUT = "bad_input"  # a file or a value cannot be used
    DOES_NOT_COMPILE = "does_not_compile"  # the model reads, but cannot be compiled
    MACHINE_REJECTED = "machine_rejected"  # the program broke a hardware rule while it ran
    UNVERIFIABLE = "unverifiable"  # the model is valid, but the oracle cannot run it
    INTERNAL = "internal"  # a bug in onnx2bir

    @property
    def exit_code(self) -> ExitCode:
        if self in (ErrorKind.USAGE, ErrorKind.BAD_INPUT):
            return ExitCode.BAD_INPUT
        if self is ErrorKind.INTERNAL:
            return ExitCode.INTERNAL
        return ExitCode.FAILS


class UserError(Exception):
    """Bad input or usage: the message is the whole story, no traceback is shown."""

    kind = ErrorKind.BAD_INPUT


class UsageError(UserError):
    """The command line is wrong (unknown flag, missing argument)."""

    kind = ErrorKind.USAGE


class CompileError(UserError):
    """The model reads and checks, but cannot be compiled (unsupported ops, a node no
    lowering accepts). Exit status 1, not 2: the input is fine, the compiler is not there yet."""

    kind = ErrorKind.DOES_NOT_COMPILE


class OracleError(UserError):
    """onnxruntime cannot run a model that onnx reads and checks (no kernel for an op or a
    type): the model cannot be validated, which is not the model's fault. Exit status 1."""

    kind = ErrorKind.UNVERIFIABLE


class MachineError(Exception):
    """A BIR instruction broke a hardware rule while the machine ran it.

    The message names the instruction id, its opcode and its origin (ONNX node and rule), so a
    failure in a kernel can be traced back to the node and the rule that emitted it.
    """

    kind = ErrorKind.MACHINE_REJECTED
