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

- Causal: bottom-right aligned (query ``i`` sees keys ``j <= Lk - Lq + i``); a row
  with no allowed key selects only masked keys and gives zeros.
- Grouped-query heads (native): a chunk holds ``chunk_size`` query positions of all
  heads, the G heads of a group as rows of their K/V head (``[*, Hkv, G*C, d]``), so
  the products meet K/V as they are; selections are stored per query head.
- Half precision: the dots that select keys are computed from float32 copies of the
  chunk's queries and of K (one per call), so the same keys win as with float32
  inputs; the top values (cached) and the softmax are float32; the scattered weights
  and their gradients are rounded to the input dtype for the products with V and K.
- Decoding (``topk`` only; no gradient, no dropout, at most ``min(64, chunk_size)``
  query positions): :mod:`topk_bench.attention.shared.decode` computes the step's scores (half
  inputs: float32 from one cache-sized key tile at a time, not a float32 copy of K),
  takes the same row-wise top-k and activation, and sums the ``k`` selected V rows
  instead of scattering into ``C x Lk`` and multiplying with all of V.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.decode import decode_output, decode_scores, use_decode_path
from topk_bench.attention.shared.masking import (
    HALF,
    allowed_keys,
    batched_addmm_t_,
    by_query,
    check_activation,
    check_qkv,
    check_topk_args,
    from_padding,
    group_rows,
    put_group_rows,
    safe_softmax_,
    stat_dtype,
    upcast,
)
from topk_bench.attention.shared.selection import topk_budget, topk_selection


def activate(top_dots, activation):
    """The activation on the ``[C, k]`` top values (masked ones are -inf and get 0)."""
    return safe_softmax_(top_dots.clone()) if activation == "softmax" else torch.relu(top_dots)


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
    def forward(ctx, q, k, v, ops, causal, activation, topk, chunk_size, real_keys, dropout, groups):
        """``real_keys``: bool ``[B, Lk]``, True = a real key (the ``key_padding_mask`` option converted), or None."""
        lq, lk = q.shape[-2], k.shape[-2]
        # Every chunk multiplies with all of k and v: a strided view (heads split by the
        # layer) would be copied by each matmul, so copy once; the copy is what backward keeps.
        k, v = k.contiguous(), v.contiguous()
        # Selection dots in float32 for half inputs: rounding them would change which keys win.
        k_dots = upcast(k)
        kk = min(topk, lk)
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        top_vals = q.new_empty(*q.shape[:-1], kk, dtype=stat_dtype(q.dtype))
        top_idx = torch.empty(*q.shape[:-1], kk, dtype=torch.long, device=q.device)
        keep = torch.empty(*q.shape[:-1], kk, dtype=torch.bool, device=q.device) if dropout else None
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            dots = upcast(group_rows(q, groups, s, e)) @ k_dots.transpose(-2, -1)  # [C, Lk] (G*C rows)
            grouped = by_query(dots, groups)
            allowed = allowed_keys(
                s, e, lq, lk, causal=causal, real_keys=real_keys, device=q.device, ndim=grouped.dim()
            )
            if allowed is not None:
                grouped.masked_fill_(allowed.logical_not_(), float("-inf"))
            del allowed, grouped
            top_dots, top_indices = dots.topk(kk, dim=-1, sorted=False)  # [C, k]
            top_actv = activate(top_dots, activation)
            if dropout:
                chunk_keep = torch.rand_like(top_actv) >= dropout
                put_group_rows(keep, groups, s, e, chunk_keep)
                top_actv = top_actv * chunk_keep / (1.0 - dropout)
            # The dots are dead: reuse their storage for the scattered activations
            # (not for half inputs, whose activations are scattered in the input dtype).
            actv = ops.matrix(top_actv.to(v.dtype), top_indices, lk, buffer=dots if dots.dtype == v.dtype else None)
            del dots
            put_group_rows(out, groups, s, e, ops.mm(actv, v))  # [C, d]
            del actv
            put_group_rows(top_vals, groups, s, e, top_dots)
            put_group_rows(top_idx, groups, s, e, top_indices)
        del k_dots
        ctx.save_for_backward(q, k, v, top_vals, top_idx, keep)
        ctx.options = (ops, activation, chunk_size, dropout, groups)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, top_vals, top_idx, keep = ctx.saved_tensors
        ops, activation, chunk_size, dropout, groups = ctx.options
        lq, lk = q.shape[-2], k.shape[-2]
        dq = q.new_empty(q.shape)
        dk = k.new_zeros(k.shape)
        dv = v.new_zeros(v.shape)
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            qc, doc = group_rows(q, groups, s, e), group_rows(d_out, groups, s, e)
            top_dots, top_indices = group_rows(top_vals, groups, s, e), group_rows(top_idx, groups, s, e)
            d_top_actv = upcast(ops.sampled_mm(doc, v, top_indices))  # [C, k]
            top_actv = activate(top_dots, activation)  # recomputed, not cached
            if dropout:  # the forward's masks, applied with the same rounding
                chunk_keep = group_rows(keep, groups, s, e)
                dropped = top_actv * chunk_keep / (1.0 - dropout)
                d_top_actv = d_top_actv * chunk_keep / (1.0 - dropout)
            else:
                dropped = top_actv
            d_top_dots = activation_backward(top_dots, top_actv, d_top_actv, activation)
            actv = ops.matrix(dropped.to(v.dtype), top_indices, lk)
            ops.addmm_t_(dv, actv, doc)  # d_V += actvᵀ d_out
            # One C x Lk matrix at a time: actv's buffer becomes d_dots.
            d_dots = ops.matrix(d_top_dots.to(k.dtype), top_indices, lk, buffer=actv)
            del actv
            put_group_rows(dq, groups, s, e, ops.mm(d_dots, k))  # d_Q = d_dots K
            ops.addmm_t_(dk, d_dots, qc)  # d_K += d_dotsᵀ Q
            del d_dots
        return dq, dk, dv, None, None, None, None, None, None, None, None


def decode_topk(q, k, v, causal, activation, kk, real_keys, groups):
    """Forward only, few query rows (:mod:`topk_bench.attention.shared.decode`): the same selection and
    weights as :class:`TopkFunction`, without its ``C x Lk`` scatter and dense product with V."""
    scores = decode_scores(q, k, groups, causal=causal, real_keys=real_keys)
    top, where = scores.topk(kk, dim=-1, sorted=False)
    del scores
    return decode_output(activate(top, activation), where, q, v)


def make_topk(ops, decode=False):
    """The public attention function around :class:`TopkFunction` with the products of ``ops``.

    ``decode``: calls without gradients and with few query rows take :func:`decode_topk`.
    ``ops.half_in_float32``: half inputs are computed in float32 (output in their dtype).
    """

    def attention(
        q, k, v, *, causal=False, activation="softmax", topk=128, chunk_size=1024, key_padding_mask=None, dropout=0.0
    ):
        check_activation(activation)
        groups = check_qkv(q, k, v)
        check_topk_args(q, k, topk, chunk_size, dropout, key_padding_mask)
        if getattr(ops, "half_in_float32", False) and q.dtype in HALF:
            out = attention(
                upcast(q),
                upcast(k),
                upcast(v),
                causal=causal,
                activation=activation,
                topk=topk,
                chunk_size=chunk_size,
                key_padding_mask=key_padding_mask,
                dropout=dropout,
            )
            return out.to(q.dtype)
        real_keys = from_padding(key_padding_mask)
        if decode and use_decode_path(q, k, v, chunk_size, dropout):
            return decode_topk(q, k, v, causal, activation, min(int(topk), k.shape[-2]), real_keys, groups)
        return TopkFunction.apply(
            q, k, v, ops, causal, activation, int(topk), int(chunk_size), real_keys, float(dropout), groups
        )

    return attention


# The options of every top-k variant (topk_sparse and topk_fast take exactly these).
TOPK_OPTIONS = MappingProxyType({"topk": 128, "chunk_size": 1024, "key_padding_mask": None, "dropout": 0.0})

topk_attention = make_topk(DenseOps, decode=True)
topk_attention.__doc__ = "Top-k attention: each query keeps its ``topk`` largest scores (paper §2.2)."

TOPK = register(
    Implementation(
        name="topk",
        machine_choices=("half_products", "decode_tiles"),
        fn=topk_attention,
        description="top-k attention (paper §2.2): chunked dense dots, row-wise top-k, caches top values + indices",
        options=TOPK_OPTIONS,
        label="Top-k (size={chunk_size}, topk={topk})",
        exact=False,
        key_padding_mask=True,
        gqa="native",
        selection=topk_selection,
        budget=topk_budget,
    )
)
