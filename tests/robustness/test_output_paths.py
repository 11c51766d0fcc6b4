"""No command replaces a non-regular file: every output flag refuses a FIFO, a symlink,
/dev/null and a folder before any work, and leaves them as they were; a regular file is
replaced atomically; created files and folders follow the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from onnx2bir import output_paths
from onnx2bir.cli.commands import main
from onnx2bir.errors import UserError

OK = Path(__file__).resolve().parent / "corpus" / "ok.onnx"

# (command, flag); `-o` takes a folder, the others a file (.npz) or a folder.
OUTPUT_FLAGS = [
    ("convert", "-o"),
    ("report", "--annotate"),
    ("report", "--html"),
    ("validate", "--save-inputs"),
    ("validate", "--save-outputs"),
    ("validate", "--html"),
    ("profile", "--trace"),
]


def _targets(tmp: Path) -> dict[str, Path]:
    fifo = tmp / "fifo.npz"
    os.mkfifo(fifo)
    real = tmp / "real.npz"
    real.write_bytes(b"keep me")
    link = tmp / "link.npz"
    link.symlink_to(real)
    dangling = tmp / "dangling.npz"
    dangling.symlink_to(tmp / "nowhere.npz")
    return {
        "fifo": fifo,
        "symlink": link,
        "dangling symlink": dangling,
        "/dev/null": Path(os.devnull),
    }


@pytest.mark.parametrize("command,flag", OUTPUT_FLAGS)
def test_every_output_flag_refuses_non_regular_targets(command, flag, tmp_path, capsys):
    for kind, target in _targets(tmp_path).items():
        before = os.lstat(target)
        code = main([command, str(OK), flag, str(target)])
        err = capsys.readouterr().err
        assert code == 2, (kind, err)
        assert err.startswith("onnx2bir: error: ") and err.count("\n") == 1, err
        after = os.lstat(target)
        assert stat.S_IFMT(after.st_mode) == stat.S_IFMT(before.st_mode), kind
        assert after.st_ino == before.st_ino, kind
        for path in [tmp_path / "real.npz", tmp_path / "link.npz"]:
            if path.exists():
                assert (tmp_path / "real.npz").read_bytes() == b"keep me"
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == ["dangling.npz", "fifo.npz", "link.npz", "real.npz"], leftovers


@pytest.mark.parametrize("command,flag", OUTPUT_FLAGS)
def test_every_output_flag_refuses_an_empty_path(command, flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([command, str(OK), flag, ""]) == 2
    assert "the path is empty" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_regular_file_is_replaced_and_gets_the_umask(tmp_path, capsys):
    target = tmp_path / "in.npz"
    target.write_bytes(b"old")
    old = os.umask(0o027)
    try:
        assert main(["validate", str(OK), "--save-inputs", str(target)]) == 0
    finally:
        os.umask(old)
    assert target.read_bytes()[:2] == b"PK"  # a zip archive now
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]


def test_created_folders_get_the_umask_not_0700(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        assert main(["convert", str(OK), "-o", str(tmp_path / "a" / "out")]) == 0
        assert main(["validate", str(OK), "--save-outputs", str(tmp_path / "b" / "outs")]) == 0
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "out", tmp_path / "b" / "outs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    assert stat.S_IMODE((tmp_path / "a" / "out" / "ok.bir.json").stat().st_mode) == 0o644
    assert [p.name for p in (tmp_path / "b" / "outs").iterdir()] == ["output_0.pb"]


def test_convert_refuses_a_fifo_inside_the_output_folder(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "ok.bir.json")
    assert main(["convert", str(OK), "-o", str(out)]) == 2
    assert "is a FIFO" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(out / "ok.bir.json").st_mode)
    assert sorted(p.name for p in out.iterdir()) == ["ok.bir.json"]


def test_a_symlinked_output_folder_is_written_through(tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert main(["convert", str(OK), "-o", str(tmp_path / "link")]) == 0
    assert (tmp_path / "link").is_symlink()
    assert sorted(p.name for p in real.iterdir()) == ["ok.bir.json", "ok.consts.bin"]


def test_the_last_moment_check_refuses_a_fifo_that_appeared(tmp_path):
    target = tmp_path / "late.npz"
    with pytest.raises(UserError, match="is a FIFO"):
        with output_paths.stage_file(target) as staged:
            staged.write_bytes(b"data")
            os.mkfifo(target)
    assert stat.S_ISFIFO(os.lstat(target).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["late.npz"]


def test_a_file_in_the_way_of_the_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a regular file, not a folder"):
        output_paths.check_file(tmp_path / "file" / "sub" / "a.npz", "--save-inputs")


def test_a_dangling_symlink_in_place_of_the_folder(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="is a symlink, not a folder"):
        output_paths.check_file(tmp_path / "gone" / "a.npz", "--save-inputs")


def test_save_outputs_refuses_a_fifo_among_the_files_it_would_replace(tmp_path, capsys):
    out = tmp_path / "outs"
    out.mkdir()
    os.mkfifo(out / "output_0.pb")
    assert main(["validate", str(OK), "--save-outputs", str(out)]) == 2
    assert "is a FIFO" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(out / "output_0.pb").st_mode)


@pytest.mark.parametrize("flag", ["--save-inputs", "--save-outputs"])
def test_arrays_are_not_scattered_into_a_folder_of_other_files(flag, tmp_path, capsys):
    """A folder that is not a test_data_set (a folder of models, say) is refused before any
    work; a test_data_set folder is rewritten."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "keep.onnx").write_bytes(b"a model")
    assert main(["validate", str(OK), flag, str(models)]) == 2
    err = capsys.readouterr().err
    assert "holds other files (keep.onnx)" in err and "not a test_data_set" in err
    assert sorted(p.name for p in models.iterdir()) == ["keep.onnx"]
    data_set = tmp_path / "test_data_set_0"
    assert main(["validate", str(OK), flag, str(data_set)]) == 0
    assert main(["validate", str(OK), flag, str(data_set)]) == 0  # its own files are replaced
    stem = "input" if flag == "--save-inputs" else "output"
    assert sorted(p.name for p in data_set.iterdir()) == [f"{stem}_0.pb"]
