"""The report page: self-contained, with its sections, and loaded by a real browser (headless
Chromium, the Debian package) without a console message."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")


def _page(argv: list, out: Path, capsys) -> str:
    code = main([str(a) for a in argv] + ["--html", str(out)])
    _, err = capsys.readouterr()
    assert code == 0 and f"wrote {out}" in err
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pages")
    cnn, transformer = folder / "cnn.html", folder / "transformer.html"
    assert main(["validate", str(MODELS / "small_cnn.onnx"), "--localize", "--html", str(cnn)]) == 0
    argv = ["report", str(MODELS / "vit.onnx"), "--enable-native-kernel-attention"]
    assert main(argv + ["--html", str(transformer)]) == 0
    return {"cnn": cnn, "transformer": transformer}


def _self_contained(text: str) -> None:
    assert "<script" not in text  # nothing to run, nothing to fail in the console
    # No resource outside the page: no src=, no stylesheet link, no url(...) in the CSS.
    assert not re.search(r"\ssrc=|<link|url\(|@import", text)


def test_cnn_page_has_its_sections_and_the_error_chart(pages):
    text = pages["cnn"].read_text(encoding="utf-8")
    _self_contained(text)
    for section in ('id="validation"', 'id="convolutions"', 'id="attention"', 'id="timeline"'):
        assert section in text
    assert 'aria-label="error of each node along the graph"' in text
    # One dot per compared node of small_cnn (15 nodes, 4 of them Relus fused into their
    # convs and compared there), each naming its node.
    assert text.count("<circle") == 11 and "node_conv2d_4 (Conv)" in text
    assert "feature_group_count 4 != 1" in text  # the fallback's reason, in the conv table
    assert 'aria-label="engine timeline"' in text


def test_transformer_page_lists_attention_blocks_and_why_not_raised(pages):
    text = pages["transformer"].read_text(encoding="utf-8")
    _self_contained(text)
    assert "not raised:" in text and "1007" in text  # the block's reason and the note
    assert 'id="validation"' not in text  # report alone runs nothing


def test_html_into_a_missing_folder_creates_it(tmp_path, capsys):
    target = tmp_path / "new" / "x.html"
    code = main(["report", str(MODELS / "small_cnn.onnx"), "--html", str(target)])
    assert code == 0 and target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_html_over_a_folder_is_a_clean_error(tmp_path, capsys):
    code = main(["report", str(MODELS / "small_cnn.onnx"), "--html", str(tmp_path)])
    assert code == 2 and "--html" in capsys.readouterr().err


def _chromium(page: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{page.stem}-{len(extra)}"
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            *extra,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_the_console_check_catches_an_error(tmp_path):
    """The check below can fail: a page that logs an error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>missing_function();</script></body></html>")
    messages = _console_messages(_chromium(bad, tmp_path, "--dump-dom").stderr)
    assert any("missing_function is not defined" in m for m in messages)


@needs_chromium
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_chromium_loads_the_page_without_console_messages(name, pages, tmp_path):
    page = pages[name]
    result = _chromium(page, tmp_path, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    assert _console_messages(result.stderr) == []
    dom = result.stdout
    assert "Convolutions: kernel or fallback" in dom or name == "transformer"
    assert "Attention and MLP blocks" in dom and "<svg" in dom
    shot = tmp_path / f"{name}.png"
    result = _chromium(page, tmp_path, "--window-size=1200,1800", f"--screenshot={shot}")
    assert result.returncode == 0 and _console_messages(result.stderr) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a page, not a blank
