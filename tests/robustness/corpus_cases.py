"""The robustness corpus: each defect onnx2bir once had, with the exit status and message it
must now give. Models are the files in `corpus/` (written by `corpus/make_corpus.py`); flag
cases run against `corpus/ok.onnx`. `{tmp}` in an argument is a fresh temporary folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
OK = CORPUS / "ok.onnx"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    argv: tuple[str, ...]
    exit: int
    message: str  # a fragment of the one line on stderr

    def args(self, tmp: Path) -> list[str]:
        return [a.replace("{tmp}", str(tmp)) for a in self.argv]


def _model(name: str, message: str, command: str = "validate", exit: int = 2) -> Case:
    out = ("-o", "{tmp}/out") if command == "convert" else ()
    return Case(name, (command, str(CORPUS / f"{name}.onnx"), *out), exit, message)


def _flag(name: str, message: str, *flags: str, command: str = "validate") -> Case:
    return Case(name, (command, str(OK), *flags), 2, message)


MODEL_CASES = [
    _model("no_outputs", "the graph lists no outputs"),
    _model("empty_graph", "the graph lists no outputs", command="convert"),
    _model("conv_group_exceeds_channels", "group 8 does not divide the input's 4 channels"),
    _model("conv_rank1_weight", "node name: conv"),
    _model("conv_channels_disagree", "node 'conv' (Conv): weight 'w' [8, 3, 3, 3]"),
    _model("conv_channels_disagree", "the input has 4", command="report"),
    _model("conv_bad_auto_pad", "auto_pad 'BOGUS' is not one of"),
    _model("conv_zero_stride", "strides must only contain positive values"),
    _model("conv_negative_pad", "pads must not contain negative values"),
    _model("opset_99", "ai.onnx opset 99"),
    _model("layernorm_axis_out_of_range", "axis 7 is out of range for input 'x' of rank 4"),
    _model("mlp_com_microsoft_matmul", "com.microsoft.MatMul"),
    _model("gather_constant_index_out_of_range", "constant index 4611686018427387904 in 'idx'"),
    _model("gather_runtime_table_constant_index", "is outside [-10, 10) along axis 0 of 't'"),
    _model("gather_nd_index_out_of_range", "constant index 9 in 'idx' is outside [-4, 4)"),
    _model("tensor_of_2_40_elements", "more than the modelled device DRAM"),
    _model("tensor_of_2_40_elements", "more than the modelled device DRAM", command="convert"),
    _model("invalid_utf8_name", "is not valid UTF-8 text"),
    _model("ext_negative_length", "external-data length -4 is negative"),
]

FLAG_CASES = [
    _flag("budget_nan", "argument --localize-budget: 'nan'", "--localize-budget", "nan"),
    _flag("budget_inf", "argument --localize-budget: 'inf'", "--localize-budget", "inf"),
    _flag("budget_1e308", "argument --localize-budget: '1e308'", "--localize-budget", "1e308"),
    _flag("seed_negative", "argument --seed", "--seed", "-1"),
    _flag("seed_words", "argument --seed", "--seed", "one"),
    _flag("dim_superscript", "argument --dim: N: '²' is not a positive integer", "--dim", "N=²"),
    _flag("dim_2_63", "out of range", "--dim", f"N={1 << 63}"),
    _flag("shape_2_63", "out of range", "--input-shape", f"x=1,4,8,{1 << 63}"),
    _flag(
        "shape_huge", "more than the modelled device DRAM", "--input-shape", "x=1,4,8,1099511627776"
    ),
    _flag("atol_nan", "argument --atol", "--atol", "nan"),
    _flag("rtol_negative", "argument --rtol", "--rtol", "-1"),
    _flag("unknown_flag", "unrecognized arguments: --frobnicate", "--frobnicate"),
    _flag("inputs_fifo", "not a regular file or a folder", "--inputs", "{tmp}/fifo"),
    _flag("inputs_empty", "--inputs: the path is empty", "--inputs", ""),
    _flag("inputs_strings", "holds text values", "--inputs", "{tmp}/strings.npz"),
    _flag("inputs_complex", "holds complex", "--inputs", "{tmp}/complex.npz"),
    _flag("inputs_structured", "holds structured or void", "--inputs", "{tmp}/structured.npz"),
    _flag("inputs_void", "holds structured or void", "--inputs", "{tmp}/void.npz"),
    _flag("inputs_datetime", "holds datetime", "--inputs", "{tmp}/datetime.npz"),
    _flag("inputs_huge_shape", "has shape (1048576, 1048576)", "--inputs", "{tmp}/huge.npz"),
    _flag("tolerance_400_digits", "must be a finite number", "--tolerance-file", "{tmp}/t400.json"),
    _flag("tolerance_deep", "nests too deeply", "--tolerance-file", "{tmp}/deep.json"),
    _flag("tolerance_fifo", "not a regular file", "--tolerance-file", "{tmp}/fifo"),
    _flag("save_inputs_proc", "cannot write there", "--save-inputs", "/proc/onnx2bir/x.npz"),
    _flag("save_outputs_folder", "is a folder", "--save-outputs", "{tmp}/folder.npz"),
    _flag("save_outputs_long", "longer than 255 bytes", "--save-outputs", "{tmp}/" + "n" * 300),
    _flag("annotate_proc", "cannot write there", "--annotate", "/proc/x.onnx", command="report"),
    _flag("annotate_folder", "is a folder", "--annotate", "{tmp}", command="report"),
    Case("convert_empty_output", ("convert", str(OK), "-o", ""), 2, "-o: the path is empty"),
    Case("convert_into_proc", ("convert", str(OK), "-o", "/proc/onnx2bir"), 2, "cannot write"),
    Case("model_fifo", ("report", "{tmp}/fifo"), 2, "not a regular file"),
    Case("usage_no_command", (), 2, "the following arguments are required: command"),
    Case("usage_bad_command", ("frobnicate",), 2, "invalid choice"),
]

CASES = MODEL_CASES + FLAG_CASES
