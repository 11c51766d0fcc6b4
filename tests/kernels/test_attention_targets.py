"""The three attention targets emit the QKᵀ matmul as their names say, and each one matches
onnxruntime (docs/attention_kernel.md#targets).

AttentionMMSoftmaxMM swaps the operand roles of QKᵀ: a K tile is the stationary operand and
the query group the moving one, so the scores come out as Sᵀ [keys, rows] and are transposed
back. The two WithoutSwap targets keep the query group (qᵀ) stationary; the causal one also
skips the key tiles above the diagonal. The cases reuse the model builder and the bf16 bound
of test_attention_kernel.py.
"""

from __future__ import annotations

import json
import math

import pytest
from test_attention_kernel import Attention, half_tol, kernel_matmuls, run

from onnx2bir.bir.enums import Dtype

SWAP, WITHOUT_SWAP, CAUSAL = (
    "AttentionMMSoftmaxMM",
    "AttentionMMSoftmaxMMWithoutSwap",
    "CausalAttentionMMSoftmaxMMWithoutSwap",
)


def tile_of(module, ap) -> str:
    """The SBUF tile tag of an operand: 'attention/qT#3' → 'qT'."""
    name = module.functions[0].memory_locations[ap.loc].name
    return name.split("/")[-1].split("#")[0]


def qk_matmuls(module) -> list[tuple[str, str]]:
    """(stationary, moving) tile tags of the matmuls that read the resident K."""
    pairs = [
        (tile_of(module, i.srcs["stationary"]), tile_of(module, i.srcs["moving"]))
        for i in kernel_matmuls(module)
    ]
    return [pair for pair in pairs if "k" in pair]


def block(sq: int, sk: int, d: int, target: str) -> Attention:
    att = Attention((1, 2, sq, d), (1, 2, d, sk), (1, 2, sk, 48)).scale(1 / math.sqrt(d))
    return att.causal(sq, sk) if target == CAUSAL else att


# Unequal lengths (what selects the swap target), key tiles of several 128-key slices with a
# ragged last one, and D = 160 so QKᵀ accumulates over two slices of D.
SHAPES = [(130, 200, 64), (70, 300, 160), (150, 40, 64)]


@pytest.mark.parametrize("sq, sk, d", SHAPES)
@pytest.mark.parametrize("target", [SWAP, WITHOUT_SWAP, CAUSAL])
def test_target_sets_the_stationary_operand_and_matches_onnxruntime(target, sq, sk, d):
    model, graph = block(sq, sk, d, target).fused(storage="bfloat16", target=target)
    module, _, _ = run(model, graph, tol=half_tol(Dtype.BF16, d, 1 / math.sqrt(d)))
    pairs = qk_matmuls(module)
    assert pairs, "no QKᵀ matmul"
    expected = ("k", "qT") if target == SWAP else ("qT", "k")
    assert pairs[0] == expected
    assert set(pairs) == {expected}
    names = {tile_of(module, i.srcs["stationary"]) for i in kernel_matmuls(module)}
    # Only the swap target stages Sᵀ and transposes it back through the PE.
    assert ("sT" in names) == (target == SWAP)


def test_swap_target_fp32_matches_onnxruntime_with_a_mask():
    """fp32 storage, an additive padding mask and a late scale after the transpose back."""
    att = Attention((1, 2, 20, 8), (1, 2, 8, 33), (1, 2, 33, 12)).scale(0.3)
    att.add("mask", (1, 1, 20, 33))
    att.scale(0.5)
    module, _, _ = run(*att.fused(target=SWAP))
    assert qk_matmuls(module)[0] == ("k", "qT")


def test_swap_target_over_several_key_sections():
    """64-key tiles make 1024-key sections: 1100 keys take two, so the stationary K slices are
    addressed inside the second resident section too."""
    att = Attention((1, 1, 90, 32), (1, 1, 32, 1100), (1, 1, 1100, 16)).scale(0.2)
    model, graph = att.fused(target=SWAP)
    graph.node("attention")["attrs"]["backend_config"] = json.dumps({"sb_shape": [64, 64]})
    module, _, _ = run(model, graph)
    locs = module.functions[0].memory_locations
    assert any(name.endswith("/state") for name in locs)
    assert qk_matmuls(module)[0] == ("k", "qT")
