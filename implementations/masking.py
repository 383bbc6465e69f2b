"""Helpers shared by the implementations: masks (no L x L tensors beyond one chunk),
grouped-query head folding, half-precision statistics, input checks.

Conventions (see :mod:`implementations.registry`): causal masks are bottom-right
aligned, query ``i`` of ``Lq`` sits at position ``Lk - Lq + i`` (:func:`causal_offset`);
query head ``h`` reads key/value head ``h // G`` with ``G = Hq // Hkv``.
"""

from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half inputs (scores that select keys, softmax statistics), else the dtype itself."""
    return torch.float32 if dtype in HALF else dtype


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in :func:`stat_dtype` (no copy for float32/float64 inputs)."""
    return x.to(stat_dtype(x.dtype))


def causal_offset(q_len: int, k_len: int) -> int:
    """Position of query 0 under bottom-right alignment: query ``i`` sits at ``Lk - Lq + i``."""
    return k_len - q_len


def causal_block_mask(q_start: int, q_len: int, k_len: int, device, *, offset: int = 0) -> torch.Tensor:
    """Boolean ``[q_len, k_len]`` mask, True where key ``j`` is *after* query ``q_start + i``.

    ``offset``: position of query 0 (:func:`causal_offset`; 0 when ``Lq == Lk``), so
    query ``q_start + i`` sits at ``offset + q_start + i``. Built for one query chunk
    from its offset, so a chunked implementation never materialises the full
    ``Lq x Lk`` mask.
    """
    start = q_start + offset
    rows = torch.arange(start, start + q_len, device=device).unsqueeze(1)
    cols = torch.arange(k_len, device=device).unsqueeze(0)
    return cols > rows


def check_activation(activation: str) -> None:
    if activation not in ("softmax", "relu"):
        raise ValueError(f"activation must be 'softmax' or 'relu', got {activation!r}")


def chunk_mask(q_start: int, q_len: int, k_len: int, *, causal: bool, key_padding_mask=None, device=None,
               offset: int = 0, ndim: int = 4):
    """Bool mask (True = masked) for the query chunk ``[q_start, q_start + q_len)``.

    Broadcastable to ``[B, ..., q_len, k_len]`` with ``ndim`` dims (5 for grouped
    scores, :func:`by_query`); ``None`` when nothing is masked. ``key_padding_mask``
    is bool ``[B, k_len]`` with True marking padding; ``offset`` as in :func:`causal_block_mask`.
    """
    mask = causal_block_mask(q_start, q_len, k_len, device, offset=offset) if causal else None
    if key_padding_mask is not None:
        pad = key_padding_mask[(slice(None),) + (None,) * (ndim - 2)]
        mask = pad if mask is None else (mask | pad)
    return mask


def rows_may_be_empty(q_len: int, k_len: int, *, causal: bool, key_padding_mask=None) -> bool:
    """Whether some query row can have no allowed key (then its softmax must give zeros, not NaN).

    A shape/argument test, not a data test: with ``Lq > Lk`` the first ``Lq - Lk``
    causal rows sit before every key; padding can hide every key of a row.
    """
    return key_padding_mask is not None or (causal and q_len > k_len)


def safe_softmax_(scores: torch.Tensor) -> torch.Tensor:
    """Row softmax in place; a row that is all ``-inf`` becomes zeros, never NaN.

    Data-independent (no branching on values), so it runs under FakeTensorMode.
    """
    finfo = torch.finfo(scores.dtype)
    # An all -inf row has max -inf; clamping keeps exp(-inf - max) = 0 instead of NaN.
    top = scores.amax(dim=-1, keepdim=True).clamp_min_(finfo.min)
    scores.sub_(top).exp_()
    # A real row sums to >= 1 (its max gives exp(0)); an empty row sums to 0 -> 0 / tiny = 0.
    return scores.div_(scores.sum(dim=-1, keepdim=True).clamp_min_(finfo.tiny))


def safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Out-of-place :func:`safe_softmax_` (not differentiable: callers derive it by hand)."""
    return safe_softmax_(scores.clone())


def batched_addmm_t_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += aᵀ @ b`` in place over the last two dims, batched over the leading ones.

    ``acc`` must be contiguous. Accumulating with ``baddbmm_`` avoids a temporary the
    size of ``acc`` (an ``Lk x d`` gradient per head) at every chunk.
    """
    batch = acc.shape[:-2]
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    acc.view(-1, *acc.shape[-2:]).baddbmm_(a3.transpose(1, 2), b3)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """``q [*, Hq, Lq, d]``, ``k [*, Hkv, Lk, d]``, ``v [*, Hkv, Lk, dv]``; returns ``G = Hq // Hkv``.

    Equal leading dims give ``G = 1`` (any number of them); otherwise the dims before
    the head dim must agree and ``Hq`` be a multiple of ``Hkv`` (grouped-query attention).
    """
    tails = k.shape[-2] == v.shape[-2] and q.shape[-1] == k.shape[-1] and k.shape[:-2] == v.shape[:-2]
    if tails and q.shape[:-2] == k.shape[:-2]:
        return 1
    if tails and q.dim() == k.dim() >= 3 and q.shape[:-3] == k.shape[:-3] and 0 < k.shape[-3] and \
            q.shape[-3] % k.shape[-3] == 0:
        return q.shape[-3] // k.shape[-3]
    raise ValueError(
        f"expected q [*, Hq, Lq, d], k [*, Hkv, Lk, d], v [*, Hkv, Lk, dv] with equal leading dims "
        f"and Hq a multiple of Hkv, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    )


def kv_groups(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """``G = Hq // Hkv`` for the dense implementations, which broadcast like ``@``: 1 unless the head dims differ."""
    if q.dim() < 3 or k.dim() < 3 or q.shape[-3] == k.shape[-3]:
        return 1
    return check_qkv(q, k, v)


def fold_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[*, Hq, L, d] -> [*, Hkv, G*L, d]``: the G query heads of a group as rows of their K/V head.

    Row ``r`` of K/V head ``h`` is query head ``h*G + r // L`` at position ``r % L``. A view
    of a contiguous tensor (a copy of ``x``, never of K/V, otherwise).
    """
    return x if groups == 1 else x.unflatten(-3, (-1, groups)).flatten(-3, -2)


def unfold_groups(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Inverse of :func:`fold_groups`: ``[*, Hkv, G*L, d] -> [*, Hq, L, d]`` (a view of a contiguous ``x``)."""
    return x if groups == 1 else x.unflatten(-2, (groups, -1)).flatten(-4, -3)


def group_rows(x: torch.Tensor, groups: int, start: int, end: int) -> torch.Tensor:
    """Query positions ``[start, end)`` of every head of ``x [*, Hq, L, d]`` as ``[*, Hkv, G*(end-start), d]``.

    ``G == 1``: the slice itself (a view). Otherwise a copy of those rows (chunk-sized).
    """
    if groups == 1:
        return x[..., start:end, :]
    return x.unflatten(-3, (-1, groups))[..., start:end, :].flatten(-3, -2)


def put_group_rows(dst: torch.Tensor, groups: int, start: int, end: int, src: torch.Tensor) -> None:
    """``dst[..., start:end, :] = src`` for ``src`` laid out as :func:`group_rows` returns it."""
    if groups == 1:
        dst[..., start:end, :] = src
    else:
        dst.unflatten(-3, (-1, groups))[..., start:end, :] = src.unflatten(-2, (groups, -1))


def by_query(scores: torch.Tensor, groups: int) -> torch.Tensor:
    """View grouped scores ``[*, Hkv, G*C, Lk]`` as ``[*, Hkv, G, C, Lk]``, so that a per-position
    ``[C, Lk]`` mask broadcasts over the G heads (``G == 1``: ``scores`` unchanged)."""
    return scores if groups == 1 else scores.unflatten(-2, (groups, -1))


def check_topk_args(q: torch.Tensor, k: torch.Tensor, topk: int, chunk_size: int, dropout: float,
                    key_padding_mask: torch.Tensor | None) -> None:
    """The options every top-k variant shares (``topk``, ``topk_sparse``, ``topk_fast``), checked once."""
    if topk < 1 or chunk_size < 1:
        raise ValueError(f"topk and chunk_size must be >= 1, got topk={topk}, chunk_size={chunk_size}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if key_padding_mask is not None and (q.dim() < 3 or tuple(key_padding_mask.shape) != (q.shape[0], k.shape[-2])):
        raise ValueError(
            f"key_padding_mask must be [B, Lk] = {(q.shape[0], k.shape[-2])} for q [B, ..., Lq, d], "
            f"got {tuple(key_padding_mask.shape)}"
        )
