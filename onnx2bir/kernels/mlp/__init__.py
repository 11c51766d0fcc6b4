"""The fused MLP kernel (`kernel`) behind the AwsNeuronMLPNKI CustomCall; its target is
declared once, here, for the MLP raise (`patterns/mlp/raising.py`) and the tracer."""

TARGET = "AwsNeuronMLPNKI"
