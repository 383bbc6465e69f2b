"""The compiled kernels built and loaded: from a cache only this user can write, under a time limit, and with the
argument types of every function declared once (:data:`SIGNATURES`).

- The library is built with the system C compiler (``$CC``, else ``cc``, ``gcc``, ``clang``) for this CPU
  (``-march=native``) and cached by a hash of its sources, the flags, the compiler's version and the CPU's flags
  (the build key), under ``$TOPK_BENCH_NATIVE_CACHE`` (default ``~/.cache/topk-bench/native``).
- A library is loaded only from a directory owned by this user that no one else may write, and only if the file is
  this user's and writable by no one else: a library another user could have planted is never loaded. A cache
  directory that fails the check is not used (a private one of this process is); a file that fails it is left
  where it is and the library is built beside it.
- A cache directory that is a symbolic link is followed when the link is this user's (a cache moved to another
  disk); the directory it leads to is checked as above. A private directory of this process (the fallback) is
  removed when the process that made it ends: no temporary folder is left.
- The compiler runs in a session of its own, for at most ``$TOPK_BENCH_NATIVE_TIMEOUT`` seconds (default
  :data:`COMPILE_TIMEOUT_S`); past it the whole session is killed and the kernels are not used. One line on
  stderr says so before it starts (``compiling the native kernels, at most 120 s``).
- One attempt per run: a build that fails (in any way: a compiler that is no program, one that prints bytes
  that are not UTF-8, one that hangs) or a library that does not load is said once, and the reason is left in
  ``$TOPK_BENCH_NATIVE_FAILED`` for the processes this one starts (a run's template and children), which take
  the torch path without trying again. A library that does not load is removed from the cache (the next run
  builds it again), never loaded again and again.
- A build writes a partial file beside its target and renames it into place: a concurrent first use never loads a
  partial file. Every failure removes its partial file; one left by a process killed mid-build is removed by the
  next build in that directory.

Every way of not getting the library is an :class:`Unavailable` with the reason (:func:`load`), which
:func:`topk_bench.attention.kernels.native.status` reports. Standard library only (torch is not needed to build).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = (HERE / "row_topk.c", HERE / "key_sort.c")  # compiled into one library
HEADERS = (HERE / "row_topk_body.h", HERE / "row_topk_scan.h")
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=gnu99")
# A compiler that has not finished in this long (seconds) is stopped: a build takes about a second.
COMPILE_TIMEOUT_S = 120.0
PREFIX = "row_topk"
SUFFIXES = ("f32", "f64", "i16", "h16")  # the row top-k's element types, one function each

# The exported functions: return type and argument types, as ctypes gets them. The C prototypes (row_topk_body.h's
# F(row_topk), row_topk_scan.h's row_topk_isa, key_sort.c's key_sort) say the same;
# tests/attention/test_native_build.py reads them and checks. A pointer of any type is "ptr", int64_t "i64", int "int".
_ROW_TOPK = ("ptr", "i64", "i64", "i64", "i64", "i64", "ptr", "ptr", "i64", "i64", "i64", "i64", "i64", "i64",
             "i64", "i64", "i64")  # fmt: skip
_KEY_SORT = ("ptr", "i64", "i64", "i64", "i64", "i64", "ptr", "ptr", "ptr", "ptr", "i64", "ptr", "ptr", "i64", "i64")
SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    **{f"{suffix}_row_topk": ("int", _ROW_TOPK) for suffix in SUFFIXES},
    "row_topk_isa": ("int", ("i64",)),
    "key_sort": ("int", _KEY_SORT),
}
_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "int": ctypes.c_int}
# Why this run's one attempt failed, for the processes it starts (its template and children): they do not try again.
FAILED = "TOPK_BENCH_NATIVE_FAILED"


class Unavailable(Exception):
    """Why the compiled kernels are not used (the message says it to a user)."""


def cache_dir() -> Path:
    root = os.environ.get("TOPK_BENCH_NATIVE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "topk-bench" / "native"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def timeout_s() -> float:
    text = os.environ.get("TOPK_BENCH_NATIVE_TIMEOUT", "")
    try:
        return float(text) if text else COMPILE_TIMEOUT_S
    except ValueError:
        return COMPILE_TIMEOUT_S


def _cpu_flags() -> str:
    # -march=native: a build is for this CPU kind (the project's machines mix AVX2 and AVX-512).
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def gnu_openmp() -> bool:
    """Whether torch runs on GNU OpenMP (libgomp): then the kernels are built with -fopenmp and load the libgomp
    already in the process (same soname), sharing torch's threads and their count."""
    try:
        return any("libgomp" in line for line in Path("/proc/self/maps").read_text().splitlines())
    except OSError:
        return False


def flags() -> tuple[str, ...]:
    return FLAGS + (("-fopenmp",) if gnu_openmp() else ())


def _run(argv: list[str], limit: float) -> subprocess.CompletedProcess:
    """``argv`` in a session of its own, killed whole (the driver and the compiler proper it started) past
    ``limit`` seconds; its output as text (bytes that are not UTF-8 replaced). Unavailable when it cannot start
    or does not finish."""
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:  # not a program, not executable, gone
        raise Unavailable(f"{argv[0]} cannot run: {exc.strerror or exc}") from None
    try:
        out, err = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise Unavailable(f"{argv[0]} did not finish in {limit:g} s (TOPK_BENCH_NATIVE_TIMEOUT)") from None
    text = (out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
    return subprocess.CompletedProcess(argv, process.returncode, *text)


def build_key(cc: str) -> str:
    asked = _run([cc, "--version"], min(timeout_s(), 30.0))
    if asked.returncode != 0:
        raise Unavailable(f"{cc} --version failed (exit {asked.returncode}): not a C compiler?")
    version = asked.stdout
    parts = [*(p.read_bytes() for p in SOURCES + HEADERS), " ".join(flags()).encode(), version.encode(),
             _cpu_flags().encode(), platform.machine().encode()]  # fmt: skip
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _private(path: Path) -> str:
    """Why ``path`` (a directory or a file) could hold what another user wrote ("" when it cannot): not this user's,
    or writable by group or others."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not {os.getuid()}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return ""


def _followed(root: Path) -> Path:
    """``root``, or where it leads when it is a symbolic link of this user's (its target is checked then)."""
    try:
        link = root.lstat()
    except OSError:
        return root
    if stat.S_ISLNK(link.st_mode) and link.st_uid == os.getuid():
        return Path(os.path.realpath(root))
    return root


def private_dir() -> Path:
    """The cache directory, made ``0700`` if new; one of this process's own when the cache fails the check."""
    root = cache_dir()
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        root = _followed(root)
        root.mkdir(mode=0o700, exist_ok=True)
        problem = _private(root)
    except OSError as exc:
        problem = f"cannot be made ({exc.strerror})"
    if not problem:
        return root
    warnings.warn(
        f"{__package__}: not building in {root}: {problem}; building in a private directory of this process instead "
        "(fix the directory, or set TOPK_BENCH_NATIVE_CACHE)",
        stacklevel=4,
    )
    return _own_directory()


def _own_directory() -> Path:
    """A private directory of this process, removed when it ends (only by the process that made it: a child
    forked from it leaves it to its parent); the processes it starts build in it too (TOPK_BENCH_NATIVE_CACHE)."""
    directory = Path(tempfile.mkdtemp(prefix="topk-bench-native-"))
    maker = os.getpid()

    def remove() -> None:
        if os.getpid() == maker:
            shutil.rmtree(directory, ignore_errors=True)

    atexit.register(remove)
    os.environ["TOPK_BENCH_NATIVE_CACHE"] = str(directory)
    return directory


def _sweep_partials(directory: Path) -> None:
    """Remove the partial files of builds whose process is gone (killed mid-build)."""
    for partial in directory.glob(f".{PREFIX}-*.partial.so"):
        pid = partial.name.split(".")[2] if partial.name.count(".") >= 4 else ""
        if pid.isdigit() and not _alive(int(pid)):
            partial.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _compile(cc: str, target: Path) -> None:
    print(f"topk_bench.attention.kernels.native: compiling the native kernels, at most {timeout_s():g} s "
          "(TOPK_BENCH_NATIVE_TIMEOUT)", file=sys.stderr, flush=True)  # fmt: skip
    fd, partial = tempfile.mkstemp(prefix=f".{target.stem}.{os.getpid()}.", suffix=".partial.so", dir=target.parent)
    os.close(fd)
    try:
        result = _run([cc, *flags(), "-o", partial, *map(str, SOURCES)], timeout_s())
        if result.returncode != 0:
            said = result.stderr.strip()[-500:] or "nothing on stderr"
            raise Unavailable(f"{cc} failed (exit {result.returncode}) on {', '.join(p.name for p in SOURCES)}: {said}")
        os.chmod(partial, 0o700)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def library_path(cc: str) -> tuple[Path, str]:
    """(the library, its build key): built unless a trusted build is cached. Raises Unavailable."""
    key = build_key(cc)
    directory = private_dir()
    _sweep_partials(directory)
    target = directory / f"{PREFIX}-{key}.so"
    if target.exists() or target.is_symlink():
        problem = _private(target)
        if not problem:
            return target, key
        warnings.warn(
            f"topk_bench.attention.kernels.native: not loading {target}: {problem}; building beside it", stacklevel=4
        )
        target = directory / f"{PREFIX}-{key}-uid{os.getuid()}.so"
        if (target.exists() or target.is_symlink()) and not _private(target):
            return target, key
        target.unlink(missing_ok=True)
    _compile(cc, target)
    return target, key


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Every function of :data:`SIGNATURES` given its types; Unavailable when one is missing from the library."""
    for name, (returns, takes) in SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise Unavailable(f"the library has no function {name} (a build of other sources?)") from None
        fn.restype = _CTYPES[returns]
        fn.argtypes = [_CTYPES[t] for t in takes]
    return lib


def load() -> tuple[ctypes.CDLL, str]:
    """(the library, its build key); Unavailable with the reason when the kernels are not to be used here.

    Any failure of building or loading is an Unavailable (the caller takes the torch path), and is left in
    :data:`FAILED` for the processes this one starts: one attempt per run."""
    if os.environ.get("TOPK_BENCH_NATIVE", "1") == "0":
        raise Unavailable("disabled by TOPK_BENCH_NATIVE=0")
    if platform.system() == "Windows":
        raise Unavailable("not built on Windows")
    failed = os.environ.get(FAILED)
    if failed:
        raise Unavailable(failed)
    cc = compiler()
    if cc is None:
        raise Unavailable("no C compiler ($CC, cc, gcc or clang)")
    try:
        path, key = library_path(cc)
        return _loaded(path), key
    except Exception as exc:  # noqa: BLE001 -- a failed build of any kind: the torch path, said once
        why = str(exc) if isinstance(exc, Unavailable) else f"building failed: {type(exc).__name__}: {exc}"
        os.environ[FAILED] = why
        raise Unavailable(why) from None


def _loaded(path: Path) -> ctypes.CDLL:
    """The library at ``path`` with its functions declared; one that does not load, or lacks a function, is
    removed (it is this user's: :func:`library_path` checked it), so that the next run builds it again."""
    try:
        return declare(ctypes.CDLL(str(path)))
    except (OSError, Unavailable) as exc:
        path.unlink(missing_ok=True)
        why = f"{path} does not load: {exc}" if isinstance(exc, OSError) else str(exc)
        raise Unavailable(f"{why}; removed, the next run builds it again") from None
