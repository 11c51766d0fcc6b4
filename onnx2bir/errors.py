"""Errors that reach the user as one line on stderr and exit status 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or usage: the message is the whole story, no traceback is shown."""


class MachineError(Exception):
    """A BIR instruction broke a hardware rule while the machine ran it.

    The message names the instruction id, its opcode and its origin (ONNX node and rule), so a
    failure in a kernel can be traced back to the node and the rule that emitted it.
    """
