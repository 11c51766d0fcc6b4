"""Notes for flags that asked for something that did not happen, and why.

In: the compile options and the compilation (the passes' findings). Out: a list of
`{"flag", "message"}` notes, empty when every flag given had the effect its name promises.
convert, validate and report print them (text: `note: ...` lines; JSON: `"notes"`).

- `--enable-native-kernel-attention`: no attention block in the model, or blocks found but
  none raised (each reason with its count; the gates are in docs/attention.md#gates).
- `--enable-native-kernel-attention-bf16` without the master flag: it has no effect alone.
- `--experimental-convolution-kernel-match`: no convolution got an experimental kernel (the
  experimental registry is walked only for convolutions every functional entry refused).
- `--native-kernel-cast-type` other than the default while no attention block was raised: the
  cast policy applies to raised attention blocks only (docs/attention.md#cast-policy).
- `--target` other than `sunda` with the attention flag on: the raise is for `sunda` only.
- int64 tensors whose narrowing to int32 (the device has no int64 datapath) is not proven:
  one note per tensor the doubt comes from (flag "int64"; onnx2bir/codegen/narrowing.py).
- an `onnx.Attention` that neither the raise nor the decomposition takes (flag "model"): the
  node, both reasons, and whether its ONNX function body replaced it
  (patterns/attention/function_body.py).
- `--input-shape` that replaces a shape the model declares with fixed sizes (`shape_notes`):
  allowed, and said, since the model's own shapes may assume it (a Reshape to a fixed size).
"""

from __future__ import annotations

from collections import Counter

from onnx2bir.codegen.narrowing import narrowing_notes
from onnx2bir.compiler import Compilation
from onnx2bir.options import DEFAULT_CAST_TYPE, RAISE_TARGET, CompileOptions

# The experimental registry's entries, as the conv findings label them.
EXPERIMENTAL_ENTRIES = ("pbp_0f1b", "pbp_fb01")


def _findings(compilation: Compilation, pass_name: str) -> list[dict]:
    result = compilation.passes.result_of(pass_name)
    return list(result.findings) if result else []


def _counted(reasons: list[str]) -> str:
    counts = Counter(reasons)
    return "; ".join(
        f"{reason} (x{count})" if count > 1 else reason for reason, count in counts.most_common()
    )


def attention_notes(options: CompileOptions, compilation: Compilation) -> list[dict]:
    notes = []
    found = [
        a
        for a in _findings(compilation, "LowerToCustomNativeKernel")
        if a.get("is_attention", True)
    ]
    raised = [a for a in found if a.get("target")]
    flag = "--enable-native-kernel-attention"
    if options.enable_native_kernel_attention and not raised:
        if not found:
            decomposed = _findings(compilation, "DecomposeAttention")
            extra = (
                f"; {len(decomposed)} fused attention node(s) were decomposed into plain "
                "matmul-softmax-matmul instead"
                if decomposed
                else ""
            )
            message = (
                "nothing raised: the model has no matmul -> softmax -> matmul attention block"
                + extra
            )
        else:
            message = (
                f"nothing raised: {len(found)} attention block(s) found, none passed the "
                f"gates: {_counted([a.get('reason') or '?' for a in found])}. The gates "
                "(sequence > 1007, head dim <= 128, SBUF bytes, bf16 unless "
                "--enable-native-kernel-attention-bf16) are explained in "
                "docs/attention.md#gates"
            )
        notes.append({"flag": flag, "message": message})
    if options.enable_native_kernel_attention_bf16 and not options.enable_native_kernel_attention:
        notes.append(
            {
                "flag": "--enable-native-kernel-attention-bf16",
                "message": "no effect on its own: it widens the attention raise to fp32/fp16 "
                "tensors, and the raise needs --enable-native-kernel-attention",
            }
        )
    if options.native_kernel_cast_type != DEFAULT_CAST_TYPE and not raised:
        notes.append(
            {
                "flag": "--native-kernel-cast-type",
                "message": f"{options.native_kernel_cast_type} changed nothing: the cast "
                "policy applies only to raised attention blocks, and none was raised",
            }
        )
    if options.target != RAISE_TARGET and options.enable_native_kernel_attention:
        notes.append(
            {
                "flag": "--target",
                "message": f"target {options.target!r}: the attention raise fires only for "
                f"{RAISE_TARGET!r} (docs/attention.md#gates)",
            }
        )
    return notes


def attention_body_notes(compilation: Compilation) -> list[dict]:
    """A note per onnx.Attention DecomposeAttention handed to the function body."""
    return [
        {"flag": "model", "message": finding["note"]}
        for finding in _findings(compilation, "DecomposeAttention")
        if finding.get("note")
    ]


def conv_notes(options: CompileOptions, compilation: Compilation) -> list[dict]:
    if not options.experimental_convolution_kernel_match:
        return []
    convs = _findings(compilation, "TransformConvOp")
    experimental = [c for c in convs if c.get("registry_entry") in EXPERIMENTAL_ENTRIES]
    if experimental:
        return []
    flag = "--experimental-convolution-kernel-match"
    if not convs:
        return [{"flag": flag, "message": "no effect: the model has no 2-D convolution"}]
    functional = sum(1 for c in convs if c.get("kernel"))
    refused = [
        f"{step['entry']}: {step['refused']}"
        for c in convs
        if not c.get("kernel")
        for step in c["walk"]
        if step["entry"] in EXPERIMENTAL_ENTRIES
    ]
    message = (
        f"no effect: none of the {len(convs)} convolution(s) got an experimental kernel. "
        f"{functional} matched a functional-registry kernel first (the experimental registry "
        "is walked only after every functional entry refused)"
    )
    if refused and all("disabled" in r for r in refused):
        message += (
            "; both experimental entries (the pbp kernels) are disabled, as in the reference "
            "compiler: their matchers accept no convolution, so this flag cannot change a "
            "selection today"
        )
    elif refused:
        message += f"; the experimental entries refused the rest: {_counted(refused)}"
    message += " (docs/conv_selection.md#registries)"
    return [{"flag": flag, "message": message}]


def shape_notes(model, input_shapes: dict) -> list[dict]:
    """A note per `--input-shape` that overrides an input the model declares as static."""
    if not input_shapes:
        return []
    from onnx2bir.frontend.importer import read_model, runtime_inputs

    notes = []
    for value in runtime_inputs(read_model(model, weights=False)):
        dims = value.type.tensor_type.shape.dim
        declared = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        wanted = input_shapes.get(value.name)
        if wanted is None or None in declared or not declared or tuple(declared) == tuple(wanted):
            continue
        notes.append(
            {
                "flag": "--input-shape",
                "message": f"input {value.name!r}: the model declares the fixed shape "
                f"{'x'.join(map(str, declared))}; it runs as {'x'.join(map(str, wanted))} "
                "instead (onnxruntime gets a copy with that input relaxed)",
            }
        )
    return notes


def flag_notes(options: CompileOptions, compilation: Compilation) -> list[dict]:
    """Every note for these options on this compilation (module docstring), and the int64
    tensors whose narrowing to int32 is not proven (`narrowing_notes`)."""
    return (
        [{"flag": "model", "message": text} for text in compilation.graph.import_notes]
        + attention_notes(options, compilation)
        + attention_body_notes(compilation)
        + conv_notes(options, compilation)
        + narrowing_notes(compilation.int64)
    )
