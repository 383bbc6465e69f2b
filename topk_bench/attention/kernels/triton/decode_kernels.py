"""The Triton kernels of a decode step (a few query rows against a long KV cache): ``page_topk`` (Quest) and
``topk_fast``. Launched by :mod:`topk_bench.attention.kernels.triton.decode`; compiled ahead of time by
``.ci/compile_triton_kernels.py``.

Two launch chains, each ending in the same combine:

- ``page_topk``: :func:`page_bounds_kernel` (each page's upper bound of ``q·k`` from its min/max summaries, ``-inf``
  for pages a row may not pick) → the row top-k (each row's best ``n`` pages) →
  :func:`page_attention_kernel` (one program per (table row, split): exact softmax attention over a few chosen pages
  and the row's own page, flash-decoding's partial ``(max, sum, acc)``) → :func:`split_combine_kernel`;
- ``topk_fast``: :func:`decode_scores_kernel` (every score of the step) → the row top-k (each row's exact top-k) →
  :func:`gathered_split_kernel` (softmax or relu over a split of the selected scores, times the gathered V rows) →
  :func:`split_combine_kernel`.

Layouts (through strides): ``Q [B, Hq, Lq, D]``, ``K [B, Hkv, Lk, D]``, ``V [B, Hkv, Lk, DV]``, ``OUT [B, Hq, Lq,
DV]``; query head ``h`` reads K/V head ``h // groups``; query ``i`` sits at position ``Lk - Lq + i`` (bottom-right
causal alignment). Scratch (rows of scores or bounds, tables, partials) is contiguous and allocated by the caller.

The row top-k is one of two, by row length (``decode.row_topk``): :func:`row_topk_kernel`, one program walking a
short row, or a radix select split over many programs a row (:func:`radix_histogram_kernel` four times,
:func:`radix_count_kernel`, :func:`radix_write_kernel`), for the long rows of ``topk_fast`` (one per query row).

On CPU tensors the same functions run in Triton's interpreter (``TRITON_INTERPRET=1``), except the native half
product (``HALF_DOT``: the interpreter's is wrong), replaced there by the same product of the values widened.
"""

from __future__ import annotations

import triton
import triton.language as tl

from topk_bench.attention.kernels.triton.online_softmax import online_softmax_step
from topk_bench.attention.kernels.triton.rounding import rounded

# The bits of a key, a float32 score's bits made monotone, that both row top-ks pick a digit at a time.
_KEY_BITS = tl.constexpr(tl.float32.primitive_bitwidth)


@triton.jit
def _ordered(s):
    """Float32 ``s`` as int64 keys in ``[0, 2^32)`` in the same order (-0.0 and +0.0 one key)."""
    bits = (s + 0.0).to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return ordered.to(tl.int64) + 2147483648


@triton.jit
def row_topk_kernel(
    SCORES,
    IDX,
    stride_sr,
    stride_ir,
    width,
    n,
    BLOCK: tl.constexpr,
    DIGIT_BITS: tl.constexpr,
):
    """The ``n`` highest of one row's ``width`` scores (float32, or a half dtype read as float32), exactly, as
    their columns in ascending order (``-1`` for a pick scored ``-inf``: a row with fewer than ``n`` allowed
    entries). Ties at the n-th score: the lowest columns win.

    A radix select, no sort: the n-th largest key ``T`` (float32 bits made monotone) is found ``DIGIT_BITS`` bits
    at a time, counting per pass how many keys reach each of the ``2^DIGIT_BITS`` candidate prefixes (a pass over
    the row each: 8 of 4 bits); then one pass counts the keys above ``T`` and one writes the keys above ``T`` and
    the first ``n - count`` equal to it, in column order (a running prefix sum). The row is read ``32 / DIGIT_BITS
    + 2`` times (from L2 on a GPU: 32 KiB for 8192 pages), never held whole, so any width compiles to the same
    kernel.
    """
    DIGITS: tl.constexpr = 1 << DIGIT_BITS
    PASSES: tl.constexpr = _KEY_BITS // DIGIT_BITS
    row = tl.program_id(0).to(tl.int64)  # offsets past 2^31 at large batches: 64-bit row offsets throughout
    base = SCORES + row * stride_sr
    digits = tl.arange(0, DIGITS).to(tl.int64)
    threshold = tl.zeros([], tl.int64)
    for p in tl.static_range(PASSES):
        shift = _KEY_BITS - DIGIT_BITS * (p + 1)
        cand = threshold + (digits << shift)
        counts = tl.zeros([DIGITS], tl.int32)
        for c0 in range(0, width, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            key = _ordered(tl.load(base + cols, mask=cols < width, other=0.0).to(tl.float32))
            key = tl.where(cols < width, key, -1)
            counts += tl.sum((key[:, None] >= cand[None, :]).to(tl.int32), axis=0)
        # counts fall with the digit and counts[0] >= n: the largest digit that keeps n keys
        best = tl.sum((counts >= n).to(tl.int32), axis=0) - 1
        threshold = threshold + (best.to(tl.int64) << shift)
    above = tl.zeros([], tl.int32)
    for c0 in range(0, width, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        key = tl.where(cols < width, _ordered(tl.load(base + cols, mask=cols < width, other=0.0).to(tl.float32)), -1)
        above += tl.sum((key > threshold).to(tl.int32), axis=0)
    ties = n - above  # equal keys to keep, the lowest columns first
    written = tl.zeros([], tl.int32)
    seen_ties = tl.zeros([], tl.int32)
    for c0 in range(0, width, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        s = tl.load(base + cols, mask=cols < width, other=0.0).to(tl.float32)
        key = tl.where(cols < width, _ordered(s), -1)
        tie = (key == threshold).to(tl.int32)
        tie_rank = seen_ties + tl.cumsum(tie, axis=0) - 1
        take = (key > threshold) | ((tie > 0) & (tie_rank < ties))
        at = written + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(IDX + row * stride_ir + at, tl.where(s == float("-inf"), -1, cols), mask=take)
        written += tl.sum(take.to(tl.int32), axis=0)
        seen_ties += tl.sum(tie, axis=0)


# The multi-program select: DIGIT_BITS-bit digits of 32-bit keys (decode.RADIX_DIGIT_BITS: 8, 4 passes); a row's
# scratch holds a histogram of 2^DIGIT_BITS counts a pass (from 0 on entry), then (above, equal) counts per chunk.


@triton.jit
def _radix_key(s):
    """Float32 ``s`` as 32 bits whose unsigned order is its order (-0.0 and +0.0 one key): an int32 (a negative
    float's bits all flipped, a positive's sign bit set); ``^ -2^31`` gives the same order signed."""
    bits = (s + 0.0).to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) | -2147483648)


@triton.jit
def _radix_threshold(HIST, n, passes, DIGIT_BITS: tl.constexpr):
    """From a row's first ``passes`` histograms: the leading ``passes`` digits of its ``n``-th largest key
    (unsigned order, the rest 0), and how many keys sharing those digits are still to pick (``n`` less the
    keys whose digits are larger). Every program derives it from the 2^DIGIT_BITS x ``passes`` counts: cheaper than
    a launch that would store it."""
    BINS: tl.constexpr = 1 << DIGIT_BITS
    bins = tl.arange(0, BINS)
    prefix = tl.zeros([], tl.int32)
    want = tl.zeros([], tl.int32) + n
    for p in range(0, passes):
        h = tl.load(HIST + p * BINS + bins)
        at_least = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # keys with this digit or a larger one
        # at_least falls with the digit and at_least[0] >= want: the largest digit that keeps want keys
        digit = tl.sum((at_least >= want).to(tl.int32), axis=0) - 1
        want -= tl.sum(tl.where(bins > digit, h, 0), axis=0)
        prefix = prefix | (digit << (_KEY_BITS - DIGIT_BITS * (p + 1)))
    return prefix, want


@triton.jit
def _radix_chunk(SCORES, stride_sr, row, chunk, width, CHUNK: tl.constexpr):
    """A chunk of one row: (its columns, whether each is in the row, float32 scores, unsigned-order keys)."""
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = cols < width
    s = tl.load(SCORES + row * stride_sr + cols, mask=valid, other=0.0).to(tl.float32)
    return cols, valid, s, _radix_key(s)


@triton.jit
def radix_histogram_kernel(
    SCORES,
    SCRATCH,
    stride_sr,
    stride_wr,
    width,
    n,
    passes,
    high,
    CHUNK: tl.constexpr,
    DIGIT_BITS: tl.constexpr,
):
    """Pass ``passes`` (from 0) of the multi-program select, one program per (row, chunk of ``CHUNK`` columns): the
    chunk's keys whose first ``passes`` digits are the n-th largest key's (``high``: ``decode.RADIX_HIGH``),
    counted by their next digit into the row's histogram of this pass (one atomic add a nonzero bin)."""
    BINS: tl.constexpr = 1 << DIGIT_BITS
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    hist = SCRATCH + row * stride_wr
    prefix, _ = _radix_threshold(hist, n, passes, DIGIT_BITS)
    _, valid, _, key = _radix_chunk(SCORES, stride_sr, row, chunk, width, CHUNK)
    match = valid & (((key ^ prefix) & high) == 0)
    digit = (key >> (_KEY_BITS - DIGIT_BITS * (passes + 1))) & (BINS - 1)
    counts = tl.histogram(digit, BINS, mask=match)
    bins = tl.arange(0, BINS)
    tl.atomic_add(hist + passes * BINS + bins, counts, mask=counts > 0, sem="relaxed")


@triton.jit
def radix_count_kernel(
    SCORES,
    SCRATCH,
    stride_sr,
    stride_wr,
    width,
    n,
    CHUNK: tl.constexpr,
    DIGIT_BITS: tl.constexpr,
):
    """Per (row, chunk): how many of the chunk's keys are above the row's n-th largest key and how many equal it,
    stored after the row's histograms (what :func:`radix_write_kernel` needs of the chunks before its own)."""
    PASSES: tl.constexpr = _KEY_BITS // DIGIT_BITS
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    scratch = SCRATCH + row * stride_wr
    threshold, _ = _radix_threshold(scratch, n, PASSES, DIGIT_BITS)
    _, valid, _, key = _radix_chunk(SCORES, stride_sr, row, chunk, width, CHUNK)
    signed, at = key ^ -2147483648, threshold ^ -2147483648  # unsigned order as signed int32 compares
    above = tl.sum((valid & (signed > at)).to(tl.int32), axis=0)
    equal = tl.sum((valid & (signed == at)).to(tl.int32), axis=0)
    counts = scratch + PASSES * (1 << DIGIT_BITS) + 2 * chunk
    tl.store(counts, above)
    tl.store(counts + 1, equal)


@triton.jit
def radix_write_kernel(
    SCORES,
    SCRATCH,
    IDX,
    stride_sr,
    stride_wr,
    stride_ir,
    width,
    n,
    CHUNK: tl.constexpr,
    PRIOR: tl.constexpr,
    DIGIT_BITS: tl.constexpr,
):
    """Per (row, chunk): the chunk's picks (keys above the n-th largest, then those equal to it while the row
    still wants ties, lowest columns first) written at their place in the row's ascending list, after the picks
    of the chunks before it (their counts read ``PRIOR`` at a time); ``-1`` for a pick scored ``-inf``."""
    PASSES: tl.constexpr = _KEY_BITS // DIGIT_BITS
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    scratch = SCRATCH + row * stride_wr
    threshold, ties = _radix_threshold(scratch, n, PASSES, DIGIT_BITS)
    counts = scratch + PASSES * (1 << DIGIT_BITS)
    above_before = tl.zeros([], tl.int32)
    equal_before = tl.zeros([], tl.int32)
    for c0 in range(0, chunk, PRIOR):
        c = c0 + tl.arange(0, PRIOR)
        above_before += tl.sum(tl.load(counts + 2 * c, mask=c < chunk, other=0), axis=0)
        equal_before += tl.sum(tl.load(counts + 2 * c + 1, mask=c < chunk, other=0), axis=0)
    cols, valid, s, key = _radix_chunk(SCORES, stride_sr, row, chunk, width, CHUNK)
    signed, at = key ^ -2147483648, threshold ^ -2147483648
    tie = (valid & (signed == at)).to(tl.int32)
    tie_rank = equal_before + tl.cumsum(tie, axis=0) - 1
    take = (valid & (signed > at)) | ((tie > 0) & (tie_rank < ties))
    first = above_before + tl.minimum(equal_before, ties)
    place = first + tl.cumsum(take.to(tl.int32), axis=0) - 1
    tl.store(IDX + row * stride_ir + place, tl.where(s == float("-inf"), -1, cols), mask=take)


@triton.jit
def page_bounds_kernel(
    Q,
    S,
    BOUNDS,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_sb,
    stride_sh,
    stride_sp,
    stride_sm,
    stride_sd,
    Hkv,
    Lq,
    Lk,
    P,
    page_size,
    groups,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CAUSAL: tl.constexpr,
    SHARED: tl.constexpr,
):
    """Upper bounds ``Σ_d max(q_d·min_d, q_d·max_d)`` of ``q·k`` over ``BLOCK_P`` pages of one K/V head, for every
    query row of its group, float32 (``S [B, Hkv, P, 2, D]`` in any float dtype: the summaries are key values).

    ``BOUNDS`` rows: ``(b, table head, i)``, one per query head (table head = query head) or, ``SHARED``, one per
    K/V head with the largest of its G heads' bounds (the bound of the group). Pages a row may not pick get
    ``-inf``: its own page (added by the attention) and, causal, the pages after it.
    """
    pid_p = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // Hkv
    kv = bh % Hkv
    pages = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    d = tl.arange(0, D_PAD)
    mask = (pages[:, None] < P) & (d[None, :] < D)
    at = S + b * stride_sb + kv * stride_sh + pages[:, None] * stride_sp + d[None, :] * stride_sd
    lo = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    hi = tl.load(at + stride_sm, mask=mask, other=0.0).to(tl.float32)
    for i in range(0, Lq):
        own = tl.maximum(Lk - Lq + i, 0) // page_size
        if CAUSAL:
            shut = pages >= own
        else:
            shut = pages == own
        best = tl.full([BLOCK_P], float("-inf"), tl.float32)
        for g in range(0, groups):
            head = kv * groups + g
            q = tl.load(Q + b * stride_qb + head * stride_qh + i * stride_qm + d * stride_qd, mask=d < D, other=0.0)
            q = q.to(tl.float32)
            bound = tl.sum(tl.maximum(q[None, :] * lo, q[None, :] * hi), axis=1)
            if SHARED:
                best = tl.maximum(best, bound)
            else:
                row = (b * Hkv * groups + head) * Lq + i
                tl.store(BOUNDS + row * P + pages, tl.where(shut, float("-inf"), bound), mask=pages < P)
        if SHARED:
            row = (b * Hkv + kv) * Lq + i
            tl.store(BOUNDS + row * P + pages, tl.where(shut, float("-inf"), best), mask=pages < P)


@triton.jit
def _page_columns(ROW_TABLE, t, n, own, last, j, page_size, Lk, pos, CAUSAL: tl.constexpr):
    """The key columns of a row's table entries ``t`` (``ROW_TABLE``: its ``n`` picked pages, ``-1`` for a rejected
    pick; entry ``n``: the row's own page; entries from ``last`` on: none), and which of them the row attends."""
    page = tl.load(ROW_TABLE + t, mask=t < n, other=0)
    page = tl.where(t == n, own, page)
    page = tl.where(t < last, page, -1)
    col = page * page_size + j
    allowed = (page >= 0) & (j < page_size) & (col < Lk)
    if CAUSAL:
        allowed = allowed & (col <= pos)
    return tl.where(allowed, col, 0), allowed


@triton.jit
def _attend_columns(q, K_HEAD, V_HEAD, col, allowed, m, total, acc, stride_kn, stride_kd, stride_vn, stride_vd,
                    D: tl.constexpr, D_PAD: tl.constexpr, DV: tl.constexpr, DV_PAD: tl.constexpr,
                    ROUND: tl.constexpr, HALF_DOT: tl.constexpr):  # fmt: skip
    """The online softmax ``(max, sum, acc)`` of the query rows ``q`` after the key columns ``col`` of one K/V head
    (``allowed``: the ones they attend)."""
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, DV_PAD)
    kt = tl.load(K_HEAD + col[None, :] * stride_kn + d[:, None] * stride_kd,
                 mask=allowed[None, :] & (d[:, None] < D), other=0.0)  # fmt: skip
    if HALF_DOT:  # half inputs on the GPU: the native product, fp32 accumulation
        s = tl.dot(q, kt)
    else:
        s = tl.dot(q, kt.to(tl.float32), input_precision="ieee")
    if ROUND:  # the scores a half-precision product rounds (the torch path's bmm)
        s = rounded(s, K_HEAD.dtype.element_ty).to(tl.float32)
    s = tl.where(allowed[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf
    alpha = tl.exp(m - shift)
    p = tl.exp(s - shift[:, None])
    vt = tl.load(V_HEAD + col[:, None] * stride_vn + e[None, :] * stride_vd,
                 mask=allowed[:, None] & (e[None, :] < DV), other=0.0)  # fmt: skip
    if HALF_DOT:  # weights rounded to V's dtype, as the torch path's bmm takes them; fp32 accumulation
        pv = tl.dot(p.to(V_HEAD.dtype.element_ty), vt)
    else:
        pv = tl.dot(p, vt.to(tl.float32), input_precision="ieee")
    return m_new, total * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + pv


@triton.jit
def page_attention_kernel(Q, K, V, TABLE, ACC, STATS,
                          stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                          stride_vb, stride_vh, stride_vn, stride_vd,
                          Ht, per, groups, Lq, Lk, page_size, n, pages_per_split, splits,
                          D: tl.constexpr, D_PAD: tl.constexpr, DV: tl.constexpr, DV_PAD: tl.constexpr,
                          ROWS: tl.constexpr, PAGE_PAD: tl.constexpr, CHUNK_PAGES: tl.constexpr, CAUSAL: tl.constexpr,
                          ROUND: tl.constexpr, HALF_DOT: tl.constexpr):  # fmt: skip
    """One split of one table row ``(b, table head, i)``: its ``per`` query heads (``ROWS`` >= per, tl.dot's tile)
    attend exactly to the keys of table entries ``[split·pages_per_split, ...)`` of ``n + 1`` (the ``n`` picked
    pages of ``TABLE``, ``-1`` for a rejected pick, then the row's own page), ``CHUNK_PAGES`` pages per product.

    Writes the split's partial softmax: ``STATS [row·per + g, split, 2]`` = (max, sum) of its scores (``-inf, 0``:
    no allowed key) and ``ACC [row·per + g, split, DV]`` = ``Σ exp(s - max)·v``, float32.
    """
    trow = tl.program_id(0).to(tl.int64)  # 64-bit bases (large batches), 32-bit offsets within a head
    split = tl.program_id(1)
    i = (trow % Lq).to(tl.int32)
    bt = trow // Lq
    b = bt // Ht
    ht = bt % Ht
    kv = ht * per // groups
    pos = Lk - Lq + i
    own = tl.maximum(pos, 0) // page_size
    g = tl.arange(0, ROWS)
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, DV_PAD)
    heads = ht * per + g
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + i * stride_qm + d[None, :] * stride_qd,
        mask=(g[:, None] < per) & (d[None, :] < D),
        other=0.0,
    )
    if not HALF_DOT:
        q = q.to(tl.float32)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, DV_PAD], tl.float32)
    first = split * pages_per_split
    last = tl.minimum(first + pages_per_split, n + 1)
    slot = tl.arange(0, CHUNK_PAGES * PAGE_PAD) // PAGE_PAD
    j = tl.arange(0, CHUNK_PAGES * PAGE_PAD) % PAGE_PAD
    k_head, v_head = K + b * stride_kb + kv * stride_kh, V + b * stride_vb + kv * stride_vh
    for t0 in range(first, last, CHUNK_PAGES):
        col, allowed = _page_columns(TABLE + trow * n, t0 + slot, n, own, last, j, page_size, Lk, pos, CAUSAL)
        m, total, acc = _attend_columns(q, k_head, v_head, col, allowed, m, total, acc, stride_kn, stride_kd,
                                        stride_vn, stride_vd, D, D_PAD, DV, DV_PAD, ROUND, HALF_DOT)  # fmt: skip
    out_rows = trow * per + g
    tl.store(STATS + (out_rows * splits + split) * 2, m, mask=g < per)
    tl.store(STATS + (out_rows * splits + split) * 2 + 1, total, mask=g < per)
    tl.store(
        ACC + (out_rows[:, None] * splits + split) * DV + e[None, :], acc, mask=(g[:, None] < per) & (e[None, :] < DV)
    )


@triton.jit
def decode_scores_kernel(
    Q,
    K,
    SCORES,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    Hkv,
    groups,
    Lq,
    Lk,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    """Scores of ``ROWS`` query rows of one K/V head's group (row ``g·Lq + i``: head ``kv·G + g`` at position
    ``i``) against ``BLOCK_N`` keys, float32 products stored in ``SCORES``' dtype (the input's half dtype: rounded
    as a half product rounds, the ranking of ``float_scores=False``), ``-inf`` after a causal row's position.
    ``SCORES [B, Hq, Lq, Lk]``, contiguous."""
    pid_n = tl.program_id(0)
    pid_r = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    b = bh // Hkv
    kv = bh % Hkv
    r = pid_r * ROWS + tl.arange(0, ROWS)
    head = kv * groups + r // Lq
    i = r % Lq
    live = r < groups * Lq
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D_PAD)
    q = tl.load(
        Q + b * stride_qb + head[:, None] * stride_qh + i[:, None] * stride_qm + d[None, :] * stride_qd,
        mask=live[:, None] & (d[None, :] < D),
        other=0.0,
    )
    kt = tl.load(
        K + b * stride_kb + kv * stride_kh + cols[None, :] * stride_kn + d[:, None] * stride_kd,
        mask=(cols[None, :] < Lk) & (d[:, None] < D),
        other=0.0,
    )
    if HALF_DOT:
        s = tl.dot(q, kt)
    else:
        s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
    if CAUSAL:
        s = tl.where(cols[None, :] <= (Lk - Lq + i)[:, None], s, float("-inf"))
    rows = (b * Hkv * groups + head) * Lq + i
    at = SCORES + rows[:, None] * Lk + cols[None, :]
    tl.store(at, rounded(s, SCORES.dtype.element_ty), mask=live[:, None] & (cols[None, :] < Lk))


@triton.jit
def gathered_split_kernel(
    SCORES,
    IDX,
    V,
    ACC,
    STATS,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    Hq,
    groups,
    Lq,
    Lk,
    kk,
    per_split,
    splits,
    DV: tl.constexpr,
    DV_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    RELU: tl.constexpr,
):
    """One split of one query row ``(b, h, i)``: entries ``[split·per_split, ...)`` of its ``kk`` selected keys
    (``IDX``, ``-1``: a pick scored ``-inf``), their scores read back from ``SCORES`` (the values they were ranked
    by) and their V rows gathered. Writes the partial softmax as :func:`page_attention_kernel` (relu: the sum of
    ``relu(s)·v``, with max 0)."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    bh = row // Lq
    b = bh // Hq
    kv = (bh % Hq) // groups
    e = tl.arange(0, DV_PAD)
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros([DV_PAD], tl.float32)
    first = split * per_split
    last = tl.minimum(first + per_split, kk)
    for t0 in range(first, last, CHUNK):
        t = t0 + tl.arange(0, CHUNK)
        col = tl.load(IDX + row * kk + t, mask=t < last, other=-1)
        ok = col >= 0
        col = tl.where(ok, col, 0)
        s = tl.load(SCORES + row * Lk + col, mask=ok, other=float("-inf")).to(tl.float32)
        vr = tl.load(
            V + b * stride_vb + kv * stride_vh + col[:, None] * stride_vn + e[None, :] * stride_vd,
            mask=ok[:, None] & (e[None, :] < DV),
            other=0.0,
        ).to(tl.float32)
        if RELU:
            acc += tl.sum(tl.maximum(s, 0.0)[:, None] * vr, axis=0)
        else:
            m, total, acc = online_softmax_step(m, total, acc, s, vr)
    if RELU:
        m = tl.zeros([], tl.float32)
    tl.store(STATS + (row * splits + split) * 2, m)
    tl.store(STATS + (row * splits + split) * 2 + 1, total)
    tl.store(ACC + (row * splits + split) * DV + e, acc, mask=e < DV)


@triton.jit
def split_combine_kernel(
    ACC,
    STATS,
    OUT,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    Ht,
    per,
    Lq,
    splits,
    DV: tl.constexpr,
    DV_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    RELU: tl.constexpr,
):
    """One output row from its splits' partials: ``Σ exp(m_s - M)·acc_s / Σ exp(m_s - M)·sum_s`` with ``M`` the
    largest max (log-sum-exp; zeros for a row with no allowed key); relu: ``Σ acc_s``. Row ``trow·per + g`` is
    query head ``ht·per + g`` of table row ``trow = (b·Ht + ht)·Lq + i``."""
    r = tl.program_id(0).to(tl.int64)
    trow = r // per
    g = r % per
    i = trow % Lq
    bt = trow // Lq
    b = bt // Ht
    head = (bt % Ht) * per + g
    sp = tl.arange(0, SPLITS_PAD)
    e = tl.arange(0, DV_PAD)
    live = sp < splits
    acc = tl.load(ACC + (r * splits + sp[:, None]) * DV + e[None, :], mask=live[:, None] & (e[None, :] < DV), other=0.0)
    if RELU:
        out = tl.sum(acc, axis=0)
    else:
        m = tl.load(STATS + (r * splits + sp) * 2, mask=live, other=float("-inf"))
        total = tl.load(STATS + (r * splits + sp) * 2 + 1, mask=live, other=0.0)
        top = tl.max(m, axis=0)
        scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - tl.where(top == float("-inf"), 0.0, top)))
        denom = tl.sum(scale * total, axis=0)
        out = tl.sum(scale[:, None] * acc, axis=0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(
        OUT + b * stride_ob + head * stride_oh + i * stride_om + e * stride_od,
        out.to(OUT.dtype.element_ty),
        mask=e < DV,
    )
