"""The canonical text of a BIR document, written without json's generator chain.

In: a document of dicts, lists, tuples, strings, ints, finite floats, bools and None. Out: the
exact text of `json.dumps(doc, indent=1, separators=(",", ": "), ensure_ascii=True,
allow_nan=False)`. With an indent, the standard library encodes through nested Python
generators, one per container and value, which made writing the JSON of a 24-layer BERT take
as long as converting it. Here each container is one `join` and each scalar one call to the
same encoders json uses (`encode_basestring_ascii`, `int.__repr__`, `float.__repr__`).

Anything the fast path does not expect (a non-finite float, a key or value of another type) is
left to `json.dumps` itself, so errors stay json's own.
"""

from __future__ import annotations

import json
import math
from json.encoder import encode_basestring_ascii

_SCALARS = {True: "true", False: "false"}


class _Unexpected(Exception):
    """A value the fast path does not encode: hand the document to json.dumps."""


def canonical_dumps(doc: object) -> str:
    """`json.dumps(doc, indent=1, separators=(",", ": "), ensure_ascii=True, allow_nan=False)`."""
    try:
        return _encode(doc, 0)
    except _Unexpected:
        return json.dumps(doc, indent=1, separators=(",", ": "), ensure_ascii=True, allow_nan=False)


def _scalar(value: object) -> str:
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True or value is False:
        return _SCALARS[value]
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Unexpected
        return float.__repr__(value)
    raise _Unexpected


def _key(key: object) -> str:
    if isinstance(key, str):
        return encode_basestring_ascii(key)
    # json turns other keys into strings first; leave those rare cases to it.
    raise _Unexpected


def _encode(value: object, level: int) -> str:
    kind = type(value)
    # The commonest values first, by exact type (bool is not int here, enums take _scalar).
    if kind is int:
        return int.__repr__(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is dict:
        if not value:
            return "{}"
        inner = "\n" + " " * (level + 1)
        level += 1
        items = [
            (encode_basestring_ascii(k) if type(k) is str else _key(k)) + ": " + _encode(v, level)
            for k, v in value.items()
        ]
        return "{" + inner + ("," + inner).join(items) + "\n" + " " * (level - 1) + "}"
    if kind is list or kind is tuple:
        if not value:
            return "[]"
        inner = "\n" + " " * (level + 1)
        level += 1
        items = [_encode(v, level) for v in value]
        return "[" + inner + ("," + inner).join(items) + "\n" + " " * (level - 1) + "]"
    if isinstance(value, dict | list | tuple):  # subclasses: as json sees them
        return _encode(dict(value) if isinstance(value, dict) else list(value), level)
    return _scalar(value)
