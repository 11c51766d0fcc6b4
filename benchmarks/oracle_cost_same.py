"""Whether a change to the oracle's cost changed a verdict: `validate --json`, timings aside.

Usage:
    python benchmarks/oracle_cost_same.py base /tmp/base runtime/oracle   # those paths at HEAD
    python benchmarks/oracle_cost_same.py check --base /tmp/base          # both trees, compared
    python benchmarks/oracle_cost_same.py documents --out docs.json [--models ...] [--sets ...]
    python benchmarks/oracle_cost_same.py compare before.json after.json

`documents` validates, with the onnx2bir it imports, every model of `models/*.onnx`,
`models/hf/*.onnx` and the four of `benchmarks/oracle_cost.py` (resnet50, bert12, ocr640,
chain:20000) under each option set (`SETS`: the default, `--auto-cast all`, `--auto-cast none`,
`--auto-cast-type fp8_e4m3`) and writes each document without its timings (`timings`, and the
passes' seconds in `pass_statistics`), the tree's own folder written `<tree>`. `base` makes a
copy of this working tree with the given paths as they are at a revision, importable on its own
(PYTHONPATH), so that `check` compares this tree with it at the same moment, whatever else
changed in the tree meanwhile: it runs `documents` in both, two processes at a time, and prints
every document that differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {
    "default": {},
    "all": {"auto_cast": "all"},
    "none": {"auto_cast": "none"},
    "fp8": {"auto_cast_type": "fp8_e4m3"},
}
BENCHMARK_MODELS = ["resnet50", "bert12", "ocr640", "chain:20000"]
CHAIN_FOLDER = Path(tempfile.gettempdir()) / "oracle_cost_same"  # one chain file for both trees


def models() -> list[str]:
    zoo = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "models").glob("*.onnx"))
    hf = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "models" / "hf").glob("*.onnx"))
    return [*zoo, *hf, *BENCHMARK_MODELS]


def _stripped(doc: dict) -> dict:
    """The document without what a rerun changes: its timings and the passes' seconds."""
    doc = dict(doc)
    doc.pop("timings", None)
    doc["pass_statistics"] = [
        {k: v for k, v in stat.items() if "second" not in k and "time" not in k}
        for stat in doc.get("pass_statistics", [])
    ]
    return doc


def documents(names: list[str], sets: list[str], out: Path) -> None:
    """Each model of `names` validated under each option set of `sets` (module docstring)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    import oracle_cost

    import onnx2bir

    CHAIN_FOLDER.mkdir(exist_ok=True)
    found: dict[str, dict] = {}
    for name in names:
        if name.startswith("chain:"):
            path = CHAIN_FOLDER / f"chain{name.removeprefix('chain:')}.onnx"
            if not path.exists():
                oracle_cost.chain_model(int(name.removeprefix("chain:")), CHAIN_FOLDER)
            keywords = {}
        elif name.endswith(".onnx") and not Path(name).is_absolute():
            path, keywords = ROOT / name, {}  # this tree's copy
        else:
            path, keywords = oracle_cost.resolve(name, CHAIN_FOLDER)
        for label in sets:
            key = f"{Path(name).name} [{label}]"
            start = time.perf_counter()
            try:
                result = onnx2bir.validate(str(path), **keywords, **SETS[label])
                text = json.dumps(result.document, default=str).replace(str(ROOT), "<tree>")
                found[key] = _stripped(json.loads(text))
            except Exception as exc:  # the refusal is the document
                found[key] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{key}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    out.write_text(json.dumps(found, sort_keys=True, indent=0, default=str))


def compare(before: dict, after: dict) -> list[str]:
    """The keys whose documents differ, with the first differing path of each."""
    differing = []
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            differing.append(f"{key}: only in {'after' if key in after else 'before'}")
            continue
        where = _first_difference(before[key], after[key], key)
        if where:
            differing.append(where)
    return differing


def _first_difference(a, b, path: str) -> str | None:
    if type(a) is not type(b):
        return f"{path}: {a!r:.80} != {b!r:.80}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only on one side"
            found = _first_difference(a[k], b[k], f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b or (a != a and b != b) else f"{path}: {a!r:.80} != {b!r:.80}"


def make_base(folder: Path, paths: list[str], revision: str) -> None:
    """A copy of this working tree with `paths` as they are at `revision` (module docstring)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    skip = {".git", "__pycache__", ".cache", ".pytest_cache"}
    shutil.copytree(
        ROOT,
        folder,
        dirs_exist_ok=True,
        ignore=lambda _, names: [n for n in names if n in skip or n.endswith(".egg-info")],
    )
    for path in paths:  # removed and then restored from the revision
        target = folder / path
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", revision, "--", path],
            check=True,
            capture_output=True,
        ).stdout
        with tempfile.TemporaryFile() as handle:
            handle.write(archive)
            handle.seek(0)
            with tarfile.open(fileobj=handle) as tar:
                tar.extractall(folder, filter="data")
    (folder / "models" / ".cache").symlink_to(ROOT / "models" / ".cache")
    # The installed package maps onnx2bir.runtime and onnx2bir.patterns to this tree's
    # folders (pyproject's package-dir); the copy imports its own through links.
    (folder / "onnx2bir" / "runtime").symlink_to("../runtime")
    (folder / "onnx2bir" / "patterns").symlink_to("../patterns")


def check(base: Path, names: list[str], sets: list[str]) -> int:
    """`documents` in this tree and in `base`, side by side; the differences printed."""
    work = Path(tempfile.mkdtemp(prefix="oracle_cost_same_"))
    runs = []
    for label, tree in (("before", base), ("after", ROOT)):
        command = [
            sys.executable,
            str(tree / "benchmarks" / "oracle_cost_same.py"),
            "documents",
            "--out",
            str(work / f"{label}.json"),
            "--models",
            *names,
            "--sets",
            *sets,
        ]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        log = open(work / f"{label}.log", "w")  # noqa: SIM115 (closed below)
        runs.append((subprocess.Popen(command, env=env, stderr=log, cwd=tree), log))
    for process, log in runs:
        process.wait()
        log.close()
    before = json.loads((work / "before.json").read_text())
    after = json.loads((work / "after.json").read_text())
    differing = compare(before, after)
    print(f"{len(after)} documents in {work}; {len(differing)} differ")
    for line in differing:
        print(line)
    return 1 if differing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("base")
    made.add_argument("folder", type=Path)
    made.add_argument("paths", nargs="+")
    made.add_argument("--revision", default="HEAD")
    for name in ("documents", "check"):
        command = sub.add_parser(name)
        command.add_argument("--models", nargs="*", default=None)
        command.add_argument("--sets", nargs="*", default=list(SETS), choices=list(SETS))
        if name == "documents":
            command.add_argument("--out", type=Path, required=True)
        else:
            command.add_argument("--base", type=Path, required=True)
    compared = sub.add_parser("compare")
    compared.add_argument("before", type=Path)
    compared.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "base":
        make_base(args.folder, args.paths, args.revision)
    elif args.command == "documents":
        documents(args.models or models(), args.sets, args.out)
    elif args.command == "check":
        sys.exit(check(args.base, args.models or models(), args.sets))
    else:
        differing = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
        print("\n".join(differing) or "the same")
        sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
