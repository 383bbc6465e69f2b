"""Decode steps of ``page_topk`` and ``topk_fast`` on CUDA as Triton kernels (:mod:`.decode_kernels`), exposed as
torch ops: one op per step, a chain of four launches.

- ``page_topk`` (:func:`page_topk_decode`): page bounds from the min/max summaries → each table row's best pages
  (exact radix select: ties at the last page kept go to the lowest page) → split-KV attention over the chosen pages
  plus the row's own page (flash-decoding: a program per (row, split), a few pages each) → a log-sum-exp combine.
  The selection is ``select_blocks``' (Quest bounds, float32; the group's largest bound with ``group_pages``) up to
  float32 summation order and its tie rule; the scores of the chosen keys are rounded to a half input's dtype and
  the weights to V's, as the torch path's half products; softmax and every sum are float32.
- ``topk_fast`` (:func:`topk_fast_decode`): every score of the step (in the dtype the CPU path ranks by: float32, or
  the input's half dtype with ``float_scores=False``) → each row's exact top-k (ties: the lowest key index) →
  softmax or relu over the selected scores times the gathered V rows, split as above, float32.

Every buffer (scores or bounds, tables, the splits' partials, the output) is allocated by torch around the ops;
their fake kernels allocate nothing, so ``FakeTensorMode`` (``--predict --device cuda``) sees every byte a real step
allocates. CPU tensors run the same kernels in Triton's interpreter (how the tests hold them to the float64 oracle).

Not here (``*_unsupported`` says why, the caller keeps its torch path): CPU tensors, float64, key padding, head sizes
over ``MAX_DECODE_HEAD_DIM``, pages over ``MAX_PAGE_SIZE`` keys, more than ``ROWS`` query heads per page table,
calls that are not decode steps, calls :mod:`.defaults` leaves to the torch path (``topk_fast``'s, unless
``TOPK_BENCH_TRITON=1``) and a machine without an importable ``triton``. Importable without triton.
"""

from __future__ import annotations

import torch

from topk_bench.attention.kernels.triton import defaults
from topk_bench.attention.kernels.triton.launch import (
    KERNEL_DTYPES,
    cdiv,
    launch_kernel,
    pow2_at_least,
    strides,
    why_not_taken_warned,
)
from topk_bench.attention.shared.decode import use_decode_path
from topk_bench.attention.shared.hardware import device_kind

# Largest head size of the decode kernels (a program holds a [ROWS, D] query tile and [D, keys] key tiles).
MAX_DECODE_HEAD_DIM = 256
# Largest page: one product covers at least one page (CHUNK_KEYS keys, or a page when larger).
MAX_PAGE_SIZE = 128
# Query rows of a page-attention program (tl.dot's minimum tile side): the query heads sharing one page table.
ROWS = 16
# Keys per product of the page attention (whole pages) and entries per step of the gathered split.
CHUNK_KEYS = 64
GATHER_CHUNK = 32
# Splits per row: enough programs to fill an H100 (132 SMs) twice over for a few rows, at most MAX_SPLITS
# (the combine reads them as one tile).
TARGET_PROGRAMS = 264
MAX_SPLITS = 32
# Bounds per program of the page bounds, scores per program of the decode scores, columns per step of the select.
BLOCK_P = 16
BLOCK_N = 64
SELECT_BLOCK = 1024
# The row top-k: rows up to ONE_PROGRAM_WIDTH take one program each (row_topk_kernel: ROW_TOPK_WALKS walks over the
# row in serial steps of SELECT_BLOCK columns, each waiting for its load: ~1.6 us a step on an H200, where 32 rows of
# 131,072 took 2 ms); longer rows are split into chunks of SELECT_CHUNK columns, a program each (the radix
# kernels: six launches and a fill, a few us each whatever the width). The GPU time model puts the two level
# between 2,048 and 4,096 columns (8 rows: ~30 us for one program a row at 2,048, ~40 us for the radix chain;
# at 8,192, page_topk's rows at 128K keys in pages of 16, 108 us against 42 us).
ONE_PROGRAM_WIDTH = 2 * SELECT_BLOCK
SELECT_CHUNK = 2048
# Chunk counts summed per step by a radix write program (those of the chunks before its own).
PRIOR_CHUNKS = 128
# Both row top-ks find the n-th largest score's key (its float32 bits made monotone) a digit at a time, from the
# top: the one-program select 4 bits a pass (16 candidate prefixes counted per pass, a [SELECT_BLOCK, 16] compare),
# then a walk that counts the keys above it and one that writes the picks; the radix select 8 bits a pass (a
# histogram of 256 bins a row, in its scratch).
KEY_BITS = torch.finfo(torch.float32).bits  # a key is a float32 score's bits
ROW_TOPK_DIGIT_BITS = 4
ROW_TOPK_DIGITS = 1 << ROW_TOPK_DIGIT_BITS
ROW_TOPK_PASSES = KEY_BITS // ROW_TOPK_DIGIT_BITS
ROW_TOPK_WALKS = ROW_TOPK_PASSES + 2
RADIX_DIGIT_BITS = 8
RADIX_BINS = 1 << RADIX_DIGIT_BITS
RADIX_PASSES = KEY_BITS // RADIX_DIGIT_BITS
# The int32 mask of a key's first p digits, p = 0 .. RADIX_PASSES - 1 (what a histogram pass matches on).
RADIX_HIGH = tuple(-(1 << (KEY_BITS - RADIX_DIGIT_BITS * p)) if p else 0 for p in range(RADIX_PASSES))


def _common(name: str, q, k, v) -> str | None:
    if device_kind(q) != "cuda":
        return "not a CUDA tensor"
    why = why_not_taken_warned(name, defaults.DECODE, "the torch decode path", stacklevel=4)
    if why is not None:
        return why
    if q.dtype not in KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}"
    if max(q.shape[-1], v.shape[-1]) > MAX_DECODE_HEAD_DIM:
        return f"head size > {MAX_DECODE_HEAD_DIM}"
    return None


def page_topk_unsupported(q, k, v, *, causal: bool, page_size: int, group_pages: bool, chunk_size: int) -> str | None:
    """Why the Triton kernels do not take this ``page_topk`` call (None: they do): only decode steps (the calls
    the torch path serves by gathering whole pages) on CUDA."""
    why = _common("page_topk", q, k, v)
    if why is not None:
        return why
    lq, lk = q.shape[-2], k.shape[-2]
    if not use_decode_path(q, k, v, chunk_size, 0.0) or page_size > lk or (causal and lq > lk):
        return "not a decode step"
    if page_size > MAX_PAGE_SIZE:
        return f"page_size > {MAX_PAGE_SIZE}"
    per = q.shape[1] // k.shape[1] if group_pages else 1
    if per > ROWS:
        return f"more than {ROWS} query heads per K/V head"
    return None


def topk_fast_unsupported(q, k, v, *, key_padding_mask) -> str | None:
    """Why the Triton kernels do not take this ``topk_fast`` decode step (None: they do)."""
    why = _common("topk_fast", q, k, v)
    if why is not None:
        return why
    if key_padding_mask is not None:
        return "key padding"
    return None


def _splits(rows: int, entries: int, chunk: int) -> tuple[int, int]:
    """``(splits, entries per split)`` of ``entries`` per row: about ``TARGET_PROGRAMS`` programs in all, at most
    ``MAX_SPLITS`` per row, whole ``chunk``\\ s per split."""
    want = max(1, min(MAX_SPLITS, cdiv(entries, chunk), cdiv(TARGET_PROGRAMS, max(1, rows))))
    per_split = cdiv(cdiv(entries, want), chunk) * chunk
    return cdiv(entries, per_split), per_split


def _half_dot(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and t.dtype != torch.float32


# -- each kernel's constexprs and launch options, and its grid (the programs its launch runs) ------------------


def page_config(d: int, dv: int, page_size: int) -> dict:
    """Constexprs and launch options of ``page_attention_kernel``."""
    page_pad = pow2_at_least(page_size, 1)
    return dict(
        D=d, D_PAD=pow2_at_least(d), DV=dv, DV_PAD=pow2_at_least(dv), ROWS=ROWS, PAGE_PAD=page_pad,
        CHUNK_PAGES=max(1, CHUNK_KEYS // page_pad), num_warps=8,
    )  # fmt: skip


def bounds_config(d: int) -> dict:
    return dict(D=d, D_PAD=pow2_at_least(d), BLOCK_P=BLOCK_P, num_warps=4)


def bounds_grid(batch: int, kv_heads: int, pages: int) -> tuple[int, int]:
    """``page_bounds_kernel``'s programs: ``BLOCK_P`` pages of one K/V head each."""
    return (cdiv(pages, BLOCK_P), batch * kv_heads)


def scores_config(d: int) -> dict:
    return dict(D=d, D_PAD=pow2_at_least(d), ROWS=ROWS, BLOCK_N=BLOCK_N, num_warps=4)


def scores_grid(batch: int, heads: int, kv_heads: int, lq: int, lk: int) -> tuple[int, int, int]:
    """``decode_scores_kernel``'s programs: ``BLOCK_N`` keys of ``ROWS`` query rows of one K/V head's group each."""
    return (cdiv(lk, BLOCK_N), cdiv(heads // kv_heads * lq, ROWS), batch * kv_heads)


def gathered_split_config(dv: int) -> dict:
    return dict(DV=dv, DV_PAD=pow2_at_least(dv), CHUNK=GATHER_CHUNK, num_warps=4)


def split_grid(rows: int, splits: int) -> tuple[int, int]:
    """The programs of a split attention (``page_attention_kernel``, ``gathered_split_kernel``): one a split of a
    row."""
    return (rows, splits)


def combine_config(dv: int) -> dict:
    return dict(DV=dv, DV_PAD=pow2_at_least(dv), SPLITS_PAD=MAX_SPLITS, num_warps=4)


def combine_grid(rows: int) -> tuple[int]:
    """``split_combine_kernel``'s programs: one an output row."""
    return (rows,)


SELECT_CONFIG = dict(BLOCK=SELECT_BLOCK, DIGIT_BITS=ROW_TOPK_DIGIT_BITS, num_warps=8)
RADIX_CONFIG = dict(CHUNK=SELECT_CHUNK, DIGIT_BITS=RADIX_DIGIT_BITS, num_warps=8)


def select_chunks(width: int) -> int:
    """Programs per row of the row top-k of rows ``width`` long: 1 (one program walks the row) or its chunks of
    ``SELECT_CHUNK`` (the multi-program radix select). The one place the choice is made."""
    return 1 if width <= ONE_PROGRAM_WIDTH else cdiv(width, SELECT_CHUNK)


def row_topk_grid(rows: int, width: int) -> tuple[int, int]:
    """The row top-k's programs (each of its launches): ``(rows, chunks a row)``, one chunk a row for one program
    walking it."""
    return (rows, select_chunks(width))


def select_scratch(rows: int, width: int, device) -> torch.Tensor:
    """The zeroed int32 scratch of the row top-k of ``rows`` rows ``width`` long (``[rows, 0]`` for one program a
    row): per row, the radix select's ``RADIX_PASSES`` histograms of ``RADIX_BINS`` counts, then 2 counts per
    chunk."""
    chunks = select_chunks(width)
    if chunks == 1:  # no scratch, and no fill kernel for it
        return torch.empty(rows, 0, dtype=torch.int32, device=device)
    return torch.zeros(rows, RADIX_PASSES * RADIX_BINS + 2 * chunks, dtype=torch.int32, device=device)


def row_topk(scores: torch.Tensor, idx: torch.Tensor, scratch: torch.Tensor) -> None:
    """``idx [rows, n]``: each row's ``n`` best columns of ``scores [rows, width]``, ascending (``scratch``:
    :func:`select_scratch`, zeroed)."""
    from topk_bench.attention.kernels.triton import decode_kernels as dk

    rows, width = scores.shape
    n = idx.shape[1]
    grid = row_topk_grid(rows, width)
    if grid[1] == 1:
        launch_kernel(dk.row_topk_kernel, scores.device, grid, scores, idx, scores.stride(0),
                      idx.stride(0), width, n, **SELECT_CONFIG)  # fmt: skip
        return
    row_strides = (scores.stride(0), scratch.stride(0))
    for p, high in enumerate(RADIX_HIGH):
        launch_kernel(dk.radix_histogram_kernel, scores.device, grid, scores, scratch, *row_strides, width,
                      n, p, high, **RADIX_CONFIG)  # fmt: skip
    launch_kernel(dk.radix_count_kernel, scores.device, grid, scores, scratch, *row_strides, width, n, **RADIX_CONFIG)
    launch_kernel(dk.radix_write_kernel, scores.device, grid, scores, scratch, idx, *row_strides, idx.stride(0),
                  width, n, PRIOR=PRIOR_CHUNKS, **RADIX_CONFIG)  # fmt: skip


def _combine(acc, stats, out, ht: int, per: int, relu: bool) -> None:
    from topk_bench.attention.kernels.triton import decode_kernels as dk

    lq, dv = out.shape[-2], out.shape[-1]
    launch_kernel(dk.split_combine_kernel, out.device, combine_grid(acc.shape[0]), acc, stats, out,
                  *strides(out), ht, per, lq, acc.shape[1], RELU=relu, **combine_config(dv))  # fmt: skip


@torch.library.custom_op(
    "implementations::triton_page_decode_", mutates_args=("bounds", "table", "select", "acc", "stats", "out")
)
def page_decode_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    summaries: torch.Tensor,
    bounds: torch.Tensor,
    table: torch.Tensor,
    select: torch.Tensor,
    acc: torch.Tensor,
    stats: torch.Tensor,
    out: torch.Tensor,
    causal: bool,
    page_size: int,
    pages_per_split: int,
) -> None:
    """One ``page_topk`` decode step into ``out [B, Hq, Lq, DV]``. Scratch: ``bounds [rows, P]`` float32 and
    ``table [rows, n]`` int32 (rows: ``B·Ht·Lq``, ``Ht`` = K/V heads for a shared table, else query heads; ``n``
    picked pages per row, 0: the own page only), the row top-k's zeroed ``select`` (:func:`select_scratch` of the
    bounds), the splits' ``acc [rows·per, splits, DV]`` and ``stats [rows·per, splits, 2]`` float32."""
    from topk_bench.attention.kernels.triton import decode_kernels as dk

    b, hq, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    rows, n = table.shape
    if rows == 0:
        return
    ht = rows // (b * lq)
    per, groups = hq // ht, hq // hkv
    pages = summaries.shape[2]
    if n:
        launch_kernel(dk.page_bounds_kernel, q.device, bounds_grid(b, hkv, pages), q, summaries, bounds,
                      *strides(q), *strides(summaries), hkv, lq, lk, pages, page_size, groups,
                      CAUSAL=causal, SHARED=ht == hkv and groups > 1, **bounds_config(d))  # fmt: skip
        row_topk(bounds, table, select)
    launch_kernel(dk.page_attention_kernel, q.device, split_grid(rows, acc.shape[1]), q, k, v, table, acc,
                  stats, *strides(q), *strides(k), *strides(v), ht, per, groups, lq, lk, page_size, n,
                  pages_per_split, acc.shape[1], CAUSAL=causal, ROUND=q.dtype != torch.float32,
                  HALF_DOT=_half_dot(q), **page_config(d, dv, page_size))  # fmt: skip
    _combine(acc, stats, out, ht, per, relu=False)


@page_decode_.register_fake
def _(q, k, v, summaries, bounds, table, select, acc, stats, out, causal, page_size, pages_per_split) -> None:
    return None


def page_topk_decode(q, k, v, summaries, *, causal: bool, page_size: int, n_top: int, group_pages: bool):
    """``page_topk``'s decode step (the caller checked :func:`page_topk_unsupported`): each table row attends its
    ``min(n_top, P - 1)`` best-bounded eligible pages and its own page. ``summaries [B, Hkv, P, 2, d]``
    (:func:`~topk_bench.attention.methods.page_topk.page_summaries`, any float dtype)."""
    b, hq, lq, _ = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    pages = cdiv(lk, page_size)
    n = max(0, min(int(n_top), pages - 1))
    ht = hkv if group_pages else hq
    per = hq // ht
    rows = b * ht * lq
    splits, pages_per_split = _splits(rows, n + 1, max(1, CHUNK_KEYS // pow2_at_least(page_size, 1)))
    device = q.device
    bounds = torch.empty(rows if n else 0, pages, dtype=torch.float32, device=device)
    table = torch.empty(rows, n, dtype=torch.int32, device=device)
    select = select_scratch(rows if n else 0, pages, device)
    acc = torch.empty(rows * per, splits, dv, dtype=torch.float32, device=device)
    stats = torch.empty(rows * per, splits, 2, dtype=torch.float32, device=device)
    out = torch.empty(b, hq, lq, dv, dtype=v.dtype, device=device)
    page_decode_(q, k, v, summaries, bounds, table, select, acc, stats, out, bool(causal), int(page_size),
                 pages_per_split)  # fmt: skip
    return out


@torch.library.custom_op(
    "implementations::triton_topk_decode_", mutates_args=("scores", "idx", "select", "acc", "stats", "out")
)
def topk_decode_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scores: torch.Tensor,
    idx: torch.Tensor,
    select: torch.Tensor,
    acc: torch.Tensor,
    stats: torch.Tensor,
    out: torch.Tensor,
    causal: bool,
    relu: bool,
    per_split: int,
) -> None:
    """One ``topk_fast`` decode step into ``out [B, Hq, Lq, DV]``. Scratch: ``scores [B·Hq·Lq, Lk]`` (float32, or
    the input's half dtype: the ranking), ``idx [B·Hq·Lq, kk]`` int32, the row top-k's zeroed ``select``
    (:func:`select_scratch`), the splits' ``acc`` and ``stats``."""
    from topk_bench.attention.kernels.triton import decode_kernels as dk

    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    groups = hq // hkv
    if scores.numel() == 0:
        return
    launch_kernel(dk.decode_scores_kernel, q.device, scores_grid(b, hq, hkv, lq, lk), q, k, scores,
                  *strides(q), *strides(k), hkv, groups, lq, lk, CAUSAL=causal, HALF_DOT=_half_dot(q),
                  **scores_config(d))  # fmt: skip
    row_topk(scores, idx, select)
    launch_kernel(dk.gathered_split_kernel, q.device, split_grid(idx.shape[0], acc.shape[1]), scores, idx,
                  v, acc, stats, *strides(v), hq, groups, lq, lk, idx.shape[1], per_split, acc.shape[1],
                  RELU=relu, **gathered_split_config(v.shape[-1]))  # fmt: skip
    _combine(acc, stats, out, hq, 1, relu=relu)


@topk_decode_.register_fake
def _(q, k, v, scores, idx, select, acc, stats, out, causal, relu, per_split) -> None:
    return None


def topk_fast_decode(q, k, v, *, causal: bool, relu: bool, topk: int, float_scores: bool):
    """``topk_fast``'s decode step (the caller checked :func:`topk_fast_unsupported`): the exact top-``topk`` keys
    of each query row, ranked as the CPU path ranks (half inputs: by the product rounded to their dtype unless
    ``float_scores``), softmax (or relu) over their scores times their V rows."""
    b, hq, lq, _ = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    kk = min(int(topk), lk)
    rows = b * hq * lq
    splits, per_split = _splits(rows, kk, GATHER_CHUNK)
    device = q.device
    rank_dtype = q.dtype if q.dtype != torch.float32 and not float_scores else torch.float32
    scores = torch.empty(rows, lk, dtype=rank_dtype, device=device)
    idx = torch.empty(rows, kk, dtype=torch.int32, device=device)
    select = select_scratch(rows, lk, device)
    acc = torch.empty(rows, splits, dv, dtype=torch.float32, device=device)
    stats = torch.empty(rows, splits, 2, dtype=torch.float32, device=device)
    out = torch.empty(b, hq, lq, dv, dtype=v.dtype, device=device)
    topk_decode_(q, k, v, scores, idx, select, acc, stats, out, bool(causal), bool(relu), per_split)
    return out
