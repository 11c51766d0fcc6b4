"""`onnx2bir run` on a hand-built BIR module, as the hardware-rule tests use it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from onnx2bir.bir.ir import Module
from onnx2bir.bir.json_io import write_module
from onnx2bir.cli.commands import main
from onnx2bir.runtime.oracle.ort import save_arrays


def run_program(
    tmp_path: Path, module: Module, inputs: dict[str, np.ndarray], capsys
) -> tuple[int, str, dict[str, np.ndarray]]:
    """Write `module`, run it with `inputs`; (exit status, stderr, saved outputs or {})."""
    folder = tmp_path / "program"
    folder.mkdir(exist_ok=True)
    write_module(module, folder, module.name)
    feeds = save_arrays(tmp_path / "in.npz", inputs, "input")
    outputs = tmp_path / "out.npz"
    outputs.unlink(missing_ok=True)
    capsys.readouterr()
    program = str(folder / f"{module.name}.bir.json")
    code = main(["run", program, "--inputs", str(feeds), "--save-outputs", str(outputs)])
    err = capsys.readouterr().err
    if code != 0:
        return code, err, {}
    with np.load(outputs) as saved:
        return code, err, {name: saved[name] for name in saved.files}
