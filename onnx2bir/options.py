"""Compile options, one immutable object, spelled as in the reference compiler.

`native_kernel_cast_type` follows the grammar `<what>-to-<type>` with what ∈ {matmult, all}
and type ∈ {bf16, fp16}; the default `matmult-to-bf16` (docs/attention.md#cast-policy). The policy
sets the *storage* dtype of a native kernel's matmul operands and intermediates, never the
accumulation dtype: PSUM accumulates in fp32 whatever is cast (docs/attention.md#cast-policy).
`enable_native_kernel_attention` and `enable_native_kernel_attention_bf16` gate the attention raise
(both default off); `experimental_convolution_kernel_match` opens the experimental conv kernel
registry (docs/conv_selection.md#registries, default off). The target names the device the attention
raise is allowed for (the reference compiler compares it with "sunda").

`auto_cast` and `auto_cast_type` are the reference compiler's general autocast
(docs/autocast.md): `matmult` stores the operands of every PE matmul (MatMul, Gemm, Conv,
ConvTranspose, the MLP kernel) in `auto_cast_type`, PSUM still accumulating in fp32; `all` also
stores every fp32 intermediate tensor in it; `none` keeps the model's dtypes. The default,
matmult / bf16, is the reference compiler's documented default: what the device computes.
The raised attention kernel does not follow them: it follows `native_kernel_cast_type`, as
the reference compiler runs no general autocast over native kernels.
`auto_cast_exclude` names nodes and op types the general autocast leaves in fp32; the reference
compiler has no such option (docs/autocast.md#exclude).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onnx2bir.errors import UserError

CAST_WHAT = ("matmult", "all")
CAST_TYPES = ("bf16", "fp16")
DEFAULT_CAST_TYPE = "matmult-to-bf16"
DEFAULT_TARGET = "sunda"
# The target the attention raise fires for (docs/attention.md#gates), and the device names a
# user may give; any other name is a typo, refused with this list.
RAISE_TARGET = "sunda"
KNOWN_TARGETS = ("sunda", "inf2", "trn1", "trn1n", "trn2")
AUTO_CAST_CHOICES = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")
DEFAULT_AUTO_CAST = "matmult"  # the device's numbers by default (docs/autocast.md)
DEFAULT_AUTO_CAST_TYPE = "bf16"
CAST_TYPE_GRAMMAR = (
    "<what>-to-<type> with <what> one of matmult, all and <type> one of bf16, fp16 "
    "(e.g. matmult-to-bf16)"
)


def parse_cast_type(text: str) -> tuple[str, str]:
    """Split a cast-type string into (what, type), rejecting anything off the grammar."""
    what, sep, cast_type = text.partition("-to-")
    if not sep or what not in CAST_WHAT or cast_type not in CAST_TYPES:
        raise UserError(
            f"--native-kernel-cast-type {text!r} is not valid: expected {CAST_TYPE_GRAMMAR}"
        )
    return what, cast_type


@dataclass(frozen=True)
class CompileOptions:
    native_kernel_cast_type: str = DEFAULT_CAST_TYPE
    enable_native_kernel_attention: bool = False
    enable_native_kernel_attention_bf16: bool = False
    experimental_convolution_kernel_match: bool = False
    target: str = DEFAULT_TARGET
    # SBUF bytes per partition kept free for dynamic DMA; the attention raise counts them
    # against the state buffer before it raises a block (reference: dynamic-dma-sbuf-bytes).
    dynamic_dma_sbuf_bytes: int = 0
    auto_cast: str = DEFAULT_AUTO_CAST
    auto_cast_type: str = DEFAULT_AUTO_CAST_TYPE
    # Keep tensors that fit in SBUF between producer and consumers (docs/memory_planner.md);
    # off, every node's result goes back to DRAM (what `validate --localize` reads).
    memory_plan: bool = True
    # Nodes (by name) and op types whose PE operands the general autocast leaves in fp32
    # (`--auto-cast-exclude`, docs/autocast.md#exclude); each must name a node or an op type
    # of the model.
    auto_cast_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        parse_cast_type(self.native_kernel_cast_type)
        if self.target not in KNOWN_TARGETS:
            raise UserError(
                f"--target {self.target!r} is not a known target: expected one of "
                f"{', '.join(KNOWN_TARGETS)} (the attention raise fires only for "
                f"{RAISE_TARGET!r})"
            )
        if not isinstance(self.dynamic_dma_sbuf_bytes, int) or self.dynamic_dma_sbuf_bytes < 0:
            raise UserError(
                f"--dynamic-dma-sbuf-bytes {self.dynamic_dma_sbuf_bytes!r} is not valid: "
                "expected a byte count >= 0"
            )
        if isinstance(self.auto_cast_exclude, str) or not all(
            isinstance(entry, str) and entry for entry in self.auto_cast_exclude
        ):
            raise UserError(
                f"--auto-cast-exclude {self.auto_cast_exclude!r} is not valid: expected node "
                "names or op types"
            )
        object.__setattr__(self, "auto_cast_exclude", tuple(self.auto_cast_exclude))
        for flag, value, valid in (
            ("--auto-cast", self.auto_cast, AUTO_CAST_CHOICES),
            ("--auto-cast-type", self.auto_cast_type, AUTO_CAST_TYPES),
        ):
            if value not in valid:
                raise UserError(
                    f"{flag} {value!r} is not valid: expected one of {', '.join(valid)}"
                )

    def to_json(self) -> dict:
        """The options as JSON values (the exclusion list a list)."""
        doc = dataclasses.asdict(self)
        doc["auto_cast_exclude"] = list(self.auto_cast_exclude)
        return doc

    @property
    def autocast_text(self) -> str:
        """How the report and validate show the general autocast: "matmult -> bf16", "none"
        ("matmult -> bf16, 3 excluded" with --auto-cast-exclude)."""
        if self.auto_cast == "none":
            return "none"
        text = f"{self.auto_cast} -> {self.auto_cast_type}"
        names = self.auto_cast_exclude
        if names:
            text += ", excluding " + (
                ", ".join(names) if len(names) <= 3 else f"{len(names)} names (--json lists them)"
            )
        return text

    @property
    def what_to_cast(self) -> str:
        return parse_cast_type(self.native_kernel_cast_type)[0]

    @property
    def cast_type(self) -> str:
        return parse_cast_type(self.native_kernel_cast_type)[1]


def read_exclude_file(path) -> list[str]:
    """The names of an `--auto-cast-exclude-file`: one per line, `#` starts a comment, blank
    lines are skipped."""
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--auto-cast-exclude-file {path}: cannot be read ({exc})") from None
    names = []
    for line in text.splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names
