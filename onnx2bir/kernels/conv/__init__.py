"""The convolution kernels the conv selection names, and what they share."""
