"""Compiled CPU kernels for ``topk_fast``, as torch ops: the exact row-wise top-k of score tiles
(``row_topk.c``) and the stable key sort of the backward's entries (``key_sort.c``).

``torch.topk`` on CPU copies each row into (value, index) pairs and runs ``nth_element`` (or
a heap) on all of them, a branch mispredicted per comparison: ~9 ns an element on an AVX2
EPYC, more than the score product that made the row. ``row_topk_`` filters a row against a threshold at or
below its k-th score, one vectorised compare per score, into a few candidates (~1.4·k), then selects the k
among them exactly by counts of their keys (integers in rank order); the threshold comes from a vectorised
maximum over 2k strided groups of the row (k groups reach it, so k scores do), or, for a k that is a large
share of the row (a decode step's), from a sample of the row, checked. The same columns whatever the CPU's
vector instructions (AVX-512, AVX2, or portable C: :func:`filter_levels`). ``key_sort_`` is a counting sort
that carries each entry's query row and weights along (``torch.sort``, ``searchsorted`` and two
``index_select`` before).

- Built on first use with the system C compiler for this CPU and cached (:mod:`.build`: a cache only this user
  can write, a compiler under a time limit, the functions' types declared once). Without the kernels (no
  compiler, ``TOPK_BENCH_NATIVE=0``, a failed build: :func:`status` says which), :func:`available` and
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

import functools
import os
import warnings
from dataclasses import dataclass

import torch

from topk_bench.attention.kernels.native import build

# Rows per kernel call below which splitting between threads costs more than it saves.
MIN_ROWS_PER_THREAD = 16
# Blocks of rows per thread, handed out as threads ask for them.
BLOCKS_PER_THREAD = 8

# The row top-k's score types: float32, float64, int16 ranks, and half floats ranked by their bits made ordered
# (topk_bench/attention/methods/topk_fast.py's _ordered_bits: the same keys as its int16 ranks, without converting the
# scores).
_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.int16: "i16", torch.bfloat16: "h16", torch.float16: "h16"}
_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class Status:
    """Whether the compiled kernels are used on this machine: ``key`` is the build's (sources, flags, compiler, CPU),
    else ``reason`` says why not."""

    built: bool
    key: str = ""
    reason: str = ""

    def describe(self) -> str:
        return f"built {self.key}" if self.built else f"not used: {self.reason}"


@functools.lru_cache(maxsize=1)
def _loaded():
    try:
        lib, key = build.load()
    except build.Unavailable as why:
        if "TOPK_BENCH_NATIVE=0" not in str(why) and "no C compiler" not in str(why):
            warnings.warn(
                f"topk_bench.attention.kernels.native: no compiled kernels ({why}); using torch's", stacklevel=3
            )
        return None, Status(False, reason=str(why))
    lib.row_topk_isa(_ISA_LEVELS.index(_isa_cap()))
    return lib, Status(True, key=key)


# The row top-k's filter, by the instructions it uses: the highest this CPU's build has (AVX-512 where its
# compiler saw it, else AVX2, else portable C), at most what $TOPK_BENCH_NATIVE_ISA names. Every level keeps the
# same columns: the variable (or :func:`filter_levels`) runs the fallbacks here, as a CPU without AVX-512 would.
ISA = "TOPK_BENCH_NATIVE_ISA"
_ISA_LEVELS = ("portable", "avx2", "avx512")


def _isa_cap() -> str:
    cap = os.environ.get(ISA, "avx512") or "avx512"
    if cap not in _ISA_LEVELS:
        levels = ", ".join(_ISA_LEVELS)
        warnings.warn(f"{__name__}: {ISA}={cap!r} is none of {levels}; using avx512", stacklevel=4)
        return "avx512"
    return cap


def filter_levels(cap: str | None = None) -> dict[str, str]:
    """The level each score width's filter runs at (``{"32-bit": "avx512", "16-bit": "avx512"}``), after capping
    them at ``cap`` (one of ``portable``, ``avx2``, ``avx512``) when given. Not while a kernel runs."""
    lib = _library()
    if lib is None:
        raise RuntimeError("filter_levels: no compiled kernel (topk_bench.attention.kernels.native.built() is False)")
    if cap is not None and cap not in _ISA_LEVELS:
        raise ValueError(f"filter_levels: cap {cap!r} is none of {', '.join(_ISA_LEVELS)}")
    both = lib.row_topk_isa(-1 if cap is None else _ISA_LEVELS.index(cap))
    return {"32-bit": _ISA_LEVELS[both // 10], "16-bit": _ISA_LEVELS[both % 10]}


def _library():
    return _loaded()[0]


def status() -> Status:
    """Whether the kernels are used here, and why not (builds them on first call)."""
    return _loaded()[1]


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
    """The top-``k`` of each row of ``scores [outer, inner, width]`` into ``values``,
    ``indices [outer, inner, k]`` (views allowed), an index being ``start + (o // groups) * base + column``.

    The values are ``torch.topk``'s (NaN largest, -0 and +0 equal); ties at the k-th value go to the lowest
    columns, and the k are written in ascending column order: the first k of a stable descending sort, in column
    order. Half scores (bfloat16, float16) are ranked by their bits made ordered (those of
    ``topk_bench.attention.methods.topk_fast._ordered_bits``, as int16 scores rank), not converted.
    """
    _check(scores, k, values, indices)
    lib = _library()
    if lib is None:
        raise RuntimeError("row_topk_: no compiled kernel (topk_bench.attention.kernels.native.available() is False)")
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
        raise RuntimeError("key_sort_: no compiled kernel (topk_bench.attention.kernels.native.built() is False)")
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
