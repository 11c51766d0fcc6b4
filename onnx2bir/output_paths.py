"""Where onnx2bir may write, checked before any work, and writes that never clobber.

Every writer (`convert -o`, `report --annotate`, `validate --save-inputs/--save-outputs`, and
any later one) goes through this module; the rules are in `docs/input_contracts.md#outputs`:

- an output FILE is a regular file (replaced) or a new name in an existing or creatable
  folder; a symlink, device, FIFO, socket, folder or empty path is refused;
- an output FOLDER is an existing folder (a symlink to one is followed: writing inside it
  replaces no link) or a new name in an existing or creatable folder; each file written in it
  obeys the FILE rule;
- nothing is written until the work succeeds; files are staged next to their target and
  moved over it with `os.replace`, only when the target is absent or a regular file;
- created files and folders get the permissions the user's umask gives, not the 0600/0700 of
  temporary files.

`check_file` and `check_folder` are called by the command line before compiling; `stage_file`,
`replace_file` and `publish_folder` do the writing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from onnx2bir.errors import UserError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "an unknown kind of file"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ENOTDIR (a file in the way), ENAMETOOLONG, ELOOP, EACCES
        raise UserError(f"{path}: cannot be written ({exc.strerror})") from None


def _path(text: str | Path, flag: str) -> Path:
    if not str(text).strip():
        raise UserError(f"{flag}: the path is empty")
    if "\x00" in str(text):
        raise UserError(f"{flag} {str(text)!r}: the path contains a NUL character")
    return Path(text)


def _check_names(path: Path, flag: str) -> None:
    anchor = _existing_ancestor(path.parent)
    try:
        limit = os.pathconf(anchor, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in path.parts:
        if len(os.fsencode(part)) > limit:
            raise UserError(
                f"{flag} {path}: the name {part[:40]!r}... is longer than {limit} bytes"
            )


def _existing_ancestor(folder: Path) -> Path:
    """The nearest of `folder` and the folders above it that exists."""
    folder = folder if str(folder) else Path(".")
    while not _exists(folder) and folder.parent != folder:
        folder = folder.parent
    return folder


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise UserError(f"{path}: cannot be written ({exc.strerror})") from None
    return True


def _check_parent(path: Path, flag: str) -> None:
    """The folder of `path` exists or can be created, and accepts new files."""
    anchor = _existing_ancestor(path.parent)
    if not anchor.is_dir():
        try:
            kind = _kind(os.stat(anchor).st_mode)
        except OSError:  # a dangling symlink
            kind = _kind(os.lstat(anchor).st_mode)
        raise UserError(f"{flag} {path}: {anchor} is {kind}, not a folder")
    # Probe with a real file: write permission bits say nothing for root or on /proc and /sys.
    try:
        fd, probe = tempfile.mkstemp(prefix=".onnx2bir-probe-", dir=anchor)
    except OSError as exc:
        raise UserError(
            f"{flag} {path}: cannot write there (creating a file in {anchor}: {exc.strerror})"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_file(path: str | Path, flag: str) -> Path:
    """Refuse (UserError) an output file path that is not a regular file or a new name."""
    path = _path(path, flag)
    _check_names(path, flag)
    _check_parent(path, flag)
    info = _lstat(path)
    if info is not None and not stat.S_ISREG(info.st_mode):
        what = _kind(info.st_mode)
        hint = f"; {flag} wants a file name" if stat.S_ISDIR(info.st_mode) else ""
        raise UserError(f"{flag} {path}: is {what}; refusing to replace it{hint}")
    return path


def check_folder(path: str | Path, flag: str) -> Path:
    """Refuse an output folder path that is not a folder (or a symlink to one) or a new name."""
    path = _path(path, flag)
    _check_names(path, flag)
    _check_parent(path, flag)
    info = _lstat(path)
    if info is not None:
        if stat.S_ISLNK(info.st_mode) and path.is_dir():
            info = os.stat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise UserError(f"{flag} {path}: is {_kind(info.st_mode)}, not a folder")
        _check_parent(path / "x", flag)
    return path


def _default_mode(path: Path, folder: bool) -> None:
    os.chmod(path, (0o777 if folder else 0o666) & ~_umask())


def make_parent(path: Path) -> None:
    """Create the folders above `path` (with the umask's permissions)."""
    os.makedirs(path.parent if str(path.parent) else ".", exist_ok=True)


def _replaceable(target: Path) -> None:
    info = _lstat(target)
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise UserError(f"{target}: is {_kind(info.st_mode)}; refusing to replace it")


@contextlib.contextmanager
def stage_file(target: str | Path) -> Iterator[Path]:
    """A temporary path next to `target`; on success it replaces `target` (a regular file or
    nothing), on failure it is removed."""
    target = Path(target)
    make_parent(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:64]}.", dir=target.parent or ".")
    os.close(fd)
    staged = Path(tmp)
    try:
        yield staged
        _default_mode(staged, folder=False)
        _replaceable(target)
        os.replace(staged, target)
    finally:
        staged.unlink(missing_ok=True)


def replace_file(target: str | Path, write: Callable[[Path], None]) -> Path:
    """Write `target` through `write(temporary path)`; see `stage_file`."""
    with stage_file(target) as staged:
        write(staged)
    return Path(target)


@contextlib.contextmanager
def stage_folder(target: str | Path) -> Iterator[Path]:
    """A temporary folder beside (or, when `target` exists, inside) the target folder; on
    success `publish_folder` semantics apply, on failure it is removed."""
    target = Path(target)
    exists = target.is_dir()
    if not exists:
        make_parent(target)
    staging = Path(
        tempfile.mkdtemp(prefix=".onnx2bir-", dir=target if exists else (target.parent or "."))
    )
    try:
        yield staging
        publish_folder(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_folder(staging: Path, target: Path) -> None:
    """Move the files of `staging` into `target` (created when missing, with the umask's
    permissions); a file already in `target` is replaced only when it is a regular file."""
    if not target.is_dir():
        for item in staging.iterdir():
            _default_mode(item, folder=item.is_dir())
        _default_mode(staging, folder=True)
        os.rename(staging, target)
        return
    for item in staging.iterdir():
        _replaceable(target / item.name)
    for item in staging.iterdir():
        _default_mode(item, folder=item.is_dir())
        os.replace(item, target / item.name)
