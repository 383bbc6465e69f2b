"""Fast top-k attention: the paper's results (same as ``topk``) without its dense sparse-products.

The paper's implementation (§2.2, ``topk``) scatters the k kept entries of each
row into a dense ``C x Lk`` matrix for its four "sparse x dense" products, so it
costs as much as vanilla attention (its §5 limitation). Here:

* the only dense product is the score tile ``Q_c Kᵀ``; for causal attention a
  query tile only meets the keys before its end (half the work and memory);
* the row-wise top-k is pruned exactly: a key whose group maximum is not among
  the k largest group maxima cannot be in the row's top-k, so ``topk`` runs on
  ~2·sqrt(k·Lk) candidates instead of Lk;
* the four products use the k selected entries only, through
  ``embedding_bag`` (gather-multiply-sum without materialising the gathered
  rows): ``out = W·V`` and ``dQ = dS·K`` directly, ``dW = dout·V[idx]`` by its
  per-sample-weights backward, and ``dV = Wᵀ·dout``, ``dK = dSᵀ·Q`` as bags of
  the key-sorted (transposed) selection, one sort shared by both;
* only Q, K, V, the top scores and int32 indices are kept for backward (as the
  paper); the backward runs per group of heads to bound its O(Lq·k) temporaries.

``key_padding_mask`` masks padding keys like future ones (a row with none left
gives zeros, through a NaN-free softmax used only then); ``dropout`` draws a
mask per chunk of ``chunk_size`` rows on the k weights, cached as ``Lq x k``
bools for backward (as ``topk``; the defaults leave the code path unchanged).

Everything is shape-static (no ``.item()``, ``nonzero`` or value-dependent
branches), so it runs under ``FakeTensorMode`` for the predict backend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from implementations.masking import check_activation, check_qkv, check_topk_args, safe_softmax
from implementations.registry import Implementation, register
from implementations.selection import topk_selection
from implementations.topk import TOPK_OPTIONS

# Query rows per score tile (all heads at once: few, large ops, which matters
# on a shared 2-core machine where every parallel region can wait a scheduler
# slice). Small enough to waste little work on the causal diagonal; never more
# than the ``chunk_size`` option, which bounds memory.
ROW_TILE = 512
# Selected entries per backward group of heads: bounds the backward's O(nnz)
# temporaries (about 30 bytes per entry) while keeping the op count low.
BACKWARD_ENTRIES = 1 << 22


def _segments(n: int, k: int) -> int:
    """Group size S minimising the pruned top-k's work ``n/S + k·S`` (1: plain top-k).

    Measured (CPU, k=128): pruning pays from n ~ 2048 (S=4), 1.8x faster at n=8192 (S=8).
    """
    s = int(math.sqrt(n / k))
    return s if s >= 3 else 1


def _row_topk(scores: torch.Tensor, k: int, s: int):
    """Exact row-wise top-k (unsorted) of ``scores [..., n]`` with ``n % s == 0`` (``s=1``: plain top-k).

    Columns are split into ``G = n/s`` strided groups ``{g, g+G, ...}``. If a
    group's maximum is not among the k largest maxima, k entries beat all of
    that group, so the top-k lies in the k best groups: ``k·s`` candidates.
    """
    if s == 1:
        return scores.topk(k, dim=-1, sorted=False)
    grouped = scores.unflatten(-1, (s, -1))  # [..., s, G]: column j = i·G + g
    groups = grouped.shape[-1]
    best = grouped.amax(dim=-2).topk(k, dim=-1, sorted=False).indices  # [..., k]
    # The k best groups' members, gathered through an expanded (not materialised) index.
    cand = grouped.gather(-1, best.unsqueeze(-2).expand(*best.shape[:-1], s, k))
    values, pos = cand.flatten(-2).topk(k, dim=-1, sorted=False)
    return values, torch.div(pos, k, rounding_mode="floor") * groups + best.gather(-1, pos % k)


def _activate(top: torch.Tensor, relu: bool, safe: bool = False) -> torch.Tensor:
    # Masked entries hold -inf: both activations give them weight exactly 0. Without
    # padding every row has an allowed key; with it a row may be all -inf: ``safe``
    # softmax gives it zeros (as ``topk``), not NaN.
    if relu:
        return torch.relu(top)
    return safe_softmax(top) if safe else torch.softmax(top, dim=-1)


def _tiles(lq, lk, kk, causal, chunk_size):
    """Row tiles ``(r0, r1, n, s, width)``: ``n`` keys visible to the tile, width padded to ``s``."""
    rows = max(1, min(chunk_size, ROW_TILE))
    for r0 in range(0, lq, rows):
        r1 = min(r0 + rows, lq)
        # At least kk columns so that each row has kk entries (extra ones masked).
        n = min(r1, lk) if causal else lk
        s = _segments(max(n, kk), kk)
        yield r0, r1, n, s, -(-max(n, kk) // s) * s


def _select(q3, k3, causal, kk, chunk_size, pad=None):
    """Top-``kk`` scores of every query row and their global key indices (``h·Lk + j``).

    ``pad``: bool ``[bh, 1, Lk]``, True = padding key (masked like a future key).
    """
    bh, lq, _ = q3.shape
    lk = k3.shape[1]
    device = q3.device
    index_dtype = torch.int32 if bh * lk < 2**31 else torch.int64
    top = q3.new_empty(bh, lq, kk)
    idx = torch.empty(bh, lq, kk, dtype=index_dtype, device=device)
    base = (torch.arange(bh, device=device) * lk).view(bh, 1, 1)
    tiles = list(_tiles(lq, lk, kk, causal, chunk_size))
    widest = max((t[4] for t in tiles), default=0)
    keys = k3
    if widest > lk:  # zero key rows as padding; their scores are masked below
        keys = torch.cat([k3, k3.new_zeros(bh, widest - lk, k3.shape[2])], dim=1)
    # One score buffer for all tiles: no fresh pages (and page faults) per tile.
    buffer = q3.new_empty(bh * max(((r1 - r0) * w for r0, r1, _, _, w in tiles), default=0))
    masks = {}  # the causal/padding mask of a tile depends only on its offsets relative to ``lo``
    for r0, r1, n, s, width in tiles:
        scores = buffer[: bh * (r1 - r0) * width].view(bh, r1 - r0, width)
        torch.matmul(q3[:, r0:r1], keys[:, :width].transpose(1, 2), out=scores)
        # Columns some row of the tile must not see: future keys and padding.
        lo = min(r0, n) if causal else n
        if lo < width:
            key = (r0 - lo, r1 - lo, n - lo, width - lo)
            if key not in masks:
                cols = torch.arange(width - lo, device=device)
                masked = cols >= n - lo
                if causal:
                    masked = masked | (cols > torch.arange(r0 - lo, r1 - lo, device=device).unsqueeze(1))
                masks[key] = masked
            scores[..., lo:].masked_fill_(masks[key], float("-inf"))
        if pad is not None:  # columns >= n are masked above already
            scores[..., :n].masked_fill_(pad[..., :n], float("-inf"))
        values, where = _row_topk(scores, kk, s)
        top[:, r0:r1] = values
        if width > lk:  # padding columns are only picked with -inf (zero weight): keep them in range
            where.clamp_(max=lk - 1)
        torch.add(where, base, out=idx[:, r0:r1])
    return top, idx


def _backward_group(dout_g, q_g, k2, v2, top, idx, relu, keys, grads, safe=False, keep=None, dropout=0.0):
    """Gradients of one group of heads (``dout_g, q_g``: its rows; ``k2, v2``: all heads' keys).

    ``idx`` holds global key rows ``h·Lk + j``; ``keys`` is the group's range of them.
    ``keep``: the forward's dropout masks of the group (``None`` without dropout).
    """
    dq, dk, dv = grads
    rows, kk = dout_g.shape[0], top.shape[-1]
    device, index_dtype = idx.device, idx.dtype
    flat = idx.reshape(-1)
    weights = _activate(top, relu, safe).view(rows, kk)
    if dropout:  # the forward's masks, applied with the same rounding (as ``topk``)
        keep = keep.reshape(rows, kk)
        dropped = weights * keep / (1.0 - dropout)
    else:
        dropped = weights
    offsets = torch.arange(0, rows * kk, kk, dtype=index_dtype, device=device)
    bag_of = torch.arange(rows, dtype=index_dtype, device=device).repeat_interleave(kk)
    # dW[r, t] = dout[r] · V[idx[r, t]]: the per-sample-weights gradient of out = bag(W, V).
    ds = torch.ops.aten._embedding_bag_per_sample_weights_backward(
        dout_g, v2, flat, offsets, bag_of, 0, -1
    ).view(rows, kk)
    del bag_of, offsets
    if dropout:  # ds was the gradient w.r.t. the dropped weights
        ds = ds * keep / (1.0 - dropout)
    if relu:
        ds.masked_fill_(top.view(rows, kk) <= 0, 0.0)
    else:
        ds.sub_((ds * weights).sum(-1, keepdim=True)).mul_(weights)
    if dq is not None:
        dq.copy_(F.embedding_bag(flat.view(rows, kk), k2, per_sample_weights=ds, mode="sum"))
    if dk is None and dv is None:
        return
    # The transposed selection: entries sorted by key, one bag of query rows per key
    # (empty bags give zero rows); one sort serves both dV and dK (a 1-D sort: the
    # batched per-head sort measured 1.7x slower).
    sorted_keys, order = torch.sort(flat)
    starts = torch.searchsorted(sorted_keys, keys)
    del sorted_keys
    query_of = order // kk
    # index_select: ~4x faster than advanced indexing for these permutations.
    if dv is not None:
        w_sorted = dropped.reshape(-1).index_select(0, order)
        dv.copy_(F.embedding_bag(query_of, dout_g, starts, per_sample_weights=w_sorted, mode="sum"))
    if dk is not None:
        ds_sorted = ds.view(-1).index_select(0, order)
        dk.copy_(F.embedding_bag(query_of, q_g, starts, per_sample_weights=ds_sorted, mode="sum"))


class _TopkFast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, relu, topk, chunk_size, key_padding_mask, dropout):
        lead, lq, lk, dv = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
        kk = min(topk, lk)
        q3, k3 = q.reshape(-1, lq, q.shape[-1]), k.reshape(-1, lk, k.shape[-1])
        bh = q3.shape[0]
        pad = None
        if key_padding_mask is not None:  # [B, Lk] -> one row per (batch, head, ...): [bh, 1, Lk]
            shape = (lead[0],) + (1,) * (len(lead) - 1) + (lk,)
            pad = key_padding_mask.view(shape).expand(*lead, lk).reshape(bh, 1, lk)
        top, idx = _select(q3, k3, causal, kk, chunk_size, pad)
        del pad
        weights = _activate(top, relu, key_padding_mask is not None)
        keep = None
        if dropout:
            # Drawn per chunk of ``chunk_size`` query rows, one [bh, C, k] draw each: the same
            # draws, in the same order, as ``topk`` (whose k slots are ordered differently).
            keep = torch.empty(bh, lq, kk, dtype=torch.bool, device=q.device)
            for s in range(0, lq, chunk_size):
                e = min(s + chunk_size, lq)
                torch.ge(torch.rand(bh, e - s, kk, dtype=weights.dtype, device=q.device), dropout, out=keep[:, s:e])
            weights = weights * keep / (1.0 - dropout)
        out = F.embedding_bag(idx.view(-1, kk), v.reshape(-1, dv), per_sample_weights=weights.view(-1, kk), mode="sum")
        ctx.save_for_backward(q, k, v, top, idx, keep)
        ctx.relu = relu
        ctx.safe = key_padding_mask is not None
        ctx.dropout = dropout
        return out.view(*lead, lq, dv)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, top, idx, keep = ctx.saved_tensors
        bh, lq, kk = top.shape
        lk = k.shape[-2]
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dout2 = dout.reshape(bh * lq, dout.shape[-1]).contiguous()
        q2 = q.reshape(bh * lq, q.shape[-1]).contiguous()
        k2 = k.reshape(bh * lk, k.shape[-1]).contiguous()
        v2 = v.reshape(bh * lk, v.shape[-1]).contiguous()
        dq = torch.empty_like(q2) if need_q else None
        dk = torch.empty_like(k2) if need_k else None
        dv = torch.empty_like(v2) if need_v else None
        heads = max(1, min(bh, BACKWARD_ENTRIES // max(1, lq * kk)))
        key_ids = torch.arange(bh * lk, dtype=idx.dtype, device=idx.device)
        for h0 in range(0, bh, heads):
            h1 = min(h0 + heads, bh)
            qs, ks = slice(h0 * lq, h1 * lq), slice(h0 * lk, h1 * lk)
            _backward_group(
                dout2[qs], q2[qs], k2, v2, top[h0:h1], idx[h0:h1], ctx.relu, key_ids[ks],
                tuple(None if g is None else g[r] for g, r in ((dq, qs), (dk, ks), (dv, ks))),
                ctx.safe, None if keep is None else keep[h0:h1], ctx.dropout,
            )
        return (
            dq.view(q.shape) if need_q else None,
            dk.view(k.shape) if need_k else None,
            dv.view(v.shape) if need_v else None,
            None, None, None, None, None, None,
        )


def topk_fast_attention(q, k, v, *, causal=False, activation="softmax", topk=128, chunk_size=1024,
                        key_padding_mask=None, dropout=0.0):
    """``activation(top-k(q kᵀ)) v``: the same result as ``topk``, computed sparsely.

    Rows with fewer than ``topk`` allowed keys give the masked keys zero weight;
    ``key_padding_mask`` (bool ``[B, Lk]``, True = padding) masks keys, and a row
    with no allowed key gives zeros. ``dropout`` drops attention weights with masks
    drawn per chunk in forward and reused by backward (as ``topk``).
    """
    check_activation(activation)
    check_qkv(q, k, v)
    check_topk_args(q, k, topk, chunk_size, dropout, key_padding_mask)
    return _TopkFast.apply(q, k, v, bool(causal), activation == "relu", int(topk), int(chunk_size),
                           key_padding_mask, float(dropout))


TOPK_FAST = register(
    Implementation(
        name="topk_fast",
        fn=topk_fast_attention,
        description="top-k attention with causal key skipping, pruned top-k and k-sparse products",
        options=TOPK_OPTIONS,
        label="Top-k fast (size={chunk_size}, topk={topk})",
        # Same results as ``topk`` (which is not vanilla attention).
        exact=False,
        key_padding_mask=True,
        selection=topk_selection,
    )
)
