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
  paper), and the backward runs per head so its temporaries stay cache-sized.

Everything is shape-static (no ``.item()``, ``nonzero`` or value-dependent
branches), so it runs under ``FakeTensorMode`` for the predict backend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from implementations.masking import check_activation
from implementations.registry import Implementation, register

# Query rows per score tile: small enough for a tile of one head to stay in
# cache (256 x 8192 fp32 = 8 MiB) and to waste little work on the causal
# diagonal; never more than the ``chunk_size`` option, which bounds memory.
ROW_TILE = 256


def _segments(n: int, k: int) -> int:
    """Group size S minimising the pruned top-k's work ``n/S + k·S`` (1: plain top-k)."""
    s = int(math.sqrt(n / k))
    return s if s >= 2 else 1


def _row_topk(scores: torch.Tensor, k: int, s: int):
    """Exact row-wise top-k (unsorted) of ``scores [..., n]`` with ``n % s == 0``.

    Columns are split into ``G = n/s`` strided groups ``{g, g+G, ...}``. If a
    group's maximum is not among the k largest maxima, k entries beat all of
    that group, so the top-k lies in the k best groups: ``k·s`` candidates.
    """
    if s == 1:
        return scores.topk(k, dim=-1, sorted=False)
    n = scores.shape[-1]
    groups = n // s
    group_max = scores.unflatten(-1, (s, groups)).amax(dim=-2)
    best = group_max.topk(k, dim=-1, sorted=False).indices
    steps = torch.arange(0, n, groups, device=scores.device)
    cand = (best.unsqueeze(-1) + steps).flatten(-2)
    values, pos = scores.gather(-1, cand).topk(k, dim=-1, sorted=False)
    return values, cand.gather(-1, pos)


def _activate(top: torch.Tensor, relu: bool) -> torch.Tensor:
    # Masked entries hold -inf: both activations give them weight exactly 0.
    return torch.relu(top) if relu else torch.softmax(top, dim=-1)


def _select(q3, k3, causal, kk, chunk_size):
    """Top-``kk`` scores of every query row and their global key indices (``h·Lk + j``)."""
    bh, lq, _ = q3.shape
    lk = k3.shape[1]
    device = q3.device
    index_dtype = torch.int32 if bh * lk < 2**31 else torch.int64
    top = q3.new_empty(bh, lq, kk)
    idx = torch.empty(bh, lq, kk, dtype=index_dtype, device=device)
    base = (torch.arange(bh, device=device) * lk).view(bh, 1, 1)
    rows = max(1, min(chunk_size, ROW_TILE))
    keys = k3
    for r0 in range(0, lq, rows):
        r1 = min(r0 + rows, lq)
        # Keys any row of the tile may attend; at least kk columns so each row has kk entries.
        n = min(r1, lk) if causal else lk
        s = _segments(max(n, kk), kk)
        width = -(-max(n, kk) // s) * s
        if width > keys.shape[1]:  # zero key rows to pad; their scores are masked below
            keys = torch.cat([k3, k3.new_zeros(bh, width - lk, k3.shape[2])], dim=1)
        # Columns that some row of the tile must not see: future keys and padding.
        lo = min(r0, n) if causal else n
        masked = None
        if lo < width:
            cols = torch.arange(lo, width, device=device)
            masked = cols >= n
            if causal:
                masked = masked | (cols > torch.arange(r0, r1, device=device).unsqueeze(1))
        for h0 in range(0, bh):
            h1 = h0 + 1
            scores = torch.matmul(q3[h0:h1, r0:r1], keys[h0:h1, :width].transpose(1, 2))
            if masked is not None:
                scores[..., lo:].masked_fill_(masked, float("-inf"))
            values, where = _row_topk(scores, kk, s)
            top[h0:h1, r0:r1] = values
            # Padding columns are only picked with -inf (zero weight); keep them in range.
            idx[h0:h1, r0:r1] = where.clamp_(max=lk - 1) + base[h0:h1]
    return top, idx


class _TopkFast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, relu, topk, chunk_size):
        b, h, lq, d = q.shape
        lk = k.shape[-2]
        kk = min(topk, lk)
        q3 = q.reshape(b * h, lq, d)
        k3 = k.reshape(b * h, lk, d)
        top, idx = _select(q3, k3, causal, kk, chunk_size)
        weights = _activate(top, relu)
        out = F.embedding_bag(
            idx.view(-1, kk), v.reshape(b * h * lk, d), per_sample_weights=weights.view(-1, kk), mode="sum"
        )
        ctx.save_for_backward(q, k, v, top, idx)
        ctx.relu = relu
        return out.view(b, h, lq, d)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, top, idx = ctx.saved_tensors
        b, h, lq, d = q.shape
        lk = k.shape[-2]
        bh, kk = b * h, top.shape[-1]
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dout3 = dout.reshape(bh, lq, d).contiguous()
        q3 = q.reshape(bh, lq, d).contiguous()
        k2 = k.reshape(bh * lk, d).contiguous()
        v2 = v.reshape(bh * lk, d).contiguous()
        dq = torch.empty_like(q3) if need_q else None
        dk = torch.empty(bh, lk, d, dtype=k.dtype, device=k.device) if need_k else None
        dv = torch.empty(bh, lk, d, dtype=v.dtype, device=v.device) if need_v else None
        device, index_dtype = q.device, idx.dtype
        nnz = lq * kk
        offsets = torch.arange(0, nnz, kk, dtype=index_dtype, device=device)
        bag_of = torch.arange(lq, dtype=index_dtype, device=device).repeat_interleave(kk)
        key_ids = torch.arange(lk, dtype=index_dtype, device=device)
        for i in range(bh):  # one head at a time: every temporary is O(Lq·k), cache-sized
            flat = idx[i].view(-1)
            weights = _activate(top[i], ctx.relu)
            # dW[r, t] = dout[r] · V[idx[r, t]] (the per-sample-weights gradient of out = bag(W, V)).
            dw = torch.ops.aten._embedding_bag_per_sample_weights_backward(
                dout3[i], v2, flat, offsets, bag_of, 0, -1
            ).view(lq, kk)
            if ctx.relu:
                ds = dw.masked_fill_(top[i] <= 0, 0.0)
            else:
                ds = dw.sub_((dw * weights).sum(-1, keepdim=True)).mul_(weights)
            if need_q:
                dq[i] = F.embedding_bag(idx[i], k2, per_sample_weights=ds, mode="sum")
            if need_k or need_v:
                # Transposed selection: entries sorted by key, one bag per key.
                keys, order = torch.sort(flat - i * lk)
                starts = torch.searchsorted(keys, key_ids)
                query_of = order // kk
                if need_v:
                    dv[i] = F.embedding_bag(
                        query_of, dout3[i], starts, per_sample_weights=weights.view(-1)[order], mode="sum"
                    )
                if need_k:
                    dk[i] = F.embedding_bag(
                        query_of, q3[i], starts, per_sample_weights=ds.view(-1)[order], mode="sum"
                    )
        shape = (b, h, -1, d)
        return (
            dq.view(shape) if need_q else None,
            dk.view(shape) if need_k else None,
            dv.view(shape) if need_v else None,
            None, None, None, None,
        )


def topk_fast_attention(q, k, v, *, causal=False, activation="softmax", topk=128, chunk_size=1024):
    """``activation(top-k(q kᵀ)) v``: the same result as ``topk``, computed sparsely.

    Rows with fewer than ``topk`` allowed keys give the masked keys zero weight.
    """
    check_activation(activation)
    if topk < 1 or chunk_size < 1:
        raise ValueError(f"topk and chunk_size must be positive, got {topk} and {chunk_size}")
    return _TopkFast.apply(q, k, v, causal, activation == "relu", topk, chunk_size)


TOPK_FAST = register(
    Implementation(
        name="topk_fast",
        fn=topk_fast_attention,
        description="top-k attention with causal key skipping, pruned top-k and k-sparse products",
        options={"topk": 128, "chunk_size": 1024},
        label="Top-k fast (size={chunk_size}, topk={topk})",
        # Same results as ``topk`` (which is not vanilla attention).
        exact=False,
    )
)
