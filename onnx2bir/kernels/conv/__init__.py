"""The convolution kernels the conv selection can name. Each kernel module declares the names
it answers to beside its tracer (`rep_nhwc`, `column_packing`, `depthwise`), and the conv
registry's rows name both (`patterns/conv/selection.py`). The experimental registry's two
kernels have names only: their rows are disabled (docs/conv_selection.md#registries).
"""

PBP_0F1B = "Conv2d_pbp_0f1b_0i1o_01fb_experimental_1"
PBP_FB01 = "Conv2d_pbp_fb01_io01_01bf_experimental_1"
