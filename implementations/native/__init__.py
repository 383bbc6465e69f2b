"""Compiled CPU kernels for ``topk_fast``, as torch ops: the exact row-wise top-k of score tiles
(``row_topk.c``) and the stable key sort of the backward's entries (``key_sort.c``).

``torch.topk`` on CPU copies each row into (value, index) pairs and runs ``nth_element`` (or
a heap) on all of them, a branch mispredicted per comparison: ~9 ns an element on an AVX2
EPYC, more than the score product that made the row. ``row_topk_`` reads a row once (a
vectorised maximum over strided groups), bounds the k-th group maximum by a histogram, visits
the members of the ~k groups that can hold the top-k without branches, and finishes with a
histogram split and a select over the few candidates left: 3.2-3.4x faster than the pruned
``torch.topk`` path on random rows (1 thread), the same values. ``key_sort_`` is a counting sort
that carries each entry's query row and weights along (``torch.sort``, ``searchsorted`` and two
``index_select`` before).

- Built on first use with the system C compiler (``$CC``, else ``cc``) for this
  CPU (``-O3 -march=native``), cached under ``$TOPK_BENCH_NATIVE_CACHE`` (default
  ``~/.cache/topk-bench/native``) by a hash of the source, the compiler and the
  CPU's flags; a build takes about a second.
- Without a compiler, or with ``TOPK_BENCH_NATIVE=0``, :func:`available` and
  :func:`built` are False and callers keep their torch path (the same results).
- The ops write into tensors the caller allocated (``row_topk_``: slices of its
  results), their scratch is the kernel's own (as a BLAS's); their fake kernels
  allocate nothing, so ``FakeTensorMode`` (the predict backend) sees what a real
  run allocates. Where torch runs on GNU OpenMP, the kernel is built with
  ``-fopenmp`` and shares torch's libgomp: ``torch.get_num_threads()`` threads of
  torch's own team take the rows in blocks (a pool of our own would fight torch's
  workers, which spin a while after each product: 1.05x one thread's speed on 2 cores).

Importable alone: it needs only torch and the standard library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

_HERE = Path(__file__).parent
SOURCES = (_HERE / "row_topk.c", _HERE / "key_sort.c")  # compiled into one library
HEADERS = (_HERE / "row_topk_body.h",)
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=gnu99")
# Rows per kernel call below which splitting between threads costs more than it saves.
MIN_ROWS_PER_THREAD = 16
# Blocks of rows per thread, handed out as threads ask for them.
BLOCKS_PER_THREAD = 8
# A row's G groups balance the select over their maxima (~G·c_select) against the visit of
# the members of the k best groups (~k·width/G·c_member): G = sqrt(RATIO·k·width), RATIO =
# c_member / c_select (tuned on an AVX2 EPYC, 1 thread, k = 128, width 1024-16384).
GROUP_RATIO = 0.4


def groups_for(width: int, k: int) -> int:
    """Groups per row of ``width`` values for a top-``k`` (``k <= G <= width``)."""
    return max(k, min(width, int(math.sqrt(GROUP_RATIO * k * width))))


_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.int16: "i16"}
_INDEX_DTYPES = (torch.int32, torch.int64)


def _cache_dir() -> Path:
    root = os.environ.get("TOPK_BENCH_NATIVE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "topk-bench" / "native"


def _cpu_flags() -> str:
    # -march=native: a build is for this CPU kind (the project's machines mix AVX2 and AVX-512).
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _gnu_openmp() -> bool:
    """Whether torch runs on GNU OpenMP (libgomp): then the kernels are built with -fopenmp and load
    the libgomp already in the process (same soname), sharing torch's threads and their count."""
    try:
        return any("libgomp" in line for line in Path("/proc/self/maps").read_text().splitlines())
    except OSError:
        return False


def _flags() -> tuple[str, ...]:
    return FLAGS + (("-fopenmp",) if _gnu_openmp() else ())


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    flags = _flags()
    key = hashlib.sha256(
        b"\0".join(
            [
                *(p.read_bytes() for p in SOURCES + HEADERS),
                " ".join(flags).encode(),
                version.encode(),
                _cpu_flags().encode(),
                platform.machine().encode(),
            ]
        )
    ).hexdigest()[:16]
    target = _cache_dir() / f"row_topk-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: concurrent first uses never load a partial file.
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [cc, *flags, "-o", partial, *map(str, SOURCES)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{cc} failed on {', '.join(p.name for p in SOURCES)}: {result.stderr.strip()[-500:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    if os.environ.get("TOPK_BENCH_NATIVE", "1") == "0" or platform.system() == "Windows":
        return None
    cc = _compiler()
    if cc is None:
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, RuntimeError) as err:
        warnings.warn(f"implementations.native: no compiled row top-k ({err}); using torch.topk", stacklevel=3)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for value in _SUFFIX.values():
        fn = getattr(lib, f"{value}_row_topk")
        fn.restype = ctypes.c_int
        fn.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64]
    lib.key_sort.restype = ctypes.c_int
    lib.key_sort.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr, ptr, i64, ptr, ptr, i64, i64]
    return lib


def built(device_type: str = "cpu") -> bool:
    """Whether the kernels run for a ``device_type`` target (CPU, and built: on first call)."""
    return device_type == "cpu" and _library() is not None


def available(dtype: torch.dtype, device_type: str = "cpu") -> bool:
    """Whether :func:`row_topk_` runs for scores of ``dtype`` on a ``device_type`` target (builds on first call)."""
    return dtype in _SUFFIX and built(device_type)


def _check(scores: torch.Tensor, k: int, values: torch.Tensor, indices: torch.Tensor) -> None:
    if scores.dim() != 3 or values.dim() != 3 or indices.dim() != 3:
        raise ValueError("row_topk_: scores, values and indices must be 3-D [outer, inner, *]")
    if values.shape != (*scores.shape[:2], k) or indices.shape != values.shape:
        raise ValueError(
            f"row_topk_: values/indices {tuple(values.shape)}/{tuple(indices.shape)} "
            f"do not fit scores {tuple(scores.shape)} and k={k}"
        )
    if not 1 <= k <= scores.shape[-1]:
        raise ValueError(f"row_topk_: k={k} outside 1..{scores.shape[-1]}")
    if values.dtype != scores.dtype or indices.dtype not in _INDEX_DTYPES or scores.dtype not in _SUFFIX:
        raise ValueError(f"row_topk_: dtypes {scores.dtype}/{values.dtype}/{indices.dtype} not supported")
    if values.stride()[:2] != indices.stride()[:2]:
        raise ValueError("row_topk_: values and indices must have the same strides")
    for name, t in (("scores", scores), ("values", values), ("indices", indices)):
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ValueError(f"row_topk_: {name}' last dimension must be contiguous")


@torch.library.custom_op("implementations::row_topk_", mutates_args=("values", "indices"), device_types="cpu")
def row_topk_(
    scores: torch.Tensor,
    k: int,
    values: torch.Tensor,
    indices: torch.Tensor,
    groups: int = 1,
    base: int = 0,
    start: int = 0,
) -> None:
    """The top-``k`` (unsorted) of each row of ``scores [outer, inner, width]`` into ``values``,
    ``indices [outer, inner, k]`` (views allowed), an index being ``start + (o // groups) * base + column``.

    The values are ``torch.topk``'s (NaN largest); on ties at the k-th value the columns the scan
    met first are kept.
    """
    _check(scores, k, values, indices)
    lib = _library()
    if lib is None:
        raise RuntimeError("row_topk_: no compiled kernel (implementations.native.available() is False)")
    fn = getattr(lib, f"{_SUFFIX[scores.dtype]}_row_topk")
    outer, inner, width = scores.shape
    rows = outer * inner
    if rows == 0:
        return
    args = (
        scores.data_ptr(),
        inner,
        scores.stride(0),
        scores.stride(1),
        width,
        k,
        values.data_ptr(),
        indices.data_ptr(),
        indices.element_size(),
        values.stride(0),
        values.stride(1),
        groups,
        base,
        start,
        groups_for(width, k),
    )
    # Threads of torch's OpenMP team (where built with it) take blocks of rows in turn: a
    # static half each measured 1.05x one thread's speed on 2 cores, a thread pool of our own
    # competing with torch's workers still spinning after the product that made the tile.
    threads = max(1, min(torch.get_num_threads(), rows // MIN_ROWS_PER_THREAD))
    block = max(1, rows // (threads * BLOCKS_PER_THREAD))
    codes = [fn(*args, rows, block, threads)]
    if any(codes):
        raise MemoryError("row_topk_: the kernel could not allocate its scratch")


@row_topk_.register_fake
def _(scores, k, values, indices, groups=1, base=0, start=0):
    _check(scores, k, values, indices)


@torch.library.custom_op(
    "implementations::key_sort_", mutates_args=("rows", "starts", "a_out", "b_out"), device_types="cpu"
)
def key_sort_(
    keys: torch.Tensor,
    lo: int,
    per_row: int,
    rows: torch.Tensor,
    starts: torch.Tensor,
    a: torch.Tensor | None = None,
    a_out: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    b_out: torch.Tensor | None = None,
) -> None:
    """The entries of ``keys`` (1-D int32/int64, values in ``[lo, lo + len(starts) - 1)``) by key, stably:
    ``rows[p] = e // per_row`` for the p-th entry ``e`` (int64), ``a_out[p] = a[e]``, ``b_out[p] = b[e]``
    (optional), and ``starts`` (int64) where each key's entries begin, the last one ``len(keys)``
    (``torch.sort(keys, stable=True)`` and ``searchsorted``, then ``index_select`` by its indices)."""
    _check_sort(keys, rows, starts, ((a, a_out), (b, b_out)))
    lib = _library()
    if lib is None:
        raise RuntimeError("key_sort_: no compiled kernel (implementations.native.built() is False)")
    carried: list[int | None] = []
    for src, dst in ((a, a_out), (b, b_out)):  # _check_sort: both given, or neither
        carried += (
            [None, None, 0] if src is None or dst is None else [src.data_ptr(), dst.data_ptr(), src.element_size()]
        )
    threads = max(1, min(torch.get_num_threads(), keys.numel() // (1 << 16)))
    if lib.key_sort(
        keys.data_ptr(),
        keys.element_size(),
        keys.numel(),
        lo,
        starts.numel() - 1,
        per_row,
        rows.data_ptr(),
        starts.data_ptr(),
        *carried,
        threads,
    ):
        raise ValueError(f"key_sort_: a key outside [{lo}, {lo + starts.numel() - 1})")


@key_sort_.register_fake
def _(keys, lo, per_row, rows, starts, a=None, a_out=None, b=None, b_out=None):
    _check_sort(keys, rows, starts, ((a, a_out), (b, b_out)))


def _check_sort(keys, rows, starts, carried) -> None:
    if keys.dim() != 1 or rows.shape != keys.shape or starts.dim() != 1 or starts.numel() < 1:
        raise ValueError("key_sort_: keys and rows must be 1-D of one length, starts 1-D")
    if keys.dtype not in _INDEX_DTYPES or rows.dtype != torch.int64 or starts.dtype != torch.int64:
        raise ValueError(f"key_sort_: dtypes {keys.dtype}/{rows.dtype}/{starts.dtype} not supported")
    tensors = [keys, rows, starts]
    for src, dst in carried:
        if (src is None) != (dst is None):
            raise ValueError("key_sort_: a carried array needs both its input and its output")
        if src is not None:
            if (
                src.shape != keys.shape
                or dst.shape != keys.shape
                or src.dtype != dst.dtype
                or src.element_size() not in (2, 4, 8)
            ):
                raise ValueError("key_sort_: a carried array must be 1-D like keys, its output of its dtype")
            tensors += [src, dst]
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("key_sort_: every array must be contiguous")
