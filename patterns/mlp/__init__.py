"""The MLP raise (LowerToNKIKernelCC): dot → elementwise chain → dot to AwsNeuronMLPNKI."""
