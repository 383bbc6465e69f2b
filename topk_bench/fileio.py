"""Writing a file whole or not at all: the one place that handles short writes and a full disk.

- :func:`write_atomic`: the bytes go to a copy beside the file (a name of its own), are
  fsynced, and the copy is renamed over the file (over the file a link points to): a
  reader sees the old file or the new one, never half, and a failure leaves no copy behind.
- :func:`unwritable`: whether a directory takes some bytes now (a scratch directory that filled);
  :func:`directory_problem`: whether a directory can be made there and take a file (a profile's place).
- :func:`append`: the bytes are appended whole (``os.write`` may write fewer bytes
  than asked when the disk fills) and fsynced; on any failure the file is cut back
  to its size before, so no part of them stays.

Both raise ``OSError`` naming the file (``os.write`` names none); the CLI prints it
as one line with exit code 2 (:mod:`topk_bench.errors`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import tempfile
from pathlib import Path


def _named(exc: OSError, path: Path) -> OSError:
    """The error naming ``path`` (not its temporary copy; ``os.write`` names no file at all)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # a regular file only stops taking bytes when there is no room left
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (best effort: some filesystems cannot fsync a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: whole, or (on failure) the old file untouched and no copy left.

    The copy's name is this write's own (two processes replacing one file never share it); a symbolic
    link stays one: the file it points to is replaced.
    """
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _named(exc, path) from None
    _fsync_directory(target.parent)


def unwritable(directory: str | Path, nbytes: int = 1 << 16) -> OSError | None:
    """Why ``nbytes`` cannot be written in ``directory`` now (a full disk, a read-only place); None: they can."""
    try:
        with tempfile.TemporaryFile(dir=directory) as probe:
            _write_all(probe.fileno(), bytes(nbytes))
            os.fsync(probe.fileno())
    except OSError as exc:
        return _named(exc, Path(directory))
    return None


def directory_problem(directory: str | Path) -> OSError | None:
    """Why ``directory`` cannot hold files (a file where it or a parent should be, a read-only place, a place
    such as /proc where nothing can be made); None: it can, and exists now (made with its parents)."""
    path = Path(directory)
    if path.exists() and not path.is_dir():  # mkdir would say "File exists": the file is the problem
        return OSError(errno.ENOTDIR, "a file, not a directory", str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _named(exc, path)
    return unwritable(directory, nbytes=1)


def append(path: str | Path, data: bytes) -> None:
    """Append ``data`` to the existing file ``path``: all of it, or (on failure) none of it."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):  # shrinking needs no space
                    os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
    except OSError as exc:
        raise _named(exc, path) from None
