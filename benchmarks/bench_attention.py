"""The attention kernel at long sequences: SBUF high-water mark and PE busy time per length.

Usage:
    python benchmarks/bench_attention.py                    # 4096, 16384, 32768; compile only
    python benchmarks/bench_attention.py --lengths 4096 --run   # also simulate and compare
    python benchmarks/bench_attention.py --lengths 4096 16384 --validate
        # the whole validation: verdict, bound, error and allowance, simulate and oracle time

Each case is one opset-23 `Attention` node, single head of dim 128, q/k/v [1, 1, S, 128],
causal or not, compiled with --enable-native-kernel-attention and
--enable-native-kernel-attention-bf16 (matmult-to-bf16). Printed per case: the SBUF high-water
mark in bytes per partition (the highest byte any SBUF tile reaches, the resident identity
included), the cost model's PE busy time and estimated total, the instruction count, and with
--run the largest |error| against onnxruntime. Speed is measured here, never in the tests.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onnx2bir.bir.enums import Engine, MemoryType  # noqa: E402
from onnx2bir.compiler import compile_model  # noqa: E402
from onnx2bir.options import CompileOptions  # noqa: E402
from onnx2bir.runtime.timing import cost  # noqa: E402

RAISE = CompileOptions(
    enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
)


def attention_model(seq: int, causal: bool, head_dim: int = 128) -> onnx.ModelProto:
    shape = [1, 1, seq, head_dim]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=int(causal))
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


def sb_high_water(module) -> int:
    """The highest SBUF byte offset any tile of the function reaches, per partition."""
    locations = module.functions[0].memory_locations.values()
    return max(
        loc.address + loc.bytes_per_partition for loc in locations if loc.memory is MemoryType.SB
    )


def measure(seq: int, causal: bool, run: bool) -> dict:
    model = attention_model(seq, causal)
    start = time.perf_counter()
    compilation = compile_model(model, RAISE)
    seconds = time.perf_counter() - start
    (entry,) = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    estimate = cost.estimate(compilation.module)
    result = {
        "seq": seq,
        "causal": causal,
        "target": entry["target"],
        "sb_high_water": sb_high_water(compilation.module),
        "pe_busy_us": estimate.busy_seconds.get(Engine.PE, 0.0) * 1e6,
        "estimated_us": estimate.total_seconds * 1e6,
        "instructions": sum(1 for _ in compilation.module.functions[0].instructions()),
        "compile_s": seconds,
    }
    if run:
        from onnx2bir.runtime.machine.interpreter import run_function
        from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

        feeds = synthesize_inputs(compilation.graph, 0)
        got = run_function(compilation.module, feeds)
        got = got.get("y", got.get("y:output"))
        expected = run_onnxruntime(model, feeds)["y"]
        result["max_abs_error"] = float(np.abs(got - expected).max())
    return result


def validate_case(seq: int, causal: bool) -> str:
    """One `onnx2bir validate` of the case, as a table row (docs/validation.md#online-softmax)."""
    import resource

    from onnx2bir.api import validate

    doc = validate(attention_model(seq, causal), options=RAISE).to_json()
    (out,) = doc["outputs"]
    times = doc["timings"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return (
        f"| {seq:,} | {'causal' if causal else 'none'} | {'PASS' if doc['passed'] else 'FAIL'} "
        f"| {out['bound']} | {out['max_abs_err']:.2g} | "
        f"{out.get('accumulation_allowance_max') or 0:.2g} | {times['simulate']:.1f} s "
        f"| {times['emulating_oracle']:.1f} s | {peak:.1f} GB (process peak so far) |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    parser.add_argument("--run", action="store_true", help="also simulate and compare")
    parser.add_argument("--validate", action="store_true", help="run the whole validation")
    args = parser.parse_args(argv)
    if args.validate:
        print(
            "| tokens | mask | verdict | bound | max abs error | allowance max | simulate "
            "| oracle | memory |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for seq in args.lengths:
            for causal in (False, True):
                print(validate_case(seq, causal), flush=True)
        return 0
    header = "seq     causal  SB bytes/partition  PE busy us  est. total us  instructions"
    print(header + ("  max|err|" if args.run else ""))
    for seq in args.lengths:
        rows = [measure(seq, causal, args.run) for causal in (False, True)]
        for row in rows:
            line = (
                f"{row['seq']:<7} {row['causal']!s:<7} {row['sb_high_water']:>18}  "
                f"{row['pe_busy_us']:>10.1f}  {row['estimated_us']:>13.1f}  "
                f"{row['instructions']:>12}"
            )
            if args.run:
                line += f"  {row['max_abs_error']:.3g}"
            print(line)
        ratio = rows[1]["pe_busy_us"] / rows[0]["pe_busy_us"]
        print(f"        causal / full PE busy: {ratio:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
