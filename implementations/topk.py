"""Top-k attention, the paper's algorithm (§2.2 pseudo-code) with query chunking.

Per chunk of ``C`` queries: dense dots ``[C, Lk]``, row-wise top-k, activation
on the ``k`` values only, scatter into a ``C x Lk`` matrix, product with V. Only
the top values and their indices are cached (besides q, k, v), so backward never
recomputes the dots and holds at most one ``C x Lk`` matrix at a time.

Masked keys (causal, padding) get ``-inf`` before the top-k: a row with fewer
than ``k`` allowed keys selects some masked ones, which then get zero weight.

Dropout on the attention weights draws a fresh mask per chunk and caches it
(``Lq x k`` bools), so backward uses exactly the forward's masks (the paper's
code replays one RNG state for every chunk, which gives wrong gradients).
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from implementations.masking import (
    batched_addmm_t_, check_activation, check_qkv, check_topk_args, chunk_mask, safe_softmax, safe_softmax_,
)
from implementations.registry import Implementation, register
from implementations.selection import topk_selection


def activate(top_dots, activation):
    """The activation on the ``[C, k]`` top values (masked ones are -inf and get 0)."""
    return safe_softmax(top_dots) if activation == "softmax" else torch.relu(top_dots)


def activation_backward(top_dots, top_actv, d_top_actv, activation):
    """Gradient w.r.t. the top values, from the recomputed activation (paper line 18-19)."""
    if activation == "softmax":
        return top_actv * (d_top_actv - (d_top_actv * top_actv).sum(dim=-1, keepdim=True))
    return d_top_actv * (top_dots > 0)


class DenseOps:
    """The four big products of the pseudo-code through a dense ``C x Lk`` matrix."""

    @staticmethod
    def matrix(values, indices, n_keys, buffer=None):
        """``matrix(top_actv, top_indices)``: scatter ``[.., C, k]`` into ``[.., C, Lk]``.

        ``buffer``: a dead ``[.., C, Lk]`` tensor whose storage is reused (no new allocation).
        """
        if buffer is None:
            buffer = values.new_zeros(*values.shape[:-1], n_keys)
        else:
            buffer.zero_()
        return buffer.scatter_(-1, indices, values)

    @staticmethod
    def mm(mat, x):
        return mat @ x

    @staticmethod
    def addmm_t_(acc, mat, y):
        batched_addmm_t_(acc, mat, y)

    @staticmethod
    def sampled_mm(a, b, indices):
        """``(a bᵀ)`` at ``indices`` only; the dense product lives just long enough to gather."""
        return (a @ b.transpose(-2, -1)).gather(-1, indices)


class TopkFunction(torch.autograd.Function):
    """``ops`` does the big products: :class:`DenseOps` here, torch.sparse in ``topk_sparse``."""

    @staticmethod
    def forward(ctx, q, k, v, ops, causal, activation, topk, chunk_size, key_padding_mask, dropout):
        lq, lk = q.shape[-2], k.shape[-2]
        # Every chunk multiplies with all of k and v: a strided view (heads split by the
        # layer) would be copied by each matmul, so copy once; the copy is what backward keeps.
        k, v = k.contiguous(), v.contiguous()
        kk = min(topk, lk)
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        top_vals = q.new_empty(*q.shape[:-1], kk)
        top_idx = torch.empty(*q.shape[:-1], kk, dtype=torch.long, device=q.device)
        keep = torch.empty(*q.shape[:-1], kk, dtype=torch.bool, device=q.device) if dropout else None
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            dots = q[..., s:e, :] @ k.transpose(-2, -1)                       # [C, Lk]
            mask = chunk_mask(s, e - s, lk, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
            if mask is not None:
                dots.masked_fill_(mask, float("-inf"))
            del mask
            top_dots, top_indices = dots.topk(kk, dim=-1, sorted=False)        # [C, k]
            top_actv = activate(top_dots, activation)
            if dropout:
                chunk_keep = torch.rand_like(top_actv) >= dropout
                keep[..., s:e, :] = chunk_keep
                top_actv = top_actv * chunk_keep / (1.0 - dropout)
            # The dots are dead: reuse their storage for the scattered activations.
            actv = ops.matrix(top_actv, top_indices, lk, buffer=dots)
            del dots
            out[..., s:e, :] = ops.mm(actv, v)                                 # [C, d]
            del actv
            top_vals[..., s:e, :] = top_dots
            top_idx[..., s:e, :] = top_indices
        ctx.save_for_backward(q, k, v, top_vals, top_idx, keep)
        ctx.options = (ops, activation, chunk_size, dropout)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, top_vals, top_idx, keep = ctx.saved_tensors
        ops, activation, chunk_size, dropout = ctx.options
        lq, lk = q.shape[-2], k.shape[-2]
        dq = q.new_empty(q.shape)
        dk = k.new_zeros(k.shape)
        dv = v.new_zeros(v.shape)
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            qc, doc = q[..., s:e, :], d_out[..., s:e, :]
            top_dots, top_indices = top_vals[..., s:e, :], top_idx[..., s:e, :]
            d_top_actv = ops.sampled_mm(doc, v, top_indices)                   # [C, k]
            top_actv = activate(top_dots, activation)                          # recomputed, not cached
            if dropout:  # the forward's masks, applied with the same rounding
                chunk_keep = keep[..., s:e, :]
                dropped = top_actv * chunk_keep / (1.0 - dropout)
                d_top_actv = d_top_actv * chunk_keep / (1.0 - dropout)
            else:
                dropped = top_actv
            d_top_dots = activation_backward(top_dots, top_actv, d_top_actv, activation)
            actv = ops.matrix(dropped, top_indices, lk)
            ops.addmm_t_(dv, actv, doc)                                        # d_V += actvᵀ d_out
            # One C x Lk matrix at a time: actv's buffer becomes d_dots.
            d_dots = ops.matrix(d_top_dots, top_indices, lk, buffer=actv)
            del actv
            dq[..., s:e, :] = ops.mm(d_dots, k)                                # d_Q = d_dots K
            ops.addmm_t_(dk, d_dots, qc)                                       # d_K += d_dotsᵀ Q
            del d_dots
        return dq, dk, dv, None, None, None, None, None, None, None


def make_topk(ops):
    """The public attention function around :class:`TopkFunction` with the products of ``ops``."""

    def attention(q, k, v, *, causal=False, activation="softmax", topk=128, chunk_size=1024,
                  key_padding_mask=None, dropout=0.0):
        check_activation(activation)
        check_qkv(q, k, v)
        check_topk_args(q, k, topk, chunk_size, dropout, key_padding_mask)
        return TopkFunction.apply(q, k, v, ops, causal, activation, int(topk), int(chunk_size),
                                  key_padding_mask, float(dropout))

    return attention


# The options of every top-k variant (topk_sparse and topk_fast take exactly these).
TOPK_OPTIONS = MappingProxyType({"topk": 128, "chunk_size": 1024, "key_padding_mask": None, "dropout": 0.0})

topk_attention = make_topk(DenseOps)
topk_attention.__doc__ = "Top-k attention: each query keeps its ``topk`` largest scores (paper §2.2)."

TOPK = register(
    Implementation(
        name="topk",
        fn=topk_attention,
        description="top-k attention (paper §2.2): chunked dense dots, row-wise top-k, caches top values + indices",
        options=TOPK_OPTIONS,
        label="Top-k (size={chunk_size}, topk={topk})",
        exact=False,
        key_padding_mask=True,
        selection=topk_selection,
    )
)
