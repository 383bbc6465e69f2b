"""The Triton kernels of ``topk_fast`` (training): an exact row-wise top-k selection, then attention over the
selected keys, forward and backward. Launched by :mod:`topk_bench.attention.kernels.triton`; compiled ahead of time by
``.ci/compile_triton_kernels.py``.

Layouts: ``Q [heads, Lq, D]``, ``K [kv_heads, Lk, D]``, ``V [kv_heads, Lk, DV]`` through their strides; query head
``h`` reads K/V head ``h // groups``; ``IDX [heads, Lq, kk]`` holds global key rows ``kv·Lk + j`` (as the CPU path's
indices). Causal: bottom-right aligned, query ``i`` sees keys ``j <= i + offset``.

On CPU tensors the same functions run in Triton's interpreter (``TRITON_INTERPRET=1``), except the native half
product (``HALF_DOT``: the interpreter's is wrong), replaced there by the same product of the values widened.
"""

from __future__ import annotations

import triton
import triton.language as tl

from topk_bench.attention.kernels.triton.online_softmax import online_softmax_step
from topk_bench.attention.kernels.triton.rounding import rounded

# The lowest int64: the key of a column past Lk (below every real key, -inf scores included).
_LOWEST = tl.constexpr(-9223372036854775808)
# Low 31 bits of a selection key: ``_TIE - column``, so that among equal scores the lowest column ranks highest.
_TIE = tl.constexpr(2147483647)


@triton.jit
def _block_keys(Q, K, head, kv, rows, start, lo, hi, stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd,
                Lq, offset, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                ROUND: tl.constexpr, HALF_DOT: tl.constexpr):  # fmt: skip
    """The selection keys of the ``BLOCK_N`` keys from ``start`` for the query rows ``rows``; ``_LOWEST`` outside the
    walked columns ``[lo, hi)`` (never a candidate).

    The score tile is summed over ``BLOCK_D``-wide slices of the head (Q's slice loaded again for each block), so that
    no more than a ``BLOCK_D x BLOCK_N`` slice of K is live at a time, whatever the head size."""
    cols = start + tl.arange(0, BLOCK_N)
    walked = (cols >= lo) & (cols < hi)
    s = tl.zeros([rows.shape[0], BLOCK_N], tl.float32)
    for d0 in tl.static_range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        q = tl.load(
            Q + head * stride_qh + rows[:, None] * stride_qm + d[None, :] * stride_qd,
            mask=(rows[:, None] < Lq) & (d[None, :] < D),
            other=0.0,
        )
        kt = tl.load(
            K + kv * stride_kh + cols[None, :] * stride_kn + d[:, None] * stride_kd,
            mask=walked[None, :] & (d[:, None] < D),
            other=0.0,
        )
        if HALF_DOT:  # half inputs on the GPU: the native product, fp32 accumulation
            s = tl.dot(q, kt, acc=s)
        else:  # fp32 inputs; half ones widened (exact in tf32: a half's mantissa fits in its 10 bits)
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32), acc=s, input_precision="ieee")
    if ROUND:  # ranked as dense attention in the input dtype rounds its scores
        s = rounded(s, K.dtype.element_ty).to(tl.float32)
    s = s + 0.0  # -0.0 to +0.0: equal scores get equal keys
    if CAUSAL:
        s = tl.where(cols[None, :] <= rows[:, None] + offset, s, float("-inf"))
    bits = s.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (-cols[None, :] + _TIE).to(tl.int64)  # tensor first (interpreter)
    return tl.where(walked[None, :], key, _LOWEST)


@triton.jit
def _count_at_least(BUF, rows_at, count, trial, CAP: tl.constexpr, CHUNK: tl.constexpr):
    """Per row: how many of its candidates ``BUF[rows_at + 0 .. count)`` are ``>= trial``. Read ``CHUNK`` at a time
    (from L1: the program's own buffer) rather than held whole: the score product's operands stay live across a
    cut, and a ``[BLOCK_M, CAP]`` tile of int64 next to them spilled."""
    n = tl.zeros(count.shape, tl.int32)
    for c0 in range(0, tl.max(count, axis=0), CHUNK):
        at = c0 + tl.arange(0, CHUNK)
        cand = tl.load(BUF + rows_at[:, None] + at[None, :], mask=at[None, :] < count[:, None], other=_LOWEST)
        n += tl.sum((cand >= trial[:, None]).to(tl.int32), axis=1)
    return n


@triton.jit
def _kth_largest(BUF, rows_at, count, kk, limit, CAP: tl.constexpr, CHUNK: tl.constexpr):
    """Per row, of its candidates (distinct keys above ``_LOWEST``): a key ``t`` that at least ``kk`` and at most
    ``limit`` candidates reach (``>= t``): a lower bound of the row's ``kk``-th largest (``_LOWEST`` for a row with
    fewer than ``kk``). ``limit = kk``: exactly ``kk`` reach it (the final cut); larger: a looser cut, fewer passes.
    A binary radix select, one bit a pass from the top, nothing sorted: the largest prefix that ``kk`` candidates
    still reach, stopped once every row is within ``limit``. The score's 31 bits below the sign first, then the
    column's only where a row's ``kk``-th score is tied past ``limit`` (what a bfloat16 ranking often is)."""
    zero = tl.zeros(count.shape, tl.int64)
    one = zero + 1
    reach = _count_at_least(BUF, rows_at, count, zero, CAP, CHUNK)
    at = tl.where(reach >= kk, zero, tl.full(count.shape, _LOWEST, tl.int64))
    reach = tl.where(reach >= kk, reach, count)  # candidates >= at
    bit = tl.full([], 62, tl.int32)
    # Bits 62..32 hold the score, 30..0 the column (bit 31 of the column part is 0: _TIE - column).
    while (tl.max(tl.where(count >= kk, reach, 0), axis=0) > limit) & (bit >= 0):
        trial = at + (one << bit)
        n = _count_at_least(BUF, rows_at, count, trial, CAP, CHUNK)
        at = tl.where(n >= kk, trial, at)
        reach = tl.where(n >= kk, n, reach)
        bit = tl.where(bit == 32, 30, bit - 1)
    return at


@triton.jit
def _shrink(BUF, rows_at, count, kk, limit, CAP: tl.constexpr, CHUNK: tl.constexpr):
    """Each row's candidates ``BUF[rows_at + 0 .. count)`` cut to between its ``kk`` and ``limit`` largest (exactly
    ``kk`` when ``limit = kk``), compacted in place in their order; returns ``(count, threshold)``: the new counts
    and each row's threshold from now on (a key must beat it: :func:`_kth_largest`'s key, a lower bound of the
    row's final ``kk``-th; ``_LOWEST`` for a row with fewer than ``kk``, which keeps them all)."""
    tl.debug_barrier()  # the appends by every thread of the program are visible
    threshold = _kth_largest(BUF, rows_at, count, kk, limit, CAP, CHUNK)
    kept = tl.zeros(count.shape, tl.int32)
    for c0 in range(0, tl.max(count, axis=0), CHUNK):
        at = c0 + tl.arange(0, CHUNK)
        held = at[None, :] < count[:, None]
        cand = tl.load(BUF + rows_at[:, None] + at[None, :], mask=held, other=_LOWEST)
        keep = held & (cand >= threshold[:, None])
        to = kept[:, None] + tl.cumsum(keep.to(tl.int32), axis=1) - 1
        tl.debug_barrier()  # every thread has read this chunk before any of it is overwritten (to <= at)
        tl.store(BUF + rows_at[:, None] + to, cand, mask=keep)
        kept += tl.sum(keep.to(tl.int32), axis=1)
    tl.debug_barrier()
    return kept, threshold


@triton.jit
def _write_picks(BUF, rows_at, count, IDX_HEAD, rows, stride_im, kv, Lq, Lk, kk, K_PAD: tl.constexpr):
    """The ``kk`` picks of each of the tile's rows (its ``count`` candidates, ``kk`` once cut) sorted once, by score
    descending, written as global key rows ``kv·Lk + j``."""
    t = tl.arange(0, K_PAD)
    best = tl.load(BUF + rows_at[:, None] + t[None, :], mask=t[None, :] < count[:, None], other=_LOWEST)
    best = tl.sort(best, dim=1, descending=True)
    cols = -(best & 0x7FFFFFFF).to(tl.int32) + _TIE
    rows_of_keys = kv.to(tl.int64) * Lk + cols.to(tl.int64)
    tl.store(
        IDX_HEAD + rows[:, None] * stride_im + t[None, :],
        rows_of_keys.to(IDX_HEAD.dtype.element_ty),
        mask=(rows[:, None] < Lq) & (t[None, :] < kk),
    )


@triton.jit
def topk_select_kernel(Q, K, IDX, BUF, stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd, stride_ih,
                       stride_im, Lq, Lk, offset, heads, groups, kk,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       K_PAD: tl.constexpr, CAP: tl.constexpr, CAUSAL: tl.constexpr, ROUND: tl.constexpr,
                       HALF_DOT: tl.constexpr):  # fmt: skip
    """The ``kk`` highest scores of each query row, exactly, with no sort or merge per key block.

    Every score becomes one int64 key: its float32 bits made monotone (a negative float's magnitude bits flipped)
    above ``_TIE - column``. Keys are distinct, so "the ``kk`` largest keys" is one set: the scores' top-k with ties
    at the k-th value broken towards the lowest column.

    A program takes tiles of ``BLOCK_M`` query rows of one head (persistent: tile ``pid``, ``pid + programs``, ...,
    the longest causal tiles first) and walks their key blocks from the diagonal outwards: back to key 0, then (not
    causal) forwards to ``Lk``: the nearest keys first, which raise the threshold early. Each row keeps a threshold
    (its ``kk``-th largest key so far: a lower bound of the final one) and appends the keys that beat it to its
    candidate buffer (``BUF [programs, BLOCK_M, CAP]``, int64, allocated by the caller; positions by a prefix sum of
    the row's hits). A block that would overflow a row's buffer first cuts every row to its ``kk`` largest by
    :func:`_kth_largest` (and raises the thresholds); the end cuts once more, and one sort of ``K_PAD`` keys a row
    orders the ``kk`` picks. Per score: one compare. The score tile never leaves the chip.
    """
    programs = tl.num_programs(0)
    blocks_m = tl.cdiv(Lq, BLOCK_M)
    r = tl.arange(0, BLOCK_M)
    rows_at = (tl.program_id(0) * BLOCK_M + r).to(tl.int64) * CAP
    for tile in range(tl.program_id(0), blocks_m * heads, programs):
        pid_m = blocks_m - 1 - tile // heads  # the longest causal tiles first: programs finish together
        head = tile % heads
        kv = head // groups
        rows = pid_m * BLOCK_M + r
        # The diagonal: keys the tile's last row sees (causal: all it walks), but at least kk (a row seeing fewer
        # picks masked ones, weight 0).
        diagonal = tl.minimum(tl.maximum(tl.minimum(pid_m * BLOCK_M + BLOCK_M, Lq) + offset, kk), Lk)
        back = tl.cdiv(diagonal, BLOCK_N)
        if CAUSAL:
            n_blocks = back
        else:
            n_blocks = back + tl.cdiv(Lk - diagonal, BLOCK_N)
        count = tl.zeros([BLOCK_M], tl.int32)
        threshold = tl.full([BLOCK_M], _LOWEST, tl.int64)
        for j in range(0, n_blocks):
            down = j < back  # from the diagonal back to key 0, then (not causal) from it forwards to Lk
            start = tl.where(down, diagonal - (j + 1) * BLOCK_N, diagonal + (j - back) * BLOCK_N)
            lo = tl.where(down, 0, diagonal)
            hi = tl.where(down, diagonal, Lk)
            key = _block_keys(Q, K, head, kv, rows, start, lo, hi, stride_qh, stride_qm, stride_qd, stride_kh,
                              stride_kn, stride_kd, Lq, offset, D, BLOCK_D, BLOCK_N, CAUSAL, ROUND,
                              HALF_DOT)  # fmt: skip
            hit = key > threshold[:, None]
            hits = tl.sum(hit.to(tl.int32), axis=1)
            # A block that no row's threshold lets through (most, once the thresholds are up) costs its compares.
            if tl.max(hits, axis=0) > 0:
                if tl.max(count + hits, axis=0) > CAP:
                    # A loose cut: to at most half-way between kk and a full buffer less a block.
                    count, threshold = _shrink(BUF, rows_at, count, kk, (kk + CAP - BLOCK_N) // 2, CAP, BLOCK_N)
                    hit = key > threshold[:, None]
                    hits = tl.sum(hit.to(tl.int32), axis=1)
                to = count[:, None] + tl.cumsum(hit.to(tl.int32), axis=1) - 1
                tl.store(BUF + rows_at[:, None] + to, key, mask=hit)
                count += hits
        if tl.max(count, axis=0) > kk:
            count, threshold = _shrink(BUF, rows_at, count, kk, kk, CAP, BLOCK_N)
        tl.debug_barrier()
        _write_picks(BUF, rows_at, count, IDX + head * stride_ih, rows, stride_im, kv, Lq, Lk, kk, K_PAD)
        tl.debug_barrier()  # the next tile's appends come after every thread has read this one's picks


@triton.jit
def gathered_forward_kernel(Q, K, V, IDX, OUT, LSE,
                            stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd, stride_vh, stride_vn,
                            stride_vd, stride_ih, stride_im, stride_oh, stride_om, Lq, Lk, offset, groups, kk,
                            D: tl.constexpr, D_PAD: tl.constexpr, DV: tl.constexpr, DV_PAD: tl.constexpr,
                            CHUNK: tl.constexpr, CAUSAL: tl.constexpr, RELU: tl.constexpr,
                            ROUND: tl.constexpr):  # fmt: skip
    """One query row: its selected keys' scores again (``kk·D``, exact fp32), an online softmax (or relu) over them
    and the weighted sum of the gathered V rows, fp32 throughout. Writes the row's output and ``log Σ exp`` (softmax:
    ``+inf`` for a row with no allowed key, whose output is 0), all that backward needs besides the indices."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    kv = head // groups
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, DV_PAD)
    q = tl.load(Q + head * stride_qh + row * stride_qm + d * stride_qd, mask=d < D, other=0.0).to(tl.float32)
    acc = tl.zeros([DV_PAD], tl.float32)
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    for t0 in range(0, kk, CHUNK):
        t = t0 + tl.arange(0, CHUNK)
        tm = t < kk
        col = tl.load(IDX + head * stride_ih + row * stride_im + t, mask=tm, other=0).to(tl.int64) - kv * Lk
        col = tl.where(tm, col, 0)
        kr = tl.load(
            K + kv * stride_kh + col[:, None] * stride_kn + d[None, :] * stride_kd,
            mask=tm[:, None] & (d[None, :] < D),
            other=0.0,
        ).to(tl.float32)
        vr = tl.load(
            V + kv * stride_vh + col[:, None] * stride_vn + e[None, :] * stride_vd,
            mask=tm[:, None] & (e[None, :] < DV),
            other=0.0,
        ).to(tl.float32)
        s = tl.sum(q[None, :] * kr, axis=1)
        if ROUND:
            s = rounded(s, Q.dtype.element_ty).to(tl.float32)
        allowed = tm
        if CAUSAL:
            allowed = allowed & (col <= row + offset)
        if RELU:
            p = tl.where(allowed, tl.maximum(s, 0.0), 0.0)
            acc += tl.sum(p[:, None] * vr, axis=0)
        else:
            s = tl.where(allowed, s, float("-inf"))
            m, total, acc = online_softmax_step(m, total, acc, s, vr)
    if RELU:
        lse = total
    else:
        nonempty = total > 0.0
        acc = acc / tl.where(nonempty, total, 1.0)
        lse = tl.where(
            nonempty, tl.where(m == float("-inf"), 0.0, m) + tl.log(tl.where(nonempty, total, 1.0)), float("inf")
        )
    tl.store(OUT + head * stride_oh + row * stride_om + e, acc.to(OUT.dtype.element_ty), mask=e < DV)
    tl.store(LSE + head * Lq + row, lse)


@triton.jit
def gathered_backward_kernel(Q, K, V, IDX, OUT, DOUT, LSE, DQ, DK, DV_ACC,
                             stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd, stride_vh, stride_vn,
                             stride_vd, stride_ih, stride_im, stride_oh, stride_om, Lq, Lk, offset, groups, kk,
                             D: tl.constexpr, D_PAD: tl.constexpr, DV: tl.constexpr, DV_PAD: tl.constexpr,
                             CHUNK: tl.constexpr, CAUSAL: tl.constexpr, RELU: tl.constexpr,
                             ROUND: tl.constexpr):  # fmt: skip
    """One query row's gradients: ``dQ`` from its ``kk`` gathered keys (written once), its share of ``dK`` and
    ``dV`` added atomically into float32 accumulators (``DK [kv_heads, Lk, D]``, ``DV_ACC [kv_heads, Lk, DV]``,
    contiguous). Softmax: ``p = exp(s - lse)``, ``dS = p·(dP - Σ dout·out)``; relu: ``dS = dP`` where ``s > 0``."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    kv = head // groups
    d = tl.arange(0, D_PAD)
    e = tl.arange(0, DV_PAD)
    q = tl.load(Q + head * stride_qh + row * stride_qm + d * stride_qd, mask=d < D, other=0.0).to(tl.float32)
    o_at = head * stride_oh + row * stride_om + e
    dout = tl.load(DOUT + o_at, mask=e < DV, other=0.0).to(tl.float32)
    delta = tl.sum(dout * tl.load(OUT + o_at, mask=e < DV, other=0.0).to(tl.float32), axis=0)
    lse = tl.load(LSE + head * Lq + row)
    dq = tl.zeros([D_PAD], tl.float32)
    for t0 in range(0, kk, CHUNK):
        t = t0 + tl.arange(0, CHUNK)
        tm = t < kk
        col = tl.load(IDX + head * stride_ih + row * stride_im + t, mask=tm, other=0).to(tl.int64) - kv * Lk
        col = tl.where(tm, col, 0)
        kmask = tm[:, None] & (d[None, :] < D)
        vmask = tm[:, None] & (e[None, :] < DV)
        kr = tl.load(K + kv * stride_kh + col[:, None] * stride_kn + d[None, :] * stride_kd, mask=kmask, other=0.0)
        vr = tl.load(V + kv * stride_vh + col[:, None] * stride_vn + e[None, :] * stride_vd, mask=vmask, other=0.0)
        kr = kr.to(tl.float32)
        s = tl.sum(q[None, :] * kr, axis=1)
        if ROUND:
            s = rounded(s, Q.dtype.element_ty).to(tl.float32)
        allowed = tm
        if CAUSAL:
            allowed = allowed & (col <= row + offset)
        dp = tl.sum(dout[None, :] * vr.to(tl.float32), axis=1)
        if RELU:
            p = tl.where(allowed, tl.maximum(s, 0.0), 0.0)
            ds = tl.where(allowed & (s > 0.0), dp, 0.0)
        else:
            p = tl.where(allowed, tl.exp(s - lse), 0.0)
            ds = p * (dp - delta)
        dq += tl.sum(ds[:, None] * kr, axis=0)
        at = kv * Lk + col
        tl.atomic_add(DK + at[:, None] * D + d[None, :], ds[:, None] * q[None, :], mask=kmask)
        tl.atomic_add(DV_ACC + at[:, None] * DV + e[None, :], p[:, None] * dout[None, :], mask=vmask)
    tl.store(DQ + head * stride_qh + row * stride_qm + d * stride_qd, dq.to(DQ.dtype.element_ty), mask=d < D)
