"""Write a set of output files all or nothing (the CLI's kernels, manifests and export bundles).

Every file is first written in full to a temporary file beside its target; only when all of them are written
are they moved into place (`os.replace`, atomic per file). If any write fails, the temporary files and the
folders made for them are removed, so a failure leaves nothing half-written, and the error names the path.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Mapping

__all__ = ["OutputError", "check_writable", "write_all"]


class OutputError(Exception):
    """An output path that cannot be written (the message names it and why)."""


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def check_writable(directory: pathlib.Path, what: str) -> None:
    """Refuse early (before any compile) a destination folder that is a file or whose nearest existing parent
    is not a folder."""
    directory = pathlib.Path(directory)
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"{what} {directory} exists and is not a folder")
    parent = directory
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(f"{what} {directory}: {parent} is not a folder")
    try:  # can a folder be made there? (a folder made and removed at once: nothing is left)
        os.rmdir(tempfile.mkdtemp(prefix=".flashgen-probe-", dir=parent))
    except OSError as e:
        raise OutputError(f"{what} {directory}: cannot write in {parent} ({_why(e)})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_all(files: Mapping[pathlib.Path, str | bytes]) -> list[pathlib.Path]:
    """Write every (path -> text or bytes) of `files`, or none of them; returns the paths written."""
    made_dirs: list[pathlib.Path] = []
    temps: list[tuple[pathlib.Path, pathlib.Path]] = []
    mode = 0o666 & ~_umask()
    current = None
    try:
        for path, content in files.items():
            path = pathlib.Path(path)
            current = path
            missing = []
            parent = path.parent
            while not parent.exists() and parent.parent != parent:
                missing.append(parent)
                parent = parent.parent
            for d in reversed(missing):
                current = d
                try:
                    d.mkdir()
                except OSError as e:
                    raise OutputError(f"cannot create the folder {d}: {_why(e)}") from None
                made_dirs.append(d)
            current = path
            if path.is_dir():
                raise IsADirectoryError(21, "Is a directory")
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps.append((pathlib.Path(tmp), path))
            with os.fdopen(fd, "wb") as f:
                f.write(content.encode() if isinstance(content, str) else bytes(content))
            os.chmod(tmp, mode)
        for tmp, path in temps:
            current = path
            os.replace(tmp, path)
    except (OSError, OutputError) as e:
        for tmp, _ in temps:
            try:
                tmp.unlink()
            except OSError:
                pass
        for d in reversed(made_dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        if isinstance(e, OutputError):
            raise
        raise OutputError(f"cannot write {current}: {_why(e)}") from None
    return [path for _, path in temps]
