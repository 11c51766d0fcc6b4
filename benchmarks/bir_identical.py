"""Whether a change to code generation changed any BIR: hashes of every model's BIR JSON and
constants, under each option set, in two trees compared.

Usage:
    python benchmarks/bir_identical.py tree /tmp/base                      # HEAD, alone
    python benchmarks/bir_identical.py tree /tmp/mine --overlay onnx2bir/codegen onnx2bir/kernels
    python /tmp/base/benchmarks/bir_identical.py hashes --out before.json
    python /tmp/mine/benchmarks/bir_identical.py hashes --out after.json
    python benchmarks/bir_identical.py compare before.json after.json

`tree` writes the files of a revision (default HEAD) to a folder, importable on its own
(PYTHONPATH), with the given paths copied over from this working tree: two trees made from one
revision differ only in those paths, whatever else changes in the working tree meanwhile.
`hashes` converts, with the onnx2bir of the tree it lives in, every model of `models/*.onnx`,
`models/hf`, `models/idioms`, `models/quantized` and `models/decode` (read from this checkout)
under each option set of `SETS`, one `onnx2bir convert` process per model and set, `-j` at a
time, and writes the SHA-256 of each `.bir.json` and `.consts.bin` (or the error) to a JSON
file. `compare` prints the entries that differ and exits 1 when one does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("", "hf", "idioms", "quantized", "decode")
SETS = {
    "default": [],
    "auto-cast-all": ["--auto-cast", "all"],
    "attention": ["--enable-native-kernel-attention", "--enable-native-kernel-attention-bf16"],
}
TREE_PATHS = ("onnx2bir", "patterns", "runtime", "pyproject.toml")


def models(checkout: Path) -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((checkout / "models" / folder).glob("*.onnx"))]


def make_tree(folder: Path, revision: str, overlay: list[str]) -> None:
    """The package files of `revision` in `folder`, with `overlay` from this working tree."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "--", *TREE_PATHS],
        check=True,
        capture_output=True,
    ).stdout
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(folder, filter="data")
    for path in [*overlay, "benchmarks/bir_identical.py"]:
        source, target = ROOT / path, folder / path
        if target.is_dir():
            shutil.rmtree(target)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    # The installed package maps onnx2bir.runtime and onnx2bir.patterns to the checkout's
    # folders (pyproject's package-dir); the tree imports its own through links.
    (folder / "onnx2bir" / "runtime").symlink_to("../runtime")
    (folder / "onnx2bir" / "patterns").symlink_to("../patterns")
    (folder / "CHECKOUT").write_text(str(ROOT))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _convert(tree: Path, model: Path, flags: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bir_identical_") as out:
        command = [sys.executable, "-m", "onnx2bir", "convert", str(model), "-o", out, *flags]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        stem = model.name.removesuffix(".onnx")
        return {
            "bir": _digest(Path(out) / f"{stem}.bir.json"),
            "consts": _digest(Path(out) / f"{stem}.consts.bin"),
        }


def hashes(out: Path, jobs: int, only: str | None) -> None:
    """Every model under every option set, hashed with this tree's onnx2bir."""
    marker = ROOT / "CHECKOUT"
    checkout = Path(marker.read_text()) if marker.exists() else ROOT
    work = [
        (model, label)
        for model in models(checkout)
        for label in SETS
        if only is None or only in str(model)
    ]

    def one(entry: tuple[Path, str]) -> tuple[str, dict]:
        model, label = entry
        key = f"{model.relative_to(checkout / 'models')} [{label}]"
        found = _convert(ROOT, model, SETS[label])
        print(f"{key}: {found.get('error', 'ok')}", file=sys.stderr, flush=True)
        return key, found

    with ThreadPoolExecutor(jobs) as pool:
        found = dict(pool.map(one, work))
    out.write_text(json.dumps(found, sort_keys=True, indent=1) + "\n")
    errors = sum("error" in v for v in found.values())
    print(f"{len(found)} conversions, {errors} refused, written to {out}")


def compare(before: dict, after: dict) -> list[str]:
    return [
        f"{key}: {before.get(key)} != {after.get(key)}"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("tree")
    made.add_argument("folder", type=Path)
    made.add_argument("--revision", default="HEAD")
    made.add_argument("--overlay", nargs="*", default=[])
    run = sub.add_parser("hashes")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("-j", "--jobs", type=int, default=2)
    run.add_argument("--only", help="only the models whose path contains this")
    both = sub.add_parser("compare")
    both.add_argument("before", type=Path)
    both.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "tree":
        make_tree(args.folder, args.revision, args.overlay)
        return 0
    if args.command == "hashes":
        hashes(args.out, args.jobs, args.only)
        return 0
    before = json.loads(args.before.read_text())
    after = json.loads(args.after.read_text())
    differing = compare(before, after)
    print(f"{len(after)} conversions; {len(differing)} differ")
    for line in differing:
        print(line)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
