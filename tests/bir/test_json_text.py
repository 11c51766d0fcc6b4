"""The canonical text writer gives exactly json.dumps's text, on real BIR documents and on
the corner cases of the JSON encoder; what it does not expect raises json's own errors."""

from __future__ import annotations

import enum
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from onnx2bir.bir.json_io import module_to_json
from onnx2bir.bir.json_text import canonical_dumps
from onnx2bir.compiler import compile_model

MODELS = Path(__file__).resolve().parents[2] / "models"


def _reference(doc) -> str:
    return json.dumps(doc, indent=1, separators=(",", ": "), ensure_ascii=True, allow_nan=False)


@pytest.mark.parametrize("name", ["small_cnn", "mha", "loop_while"])
def test_a_module_document_is_written_as_json_writes_it(name):
    doc = module_to_json(compile_model(MODELS / f"{name}.onnx").module, constants_file="c.bin")
    assert canonical_dumps(doc) == _reference(doc)


class _Kind(enum.StrEnum):
    RELU = "relu"


class _Level(enum.IntEnum):
    TWO = 2


class _Items(list):
    """A list subclass: the encoder must write it as a plain list."""


def test_corner_cases_match_the_standard_encoder():
    doc = {
        "empty dict": {},
        "empty list": [],
        "nested": [[], {}, [[1]], {"a": {}}],
        "tuple": (1, (2, 3)),
        "unicode": 'é\u2028"quoted"\\ \n\t\x00',
        "floats": [0.1, -0.0, 1e-300, 1.7976931348623157e308, 5e-324, 3.0, np.float64(0.25)],
        "ints": [0, -1, 2**70, True, False, None, _Level.TWO],
        "enum": _Kind.RELU,
        "ordered": OrderedDict([("b", 1), ("a", [2])]),
        "subclass": _Items([1, "two"]),
        _Kind.RELU: "an enum key",
    }
    assert canonical_dumps(doc) == _reference(doc)
    assert canonical_dumps([]) == "[]" and canonical_dumps("x") == '"x"'


@pytest.mark.parametrize(
    "doc, error",
    [
        ({"x": float("nan")}, ValueError),
        ([float("inf")], ValueError),
        ({"x": np.int64(3)}, TypeError),
        ({"x": {1, 2}}, TypeError),
    ],
)
def test_what_json_rejects_is_rejected_with_its_error(doc, error):
    with pytest.raises(error):
        _reference(doc)
    with pytest.raises(error):
        canonical_dumps(doc)


def test_non_string_keys_are_converted_as_json_converts_them():
    doc = {1: "int", 2.5: "float", False: "bool", None: "none"}
    assert canonical_dumps(doc) == _reference(doc)
