"""What validate checks before it runs, and the meaning of its timings.

`check_policy_names` refuses a `--tolerance` for a tensor the model lacks and an
`--op-tolerance` for an op type it does not use, listing the valid names; `check_arrays` holds
arrays given in memory (the Python API) to the rules `oracle.load_inputs` applies to a file;
`model_feeds` reads or makes the model's inputs and says where each came from,
`describe_inputs` lists them for a document; `TIMINGS_EXPLAINED` says what each figure of the
document's `timings` measures.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from onnx2bir.errors import UserError
from onnx2bir.runtime.oracle import ort as oracle
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy

TIMINGS_EXPLAINED = {
    "import": "read, check and shape-infer the model; fold compile-time values",
    "passes": "the pattern passes (attention, MLP, conv kernel selection)",
    "codegen": "BIR code generation, dependency edges included",
    "verify": "checking the generated BIR (bounds, capacities, edges) before it runs",
    "simulate": "running the BIR on the numpy machine model",
    "emulating_oracle": "onnxruntime on the model with the program's roundings inserted, twice: "
    "plain, then fed the machine's values of the probed intermediates (docs/validation.md#verdict)",
    "onnxruntime": "onnxruntime: session creation (graph load) plus one run",
    "localize": "--localize: the intermediates on onnxruntime and their comparison",
}


def check_policy_names(policy: TolerancePolicy, graph) -> None:
    """Refuse a --tolerance for a tensor the model lacks, or an --op-tolerance for an op type
    it does not use, listing the valid names (the file's layers may name others: a file can
    serve several models)."""
    unknown = sorted(name for name in policy.tensors if name not in graph.tensors)
    if unknown:
        raise UserError(
            f"--tolerance {', '.join(unknown)}: no such tensor in the model; its outputs are "
            f"{', '.join(graph.outputs)} (any intermediate tensor name is accepted too)"
        )
    op_types = sorted({data["op_type"] for _, data in graph.nodes()})
    unknown = sorted(name for name in policy.op_types if name not in op_types)
    if unknown:
        raise UserError(
            f"--op-tolerance {', '.join(unknown)}: the model has no such op type; its op "
            f"types are {', '.join(op_types)}"
        )


def check_arrays(arrays: dict[str, np.ndarray], graph, label: str) -> dict[str, np.ndarray]:
    """Arrays given in memory, held to the rules `oracle.load_inputs` applies to a file."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "inputs.npz"
        np.savez(path, **arrays)
        try:
            return oracle.load_inputs(path, graph)
        except UserError as exc:
            raise UserError(str(exc).replace(str(path), label)) from None


def model_feeds(
    graph, inputs=None, inputs_label: str | None = None, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(feeds, where each came from): `inputs` arrays already read (checked as a file would
    be), a file or folder, or None for seeded random ones (`oracle.synthesize_inputs`)."""
    if isinstance(inputs, dict):
        feeds = check_arrays(inputs, graph, inputs_label or "inputs")
        return feeds, dict.fromkeys(graph.inputs, f"from {inputs_label or 'the given arrays'}")
    if inputs is not None:
        return oracle.load_inputs(inputs, graph), dict.fromkeys(graph.inputs, f"from {inputs}")
    return oracle.synthesize_inputs(graph, seed), oracle.input_rules(graph)


def describe_inputs(graph, feeds: dict[str, np.ndarray], sources: dict[str, str]) -> list[dict]:
    """The document's `inputs`: name, shape, dtype and source of each graph input."""
    return [
        {
            "name": name,
            "shape": list(feeds[name].shape),
            "dtype": str(feeds[name].dtype),
            "source": sources[name],
        }
        for name in graph.inputs
    ]


def check_reference(arrays: dict, graph) -> dict[str, np.ndarray]:
    """Reference outputs given as arrays (API): one per graph output, in its shape."""
    missing = [name for name in graph.outputs if name not in arrays]
    if missing:
        raise UserError(f"reference: no array for output(s) {', '.join(missing)}")
    result = {}
    for name in graph.outputs:
        info = graph.tensors[name]
        value = np.asarray(arrays[name])
        if tuple(value.shape) != tuple(info.shape):
            raise UserError(
                f"reference: output {name!r} has shape {tuple(value.shape)}, the model gives "
                f"{tuple(info.shape)}"
            )
        result[name] = value.astype(info.dtype.numpy)
    return result
