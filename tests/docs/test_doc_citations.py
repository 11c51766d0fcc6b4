"""Every `docs/<page>.md#<section>` that the code, the docs or the README cite exists, and no
comment cites a document outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")] + [
    path for folder in ("onnx2bir", "patterns", "runtime") for path in (ROOT / folder).rglob("*.py")
]
CITATION = re.compile(r"(?:docs/)?([a-z_]+\.md)#([a-z0-9-]+)")
OUTSIDE = re.compile(
    r"seed 00|trainium_facts|\.txt §|neuron_anchors|attention_idioms|validator_anchors"
)


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    explicit = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', text))
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }
    return explicit | headings


def _citations():
    for source in SOURCES:
        for line_no, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for page, anchor in CITATION.findall(line):
                yield source.relative_to(ROOT), line_no, page, anchor


CITED = list(_citations())


def test_the_code_cites_docs_sections():
    assert len([c for c in CITED if str(c[0]).endswith(".py")]) >= 50


@pytest.mark.parametrize("source, line, page, anchor", CITED, ids=lambda v: str(v))
def test_cited_section_exists(source, line, page, anchor):
    path = ROOT / "docs" / page
    assert path.is_file(), f"{source}:{line} cites missing page docs/{page}"
    assert anchor in _anchors(path), f"{source}:{line} cites missing section {page}#{anchor}"


def test_no_comment_cites_a_document_outside_the_repository():
    hits = [
        f"{source.relative_to(ROOT)}:{n}"
        for source in SOURCES
        if source.suffix == ".py"
        for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert hits == []


# A repository path in prose: a folder of the source tree, then a file name with its suffix.
# Sub-packages of onnx2bir/ are often named without it (`codegen/driver.py`); generated files
# (models/.cache/) are not in the tree.
PATH = re.compile(
    r"(?<![A-Za-z0-9_./-])((?:onnx2bir|patterns|runtime|benchmarks|models|tests|docs|codegen"
    r"|kernels|bir|frontend|reporting|validation|api|cli|sweep)"
    r"/(?!\.cache/)[A-Za-z0-9_./-]*[A-Za-z0-9_]\.(?:py|md|json|svg|png|toml))"
)


def _path_citations():
    for source in SOURCES + [ROOT / "models" / "README.md", ROOT / "models" / "MANIFEST.md"]:
        for line_no, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for path in PATH.findall(line):
                yield source.relative_to(ROOT), line_no, path


@pytest.mark.parametrize("source, line, path", list(_path_citations()), ids=lambda v: str(v))
def test_cited_path_exists(source, line, path):
    """A file the docs or a comment names is in the tree (the layout moves with the code)."""
    candidates = [ROOT / path, ROOT / "onnx2bir" / path]
    assert any(c.exists() for c in candidates), f"{source}:{line} names missing {path}"
