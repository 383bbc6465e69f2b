"""Reading a file within bounds, writing one whole or not at all: the one place that handles what a path may be
(a FIFO, a device, a link to /dev/zero), short writes and a full disk.

- :func:`read_regular`: the bytes of a regular file, at most a given number of them: the file is opened without
  blocking (a FIFO cannot hang the reader) and refused unless ``fstat`` says it is a regular file (a device such as
  /dev/zero, even through a link, is never read until memory runs out);
- :func:`read_json`: :func:`read_regular`, then JSON without ``NaN``/``Infinity`` and nested at most
  :data:`JSON_DEPTH` deep;
- :func:`write_atomic`: the bytes go to a copy beside the file (a name of its own), are
  fsynced, and the copy is renamed over the file (over the file a link points to): a
  reader sees the old file or the new one, never half, and a failure leaves no copy behind.
  Only a regular file is replaced: a FIFO, a device or a directory at the path (or where its link points) is
  refused, so that ``--json /dev/null`` run as root can never turn /dev/null into a file.
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
import json
import math
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from topk_bench.errors import BadInput

# What a reader reads at most: a meta.json, a suite, a profile's JSON are kilobytes; a results CSV of 100,000 rows
# is about 150 MB. A file larger than this is refused in one line instead of a MemoryError.
JSON_LIMIT = 16 << 20
TEXT_LIMIT = 16 << 20
CSV_LIMIT = 512 << 20
# How deep a JSON file may nest (a meta.json nests 3 deep): 100,000 brackets are bad input, not a RecursionError.
JSON_DEPTH = 32
NOT_REGULAR = "not a regular file (a FIFO, a socket or a device?)"


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


@contextlib.contextmanager
def open_regular(path: str | Path, limit: int) -> Iterator[BinaryIO]:
    """The regular file ``path`` (through a link) open for reading, once ``fstat`` says it is one of at most
    ``limit`` bytes; opened without blocking, so that a FIFO cannot hang the reader.

    Raises ``FileNotFoundError`` when there is none, ``IsADirectoryError`` for a directory, and ``OSError`` naming
    the file for anything else that is not a regular file (a FIFO, a device, a socket: never read) and for a file
    larger than ``limit``.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise exc.__class__(exc.errno, exc.strerror, str(path)) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a file", str(path))
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, NOT_REGULAR, str(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, _too_large(limit, info.st_size), str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with open(fd, "rb") as handle:
        yield handle


def _too_large(limit: int, size: int | None = None) -> str:
    return f"larger than {limit >> 20} MiB" + (f" ({size} bytes)" if size is not None else "") + ": not read"


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (:func:`open_regular`)."""
    with open_regular(path, limit) as handle:
        data = handle.read(limit + 1)  # st_size can lie (a file growing now): never more than the limit
    if len(data) > limit:
        raise OSError(errno.EFBIG, _too_large(limit), str(path))
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise ValueError(f"{text} is beyond a float")
    return value


def _depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def read_json(path: str | Path, limit: int = JSON_LIMIT) -> Any:
    """The JSON value in the regular file ``path`` (:func:`read_regular`); ``BadInput`` naming the file when it is
    not one, too large, not UTF-8, not JSON, holds ``NaN`` or ``Infinity`` (no JSON number) or nests deeper than
    :data:`JSON_DEPTH`. ``FileNotFoundError`` when there is no file, for the caller to judge."""
    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror or exc}", file=path) from None
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite)
    except RecursionError:
        value = None
        too_deep = True
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"unreadable JSON ({exc})", file=path) from None
    else:
        too_deep = _depth(value) > JSON_DEPTH
    if too_deep:
        raise BadInput(f"unreadable JSON (nested deeper than {JSON_DEPTH} levels)", file=path)
    return value


def write_atomic(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: whole, or (on failure) the old file untouched and no copy left.

    The copy's name is this write's own (two processes replacing one file never share it); a symbolic
    link stays one: the file it points to is replaced. Only a regular file is replaced (or a new one made): a
    FIFO, a device or a directory there raises ``OSError`` naming ``path`` and stays as it is.
    """
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise _named(exc, path) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "a directory, not a file: nothing written", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"{NOT_REGULAR}: nothing written (outputs replace only a regular file)", str(path))
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
