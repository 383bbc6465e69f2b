"""The Triton kernels of ``topk_fast`` (training): an exact row-wise top-k selection, then attention over the
selected keys, forward and backward. Launched by :mod:`implementations.triton_kernels`; compiled ahead of time by
``scripts/compile_triton_kernels.py``.

Layouts: ``Q [heads, Lq, D]``, ``K [kv_heads, Lk, D]``, ``V [kv_heads, Lk, DV]`` through their strides; query head
``h`` reads K/V head ``h // groups``; ``IDX [heads, Lq, kk]`` holds global key rows ``kv·Lk + j`` (as the CPU path's
indices). Causal: bottom-right aligned, query ``i`` sees keys ``j <= i + offset``.

On CPU tensors the same functions run in Triton's interpreter (``TRITON_INTERPRET=1``), except the native half
product (``HALF_DOT``: the interpreter's is wrong), replaced there by the same product of the values widened.
"""

from __future__ import annotations

import triton
import triton.language as tl

from implementations.triton_kernels.online_softmax import online_softmax_step
from implementations.triton_kernels.rounding import rounded

# The lowest int64: the key of a column past Lk (below every real key, -inf scores included).
_LOWEST = tl.constexpr(-9223372036854775808)
# Low 31 bits of a selection key: ``_TIE - column``, so that among equal scores the lowest column ranks highest.
_TIE = tl.constexpr(2147483647)


@triton.jit
def _block_keys(Q, K, head, kv, rows, start, stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd, Lq, Lk,
                offset, D: tl.constexpr, BLOCK_D: tl.constexpr, K_PAD: tl.constexpr, CAUSAL: tl.constexpr,
                ROUND: tl.constexpr, HALF_DOT: tl.constexpr):  # fmt: skip
    """The selection keys of one block of ``K_PAD`` keys for the query rows ``rows`` (``_LOWEST`` past Lk).

    The score tile is summed over ``BLOCK_D``-wide slices of the head (Q's slice loaded again for each block), so that
    no more than a ``BLOCK_D x K_PAD`` slice of K is live at a time, whatever the head size."""
    cols = start + tl.arange(0, K_PAD)
    s = tl.zeros([rows.shape[0], K_PAD], tl.float32)
    for d0 in tl.static_range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        q = tl.load(
            Q + head * stride_qh + rows[:, None] * stride_qm + d[None, :] * stride_qd,
            mask=(rows[:, None] < Lq) & (d[None, :] < D),
            other=0.0,
        )
        kt = tl.load(
            K + kv * stride_kh + cols[None, :] * stride_kn + d[:, None] * stride_kd,
            mask=(cols[None, :] < Lk) & (d[:, None] < D),
            other=0.0,
        )
        if HALF_DOT:  # half inputs on the GPU: the native product, fp32 accumulation
            s = tl.dot(q, kt, acc=s)
        else:  # fp32 inputs; half ones widened (exact in tf32: a half's mantissa fits in its 10 bits)
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32), acc=s, input_precision="ieee")
    if ROUND:  # ranked as dense attention in the input dtype rounds its scores
        s = rounded(s, K.dtype.element_ty).to(tl.float32)
    s = s + 0.0  # -0.0 to +0.0: equal scores get equal keys
    allowed = cols[None, :] < Lk
    if CAUSAL:
        allowed = allowed & (cols[None, :] <= rows[:, None] + offset)
    s = tl.where(allowed, s, float("-inf"))
    bits = s.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (-cols[None, :] + _TIE).to(tl.int64)  # tensor first (interpreter)
    return tl.where(cols[None, :] < Lk, key, _LOWEST)


@triton.jit
def topk_select_kernel(
    Q,
    K,
    IDX,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_ih,
    stride_im,
    Lq,
    Lk,
    offset,
    groups,
    kk,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    K_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
    ROUND: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    """The ``kk`` highest scores of ``BLOCK_M`` query rows, exactly, without sorting a row.

    Every score becomes one int64 key: its float32 bits made monotone (a negative float's magnitude bits flipped)
    above ``_TIE - column``. Keys are distinct, so "the ``K_PAD`` largest keys" is one set: the scores' top-k with
    ties at the k-th value broken towards the lowest column. Each row keeps its ``K_PAD`` largest keys so far,
    sorted descending; a block of ``K_PAD`` scores merges in by the bitonic split (``max(a descending, b
    ascending)`` is the top half of ``a ∪ b``, then one sort), and a block none of whose keys beats a row's lowest
    kept key is skipped (the running threshold). The score tile never leaves the chip.
    """
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    kv = head // groups
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if CAUSAL:
        # Keys the block's last row sees, but at least kk (a row sees fewer: it picks masked ones, weight 0).
        last = tl.minimum(pid_m * BLOCK_M + BLOCK_M, Lq) + offset
        hi = tl.minimum(tl.maximum(last, kk), Lk)
    else:
        hi = Lk
    best = tl.sort(
        _block_keys(Q, K, head, kv, rows, 0, stride_qh, stride_qm, stride_qd, stride_kh, stride_kn, stride_kd, Lq, Lk,
                    offset, D, BLOCK_D, K_PAD, CAUSAL, ROUND, HALF_DOT),
        dim=1,
        descending=True,
    )  # fmt: skip
    for start in range(K_PAD, hi, K_PAD):
        key = _block_keys(Q, K, head, kv, rows, start, stride_qh, stride_qm, stride_qd, stride_kh, stride_kn,
                          stride_kd, Lq, Lk, offset, D, BLOCK_D, K_PAD, CAUSAL, ROUND, HALF_DOT)  # fmt: skip
        gain = tl.max(key, axis=1) > tl.min(best, axis=1)
        if tl.max(gain.to(tl.int32), axis=0) > 0:
            best = tl.sort(tl.maximum(best, tl.sort(key, dim=1)), dim=1, descending=True)
    cols = -(best & 0x7FFFFFFF).to(tl.int32) + _TIE
    t = tl.arange(0, K_PAD)
    rows_of_keys = kv.to(tl.int64) * Lk + cols.to(tl.int64)
    tl.store(
        IDX + head * stride_ih + rows[:, None] * stride_im + t[None, :],
        rows_of_keys.to(IDX.dtype.element_ty),
        mask=(rows[:, None] < Lq) & (t[None, :] < kk),
    )


@triton.jit
def gathered_forward_kernel(
    Q,
    K,
    V,
    IDX,
    OUT,
    LSE,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ih,
    stride_im,
    stride_oh,
    stride_om,
    Lq,
    Lk,
    offset,
    groups,
    kk,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    DV: tl.constexpr,
    DV_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    CAUSAL: tl.constexpr,
    RELU: tl.constexpr,
    ROUND: tl.constexpr,
):
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
def gathered_backward_kernel(
    Q,
    K,
    V,
    IDX,
    OUT,
    DOUT,
    LSE,
    DQ,
    DK,
    DV_ACC,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ih,
    stride_im,
    stride_oh,
    stride_om,
    Lq,
    Lk,
    offset,
    groups,
    kk,
    D: tl.constexpr,
    D_PAD: tl.constexpr,
    DV: tl.constexpr,
    DV_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    CAUSAL: tl.constexpr,
    RELU: tl.constexpr,
    ROUND: tl.constexpr,
):
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
