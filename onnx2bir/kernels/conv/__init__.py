"""The convolution kernels the conv selection names, declared once here: the registries
(`patterns/conv/selection.py`) write these names into a NativeKernel's `func_name`, and the
tracers register under them (`onnx2bir.kernels`). The two experimental names have no tracer:
their registry entries are disabled (docs/conv_selection.md#registries).
"""

REP_NHWC = "Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh"
COLUMN_PACKING = "conv2d_column_packing"
COLUMN_PACKING_1 = "conv2d_column_packing_1"
COLUMN_PACKING_IO10 = "conv2d_column_packing_io10"
CONV1D_DEPTHWISE = "Conv1d_depthwise_bf01_oi01_bf01"
CONV2D_DEPTHWISE = "conv2d_depthwise_f01b_o01i_bf01"
PBP_0F1B = "Conv2d_pbp_0f1b_0i1o_01fb_experimental_1"
PBP_FB01 = "Conv2d_pbp_fb01_io01_01bf_experimental_1"
KERNEL_NAMES = (
    REP_NHWC,
    COLUMN_PACKING,
    COLUMN_PACKING_1,
    COLUMN_PACKING_IO10,
    CONV1D_DEPTHWISE,
    CONV2D_DEPTHWISE,
    PBP_0F1B,
    PBP_FB01,
)
