"""The native attention kernel: its arguments (`args`), its SBUF plan (`plan`) and its tracer
(`kernel`). Its CustomCall targets are declared once, here: the attention raise
(`patterns/attention/raising.py`) writes them, DecomposeAttention recognises them, and the
tracer registers under them.
"""

ATTENTION = "AttentionMMSoftmaxMM"  # the swap form: unequal query and key lengths
ATTENTION_WITHOUT_SWAP = "AttentionMMSoftmaxMMWithoutSwap"
CAUSAL_ATTENTION_WITHOUT_SWAP = "CausalAttentionMMSoftmaxMMWithoutSwap"
TARGETS = (ATTENTION, ATTENTION_WITHOUT_SWAP, CAUSAL_ATTENTION_WITHOUT_SWAP)
