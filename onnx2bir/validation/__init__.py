"""`onnx2bir validate`: compile, run on the machine, judge against the emulating oracle
(`run`), say it for a person (`text`), and find the first node that went wrong (`localize`,
`alone`)."""
