"""The flags of the model commands, in groups that each own their flags and their parsing.

A group registers its flags on a parser and turns the parsed namespace into the value a command
hands the API:

- `InputArgs`: --input-shape, --dim, --input-value (the API keywords `input_shapes`, `dims`,
  `input_values`) and validate's --inputs, --seed (an `InputOptions`);
- `CompileArgs`: --auto-cast ... --target, --dynamic-dma-sbuf-bytes, --no-memory-plan (a
  `CompileOptions`);
- `OutputArgs`: --json, --stats, --verbose, --debug (read by `main` and the commands);
- `ToleranceArgs`: --atol, --rtol, --tolerance, --op-tolerance, --tolerance-file (a
  `ToleranceOptions`);
- `ValidationRunArgs`: --reference, --max-drift, --localize, --localize-budget, --segments,
  --segment-memory, --jobs, --ray, --memory-limit, --check-races, --schedule, --no-progress (a
  `ValidationRunOptions`);
- `ValidationOutputArgs`: --save-inputs, --save-outputs and validate's --html (the files
  written).

Each flag is written once, in its group's `add_*` method; a field of an options dataclass that
a flag of the same name sets is read from the namespace by name (`_fields_from`). Where a flag
goes in --help is its `Section` (none: the parser's own "options"). A command's layout
(`add_model_arguments`, `add_validate_arguments`) calls the `add_*` methods in the order the
usage line lists the flags, which is why a group may have more than one: every command's usage
line keeps the order it has always had.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import weakref
from dataclasses import dataclass
from typing import Protocol

from onnx2bir import options as compile_options
from onnx2bir import output_paths
from onnx2bir.api.options import InputOptions, ToleranceOptions, ValidationRunOptions
from onnx2bir.cli import flag_values
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.schedule import SCHEDULE_HELP


class Flags(Protocol):
    """Where flags are added: a parser, or a section of its help."""

    def add_argument(self, *names: str, **how) -> argparse.Action: ...


@dataclass(frozen=True)
class Section:
    """A titled section of a command's --help, with an optional paragraph under the title."""

    title: str
    description: str | None = None

    def of(self, parser: argparse.ArgumentParser) -> Flags:
        """In: a parser. Out: this section of its help, added on first use (the sections are
        listed in the order of their first use)."""
        made = _SECTIONS.setdefault(parser, {})
        if self not in made:
            made[self] = parser.add_argument_group(self.title, self.description)
        return made[self]


_SECTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # parser -> {Section: group}


def _fields_from(args: argparse.Namespace, options_type: type, **computed):
    """In: the parsed namespace, an options dataclass, the fields computed from the flags.
    Out: the options, every other field read from the flag of its name."""
    named = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(options_type)
        if field.name not in computed
    }
    return options_type(**named, **computed)


class InputArgs:
    """Inputs: the shapes and values of the model's inputs (every model command) and the
    arrays validate feeds it (--inputs, --seed)."""

    def add_shape_arguments(self, parser: Flags) -> list[argparse.Action]:
        """--input-shape, --dim: sizes for the model's symbolic dimensions."""
        return [
            parser.add_argument(
                "--input-shape",
                action="append",
                type=flag_values.input_shape,
                default=[],
                metavar="NAME=D0,D1,...",
                help="fix the shape of input NAME (repeatable)",
            ),
            parser.add_argument(
                "--dim",
                action="append",
                type=flag_values.dim,
                default=[],
                metavar="SYMBOL=N",
                help="give symbolic dimension SYMBOL the size N (repeatable)",
            ),
        ]

    def add_value_arguments(self, parser: Flags) -> list[argparse.Action]:
        """--input-value: inputs made constants before folding."""
        return [
            parser.add_argument(
                "--input-value",
                action="append",
                type=flag_values.input_value,
                default=[],
                metavar="NAME=V[,V...]",
                help="fix input NAME to these values (its declared shape, row-major): it "
                "becomes a constant before folding, so an If or a shape it steers (a sample "
                "rate, a flag) folds away; validate feeds onnxruntime the same value "
                "(repeatable)",
            )
        ]

    def add_array_arguments(self, parser: Flags) -> list[argparse.Action]:
        """validate's --inputs and --seed: the arrays given, or the seed of random ones."""
        return [
            parser.add_argument(
                "--inputs",
                metavar="FILE.npz|DIR",
                help="input arrays by graph-input name: an .npz file, or an ONNX "
                "test_data_set_N folder of input_K.pb; their shapes fix the model's symbolic "
                "dimensions (default: seeded random; gather indices bounded by their table, "
                "attention masks in {0, 1})",
            ),
            parser.add_argument(
                "--seed",
                type=flag_values.seed,
                default=InputOptions.seed,
                help="seed for random inputs, 0 to 2^128-1 (default 0)",
            ),
        ]

    def shapes(self, args: argparse.Namespace) -> dict:
        """In: the parsed namespace. Out: the API keywords `input_shapes`, `dims` and
        `input_values`."""
        return {
            "input_shapes": dict(args.input_shape),
            "dims": dict(args.dim),
            "input_values": dict(args.input_value),
        }

    def options(self, args: argparse.Namespace) -> InputOptions:
        """In: the parsed namespace of validate. Out: its `InputOptions`."""
        return _fields_from(args, InputOptions, **self.shapes(args))

    def check_arrays(self, args: argparse.Namespace) -> None:
        """Refuse an --inputs that cannot be read, before any work."""
        from onnx2bir.runtime.oracle.input_files import check_inputs_source

        if args.inputs is not None:
            check_inputs_source(args.inputs)


class CompileArgs:
    """Compile options, spelled as the reference compiler spells them: the autocast, the
    native kernels, the target and the memory plan."""

    SECTION = Section("compile options (reference compiler spelling)")

    def add_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """The autocast, its exclusions, the native kernels and the target."""
        return (
            self.add_cast_arguments(parser)
            + self.add_exclusion_arguments(parser)
            + self.add_kernel_arguments(parser)
        )

    def add_cast_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--auto-cast, --auto-cast-type: the general autocast."""
        flags = self.SECTION.of(parser)
        return [
            flags.add_argument(
                "--auto-cast",
                default=compile_options.DEFAULT_AUTO_CAST,
                metavar="{" + ",".join(compile_options.AUTO_CAST_CHOICES) + "}",
                help="general autocast: matmult stores the operands of every MatMul, Gemm, "
                "Conv and ConvTranspose in --auto-cast-type (PSUM accumulates fp32), all also "
                "every fp32 intermediate, none keeps the model's dtypes; not applied to the "
                "raised attention kernel, which follows --native-kernel-cast-type (default "
                "%(default)s)",
            ),
            flags.add_argument(
                "--auto-cast-type",
                default=compile_options.DEFAULT_AUTO_CAST_TYPE,
                metavar="{" + ",".join(compile_options.AUTO_CAST_TYPES) + "}",
                help="dtype --auto-cast stores in; fp8_e4m3 saturates at +-448 (default "
                "%(default)s)",
            ),
        ]

    def add_exclusion_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--auto-cast-exclude, --auto-cast-exclude-file: nodes the autocast leaves in fp32,
        by the names of this model's nodes and op types."""
        flags = self.SECTION.of(parser)
        return [
            flags.add_argument(
                "--auto-cast-exclude",
                action="append",
                type=flag_values.exclude_list,
                default=[],
                metavar="NODE|OP_TYPE[,...]",
                help="keep these nodes, or every node of these op types, in fp32 under the "
                "general autocast (repeatable; each must name a node or an op type of the "
                "model; docs/autocast.md#exclude)",
            ),
            flags.add_argument(
                "--auto-cast-exclude-file",
                metavar="FILE",
                help="the same, one name per line (# starts a comment); debug precision writes one",
            ),
        ]

    def add_kernel_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """The native kernels' cast type and switches, and the target."""
        flags = self.SECTION.of(parser)
        return [
            flags.add_argument(
                "--native-kernel-cast-type",
                default=compile_options.DEFAULT_CAST_TYPE,
                metavar="WHAT-to-TYPE",
                help=f"storage dtype of the raised attention kernel's matmul operands, which "
                f"it follows instead of --auto-cast: {compile_options.CAST_TYPE_GRAMMAR}; "
                "default %(default)s",
            ),
            flags.add_argument(
                "--enable-native-kernel-attention",
                action="store_true",
                help="raise matmul-softmax-matmul attention to a native kernel",
            ),
            flags.add_argument(
                "--enable-native-kernel-attention-bf16",
                action="store_true",
                help="raise attention whatever the input dtype, with bf16 intermediates",
            ),
            flags.add_argument(
                "--experimental-convolution-kernel-match",
                action="store_true",
                help="also try the experimental convolution kernel registry",
            ),
            flags.add_argument(
                "--target",
                default=compile_options.DEFAULT_TARGET,
                choices=compile_options.KNOWN_TARGETS,
                help="target device name (default %(default)s; the attention raise fires "
                f"only for {compile_options.RAISE_TARGET})",
            ),
        ]

    def add_memory_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--dynamic-dma-sbuf-bytes, --no-memory-plan: what the program keeps in SBUF."""
        flags = self.SECTION.of(parser)
        return [
            flags.add_argument(
                "--dynamic-dma-sbuf-bytes",
                type=int,
                default=0,
                metavar="N",
                help="SBUF bytes per partition kept free for dynamic DMA; the attention raise "
                "counts them against the state buffer (default %(default)s)",
            ),
            flags.add_argument(
                "--no-memory-plan",
                action="store_true",
                help="keep every intermediate tensor in DRAM instead of planning SBUF homes "
                "(docs/memory_planner.md; validate --localize always does)",
            ),
        ]

    def options(self, args: argparse.Namespace) -> CompileOptions:
        """In: the parsed namespace. Out: its `CompileOptions` (the exclusion file read
        first); a value the options refuse raises `UserError`."""
        return _fields_from(
            args,
            CompileOptions,
            auto_cast_exclude=self._exclusions(args),
            memory_plan=not args.no_memory_plan,
        )

    def _exclusions(self, args: argparse.Namespace) -> tuple[str, ...]:
        """The names of --auto-cast-exclude (flattened) and of --auto-cast-exclude-file."""
        names = [name for group in args.auto_cast_exclude for name in group]
        if args.auto_cast_exclude_file is not None:
            names += compile_options.read_exclude_file(args.auto_cast_exclude_file)
        return tuple(dict.fromkeys(names))


class OutputArgs:
    """Output: the form of the output (--json, --stats) and the diagnostics (--verbose,
    --debug) of every model command."""

    def add_format_arguments(self, parser: Flags) -> list[argparse.Action]:
        """--json, --stats."""
        return [
            parser.add_argument(
                "--json",
                action="store_true",
                help="print one JSON document on stdout, errors included "
                '({"error": {"kind", "message"}})',
            ),
            parser.add_argument(
                "--stats",
                action="store_true",
                help="add the passes' statistic counters to the output (always in --json)",
            ),
        ]

    def add_diagnostic_arguments(self, parser: Flags) -> list[argparse.Action]:
        """--verbose, --debug."""
        return [
            parser.add_argument(
                "--verbose",
                action="store_true",
                help="log the passes' decisions on stderr (attention matches, casts, warnings)",
            ),
            parser.add_argument("--debug", action="store_true", help="show tracebacks on errors"),
        ]


class ToleranceArgs:
    """Tolerance: the bound each tensor of validate is judged by."""

    SECTION = Section(
        "tolerance",
        "An element passes when |machine - onnxruntime| <= atol + rtol*|onnxruntime|. "
        "The oracle is onnxruntime rounding where the program rounds (the autocast's casts), "
        "so the default is the fp32 bound, atol 1e-4 rtol 1e-3, for every tensor it emulates "
        "exactly; where it can only approximate (the raised attention kernel, an op that "
        "rounds inside itself, a model in fp16/bf16) a statistical bound growing with the "
        "reduction length and the number of such roundings; integers exact. A bound that "
        "would accept zeros (rtol >= 1, or atol >= the reference's RMS) fails as unverifiable. "
        "Strongest first: --tolerance, "
        "the file's tensors, --op-tolerance, the file's op_types, --atol/--rtol, the file's "
        "default and paths.",
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--atol, --rtol, --tolerance, --op-tolerance, --tolerance-file."""
        flags = self.SECTION.of(parser)
        return [
            flags.add_argument(
                "--atol", type=flag_values.tolerance, help="absolute tolerance for every tensor"
            ),
            flags.add_argument(
                "--rtol", type=flag_values.tolerance, help="relative tolerance for every tensor"
            ),
            flags.add_argument(
                "--tolerance",
                action="append",
                default=[],
                metavar="NAME=ATOL,RTOL",
                help="tolerance of one output or intermediate tensor (repeatable; leave a "
                "number empty to keep the default, e.g. logits=,1e-2)",
            ),
            flags.add_argument(
                "--op-tolerance",
                action="append",
                default=[],
                metavar="OP=ATOL,RTOL",
                help="tolerance of tensors produced by op type OP (repeatable)",
            ),
            flags.add_argument(
                "--tolerance-file",
                metavar="FILE.json",
                help='tolerances from JSON: {"default", "paths", "op_types", "tensors"}, '
                'each {"atol", "rtol"} (see onnx2bir.runtime.oracle.tolerance)',
            ),
        ]

    def options(self, args: argparse.Namespace) -> ToleranceOptions:
        """In: the parsed namespace. Out: its `ToleranceOptions`; a malformed --tolerance or
        --op-tolerance raises `UserError` (--tolerance first)."""
        return _fields_from(
            args,
            ToleranceOptions,
            tolerance=self._overrides(args.tolerance, "tolerance"),
            op_tolerance=self._overrides(args.op_tolerance, "op-tolerance"),
        )

    def _overrides(self, texts: list[str], flag: str) -> dict:
        """In: the texts of one repeatable flag (NAME=ATOL,RTOL). Out: {NAME: (atol, rtol)},
        a number left empty None."""
        from onnx2bir.runtime.oracle.tolerance import parse_override

        result = {}
        for text in texts:
            name, partial = parse_override(text, flag)
            result[name] = (partial.atol, partial.rtol)
        return result


class ValidationRunArgs:
    """Validation run: what validate checks besides the outputs and how it runs — drift,
    localisation, segments, the streams' order and races, the progress bar."""

    DRIFT = Section(
        "drift",
        "Each output's drift from plain fp32 onnxruntime (what the casts cost: cosine, SNR, "
        "max abs error, R = |machine - fp32| / |emulation - fp32|) is reported beside the "
        "verdict and changes it only through --max-drift (docs/validation.md#drift).",
    )
    LOCALISATION = Section("localisation")
    SEGMENTS = Section(
        "segments",
        "Cut the model into N consecutive pieces of about equal work and validate each on its "
        "own, from onnxruntime's values at its inputs, in parallel (docs/validation.md#segments)",
    )
    CONCURRENCY = Section(
        "concurrency",
        "Each engine and each DMA queue runs its own in-order stream; only the program's "
        "dependency edges order one stream against another.",
    )

    def add_drift_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--reference, --max-drift."""
        flags = self.DRIFT.of(parser)
        return [
            flags.add_argument(
                "--reference",
                metavar="FILE.npz|DIR",
                help="measure drift against these outputs (PyTorch's, say) instead of fp32 "
                "onnxruntime: an .npz keyed by output name, or a test_data_set folder of "
                "output_K.pb (whose input_K.pb are used when --inputs is not given); the "
                "verdict still compares with onnxruntime rounding where the program rounds",
            ),
            flags.add_argument(
                "--max-drift",
                action="append",
                default=[],
                metavar="KEY=VALUE[,...]",
                help="fail when an output drifts further: cosine=0.999 (at least), snr=30 (dB, "
                "at least), r=1.2 (at most); repeatable",
            ),
        ]

    def add_localize_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--localize, --localize-budget."""
        flags = self.LOCALISATION.of(parser)
        return [
            flags.add_argument(
                "--localize",
                action="store_true",
                help="compare every intermediate tensor with onnxruntime; report the "
                "first node over tolerance (its own error vs error carried in), the "
                "first NaN/inf, and each conv's kernel next to its error",
            ),
            flags.add_argument(
                "--localize-budget",
                type=flag_values.positive_megabytes,
                default=ValidationRunOptions.localize_budget,
                metavar="MB",
                help="onnxruntime holds at most this many MB of intermediates at once "
                "(default %(default)g)",
            ),
        ]

    def add_segment_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--segments, --segment-memory, --jobs, --ray, --memory-limit."""
        flags = self.SEGMENTS.of(parser)
        return [
            flags.add_argument(
                "--segments",
                type=flag_values.segment_count,
                metavar="N",
                help="validate in N segments; each one's error, wall time and peak memory are "
                "reported",
            ),
            flags.add_argument(
                "--segment-memory",
                type=flag_values.byte_size,
                metavar="SIZE",
                help="validate in as many segments as it takes for each to need at most SIZE "
                "(e.g. 6GiB) by the plan, and refuse a segment whose own estimate exceeds it "
                "(with --segments N: at least N)",
            ),
            flags.add_argument(
                "--jobs",
                type=flag_values.count,
                metavar="N",
                help="segments at a time, each in its own process (default: the CPU count)",
            ),
            flags.add_argument(
                "--ray",
                nargs="?",
                const="",
                default=None,
                metavar="ADDRESS",
                help="run each segment as a Ray task (a local Ray instance without ADDRESS); "
                "needs the extra onnx2bir[ray]",
            ),
            flags.add_argument(
                "--memory-limit",
                type=flag_values.byte_size,
                metavar="SIZE",
                help="refuse to start (exit 2) when the estimated peak memory exceeds SIZE, "
                "e.g. 6GiB (default: the memory available now); the message says how many "
                "--segments to use instead",
            ),
        ]

    def add_concurrency_arguments(self, parser: argparse.ArgumentParser) -> list[argparse.Action]:
        """--check-races, --schedule (validate's and run's)."""
        flags = self.CONCURRENCY.of(parser)
        return [
            flags.add_argument(
                "--check-races",
                action="store_true",
                help="run the happens-before race detector: two accesses to the same bytes "
                "from different streams, one writing, that no chain of edges orders are a "
                "race (fails)",
            ),
            flags.add_argument(
                "--schedule",
                default=ValidationRunOptions.schedule,
                metavar="S",
                help=f"execution order: {SCHEDULE_HELP}. program: one global program order; "
                "random:SEED: a seeded random interleaving of the streams that respects only "
                "stream order and the edges; timeline: the order the cost model starts "
                "instructions (default %(default)s)",
            ),
        ]

    def add_progress_argument(self, parser: Flags) -> list[argparse.Action]:
        """--no-progress."""
        return [
            parser.add_argument(
                "--no-progress",
                action="store_true",
                help="no progress bar (it is drawn on stderr only when stderr is a "
                "terminal and the simulation runs over a second)",
            )
        ]

    def options(self, args: argparse.Namespace) -> ValidationRunOptions:
        """In: the parsed namespace of validate (its --json too: a JSON document is drawn
        without a progress bar). Out: its `ValidationRunOptions`."""
        return _fields_from(
            args,
            ValidationRunOptions,
            progress=not args.no_progress and not args.json,
            use_ray=args.ray is not None,
            ray_address=args.ray or None,
        )


class ValidationOutputArgs:
    """Validation output: the files validate writes besides its document (the inputs used,
    the machine's outputs, the report page)."""

    def add_saved_array_arguments(self, parser: Flags) -> list[argparse.Action]:
        """--save-inputs, --save-outputs."""
        return [
            parser.add_argument(
                "--save-inputs",
                metavar="FILE.npz|DIR",
                help="write the inputs used (.npz, or a test_data_set folder)",
            ),
            parser.add_argument(
                "--save-outputs",
                metavar="FILE.npz|DIR",
                help="write the machine's (not onnxruntime's) outputs (.npz, or a "
                "test_data_set folder of output_K.pb)",
            ),
        ]

    def add_page_argument(self, parser: Flags) -> list[argparse.Action]:
        """validate's --html."""
        return [
            parser.add_argument(
                "--html",
                metavar="OUT.html",
                help="also write the report page with this run's errors (with --localize, the "
                "error of every node along the graph as a chart)",
            )
        ]

    def check(self, args: argparse.Namespace) -> None:
        """Refuse a file to write that cannot be written, before any work: the arrays'
        targets, then the page."""
        from onnx2bir.runtime.oracle.ort import check_arrays_target

        for path, stem in ((args.save_inputs, "input"), (args.save_outputs, "output")):
            if path is not None:
                check_arrays_target(path, stem)
        if args.html is not None:
            output_paths.check_file(args.html, "--html")

    def write(self, args: argparse.Namespace, result) -> None:
        """In: the namespace and validate's `ValidationResult`. Writes the files asked for,
        the page's path on stderr."""
        if args.save_inputs is not None:
            result.save_inputs(args.save_inputs)
        if args.save_outputs is not None:
            result.save_outputs(args.save_outputs)
        if args.html is not None:
            path = result.html(args.html)
            print(f"wrote {path}", file=sys.stderr)


INPUTS = InputArgs()
COMPILE = CompileArgs()
OUTPUT = OutputArgs()
TOLERANCE = ToleranceArgs()
VALIDATION_RUN = ValidationRunArgs()
VALIDATION_OUTPUT = ValidationOutputArgs()
INPUTS_AND_OUTPUTS = Section("inputs and outputs")  # validate's arrays in and out


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and the flags every model command takes (convert, validate, report, profile,
    debug reduce and precision), in the order of their usage line."""
    parser.add_argument("model", help="the ONNX model file")
    INPUTS.add_shape_arguments(parser)
    INPUTS.add_value_arguments(parser)
    COMPILE.add_arguments(parser)
    OUTPUT.add_format_arguments(parser)
    COMPILE.add_memory_arguments(parser)
    OUTPUT.add_diagnostic_arguments(parser)


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    """Validate's flags after the model commands' own, in the order of its usage line."""
    arrays = INPUTS_AND_OUTPUTS.of(parser)
    INPUTS.add_array_arguments(arrays)
    VALIDATION_OUTPUT.add_saved_array_arguments(arrays)
    TOLERANCE.add_arguments(parser)
    VALIDATION_RUN.add_drift_arguments(parser)
    VALIDATION_RUN.add_localize_arguments(parser)
    VALIDATION_OUTPUT.add_page_argument(parser)
    VALIDATION_RUN.add_segment_arguments(parser)
    VALIDATION_RUN.add_concurrency_arguments(parser)
    VALIDATION_RUN.add_progress_argument(parser)


def reproducing_flags() -> tuple[frozenset[str], frozenset[str]]:
    """The flags a command that shows a cut-down model's failure repeats from the command line
    that made it: the shapes and the compile options, but not --input-value (debug does not
    take it) nor the exclusions (they name the original model's nodes, which the cut-down
    model may not have).

    Out: (the flags that take a value, the switches)."""
    scratch = argparse.ArgumentParser(add_help=False)
    actions = (
        INPUTS.add_shape_arguments(scratch)
        + COMPILE.add_cast_arguments(scratch)
        + COMPILE.add_kernel_arguments(scratch)
        + COMPILE.add_memory_arguments(scratch)
    )
    with_value = {name for action in actions if action.nargs != 0 for name in action.option_strings}
    switches = {name for action in actions if action.nargs == 0 for name in action.option_strings}
    return frozenset(with_value), frozenset(switches)
