"""The fused MLP kernel behind the AwsNeuronMLPNKI CustomCall."""
