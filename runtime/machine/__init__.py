"""The machine: the NeuronCore model that runs BIR instruction by instruction (state,
instruction semantics, interpreter, schedules and the race detector)."""
