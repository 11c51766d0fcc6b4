"""The API's shared pieces: how a model is given and how options are named.

Compile options are the fields of `CompileOptions`, named as the command-line flags with `-`
spelled `_`; an unknown name is refused with the valid ones listed.

`validate`'s own options come in three groups, each a frozen dataclass whose fields are named
as the flags: `InputOptions` (the inputs' shapes, values and seed), `ToleranceOptions` (the
bound each tensor is judged by) and `ValidationRunOptions` (how the run is checked: localize,
drift, races, segments). `validate` takes a whole group (`tolerance_options=...`) or its fields
as keywords (`atol=1e-3`), keywords overriding the group's fields, as compile options do.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import onnx

from onnx2bir.options import CompileOptions

ModelSource = str | os.PathLike | onnx.ModelProto
OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CompileOptions))
DEFAULT_LOCALIZE_BUDGET_MB = 256.0  # --localize-budget
PerTensorTolerance = Mapping[str, tuple[float | None, float | None]]


def compile_options(options: CompileOptions | None = None, **overrides) -> CompileOptions:
    """`options` (default: the defaults) with the named fields replaced; unknown names are
    refused with the valid ones listed."""
    unknown = sorted(set(overrides) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"unknown compile option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(OPTION_NAMES)}"
        )
    return dataclasses.replace(options or CompileOptions(), **overrides)


def model_label(model: ModelSource) -> str:
    return "<ModelProto>" if isinstance(model, onnx.ModelProto) else str(model)


@dataclass(frozen=True)
class InputOptions:
    """How the model's inputs are sized and filled.

    `input_shapes` {input: shape} (`--input-shape`) and `dims` {symbol: size} (`--dim`) fix
    symbolic dimensions; `input_values` {input: values} (`--input-value`) makes inputs
    constants before folding; `seed` (`--seed`) seeds the random inputs made when none are
    given.
    """

    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    dims: Mapping[str, int] | None = None
    input_values: Mapping[str, object] | None = None
    seed: int = 0


@dataclass(frozen=True)
class ToleranceOptions:
    """The bound each tensor is judged by (docs/validation.md#verdict), None keeping the
    default.

    `atol` and `rtol` for every tensor (`--atol`, `--rtol`); `tolerance` {tensor: (atol, rtol)}
    (`--tolerance`) and `op_tolerance` {op type: (atol, rtol)} (`--op-tolerance`), either
    number None to keep the default; `tolerance_file` a JSON file of them
    (`--tolerance-file`).
    """

    atol: float | None = None
    rtol: float | None = None
    tolerance: PerTensorTolerance | None = None
    op_tolerance: PerTensorTolerance | None = None
    tolerance_file: str | os.PathLike | None = None


@dataclass(frozen=True)
class ValidationRunOptions:
    """How the validation runs and what it checks besides the outputs.

    `localize` compares every intermediate tensor, onnxruntime holding at most
    `localize_budget` MB of them at once; `progress` draws a progress bar on stderr;
    `schedule` ("program", "random:SEED", "timeline") orders the engines' streams and
    `check_races` runs the race detector (a race fails); `reference` (an .npz, a
    test_data_set folder or arrays) is what drift is measured against instead of plain fp32
    onnxruntime, and `max_drift` ("cosine=0.999,snr=30,r=1.2", a list of such, or
    {"cosine": 0.999}) makes drift a gate; `segments` cuts the model into that many pieces
    (`segment_memory`, bytes: into as many as it takes for each to fit that;
    docs/validation.md#segment-memory),
    `jobs` processes at a time or as Ray tasks (`use_ray`, `ray_address`;
    docs/validation.md#segments); `memory_limit` (bytes) refuses a run whose estimated peak
    exceeds it, before any work (default: the memory available; docs/input_contracts.md#memory).
    """

    localize: bool = False
    localize_budget: float = DEFAULT_LOCALIZE_BUDGET_MB
    progress: bool = False
    schedule: str = "program"
    check_races: bool = False
    reference: str | os.PathLike | Mapping[str, np.ndarray] | None = None
    max_drift: str | list[str] | Mapping[str, float] | None = None
    segments: int | None = None
    segment_memory: int | None = None
    jobs: int | None = None
    use_ray: bool = False
    ray_address: str | None = None
    memory_limit: int | None = None


VALIDATE_GROUPS = (InputOptions, ToleranceOptions, ValidationRunOptions)


class ValidateOptions(NamedTuple):
    """Every option of one `validate` call, each group whole."""

    compile: CompileOptions
    inputs: InputOptions
    tolerance: ToleranceOptions
    run: ValidationRunOptions


def validate_options(
    options: CompileOptions | None,
    groups: tuple[InputOptions | None, ToleranceOptions | None, ValidationRunOptions | None],
    keywords: Mapping[str, object],
) -> ValidateOptions:
    """`validate`'s options, from the groups it was given and its keywords.

    In: the compile options, the three groups of `VALIDATE_GROUPS` (None: the defaults), and
    the keywords. Out: each group with the keywords named as its fields replaced; the other
    keywords are compile options (an unknown name is refused as `compile_options` does).
    """
    rest = dict(keywords)
    filled = []
    for group_type, given in zip(VALIDATE_GROUPS, groups, strict=True):
        own = {f.name: rest.pop(f.name) for f in dataclasses.fields(group_type) if f.name in rest}
        filled.append(dataclasses.replace(given or group_type(), **own))
    return ValidateOptions(compile_options(options, **rest), *filled)
