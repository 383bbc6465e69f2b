"""Query chunking with input checkpointing (paper §2.2).

Forward processes ``chunk_size`` queries at a time and caches only ``q, k, v``;
backward recomputes each chunk's weights, so at most one chunk's ``C x Lk``
matrices are alive in either pass. The causal mask is built per chunk from its
offset (never ``Lq x Lk``).

- Causal: bottom-right aligned (query ``i`` sees keys ``j <= Lk - Lq + i``); a row
  with no allowed key gives zeros and zero gradients (NaN-free softmax).
- Grouped-query heads (native): a chunk holds ``chunk_size`` query positions of
  all heads, the G heads of a group as rows of their K/V head (``[*, Hkv, G*C, d]``,
  a copy of the chunk's queries), so every product meets K/V as they are and the
  chunk matrices have the size they have without grouping (``Hq x C x Lk``).
- Half precision: products in the input dtype (float32 accumulation in the GEMM),
  the softmax and its backward (``rowsum(dW * W)``) in float32; the weights and the
  score gradients are rounded to the input dtype for the products with V, ``dout``,
  K and Q.
"""

from __future__ import annotations

import torch

from topk_bench.attention.registry import Implementation, register
from topk_bench.attention.shared.masking import (
    allowed_keys,
    batched_addmm_t_,
    by_query,
    check_activation,
    check_qkv,
    from_padding,
    group_rows,
    put_group_rows,
    safe_softmax_,
    upcast,
)


def chunk_weights(qc, k, start, lq, *, causal, activation, real_keys, groups=1):
    """``activation(qc kᵀ + mask)`` for the query chunk starting at row ``start`` of ``lq``, built in place.

    ``qc``: the chunk as :func:`~topk_bench.attention.shared.masking.group_rows` lays it out;
    ``real_keys``: :func:`~topk_bench.attention.shared.masking.from_padding`. Float32 for half inputs.
    """
    scores = upcast(qc @ k.transpose(-2, -1))
    grouped = by_query(scores, groups)
    allowed = allowed_keys(
        start,
        start + grouped.shape[-2],
        lq,
        k.shape[-2],
        causal=causal,
        real_keys=real_keys,
        device=qc.device,
        ndim=grouped.dim(),
    )
    hidden = None if allowed is None else allowed.logical_not_()  # for masked_fill_ (in place: no copy)
    if activation == "softmax":
        if hidden is not None:
            grouped.masked_fill_(hidden, float("-inf"))
        return safe_softmax_(scores)
    scores.relu_()
    if hidden is not None:
        grouped.masked_fill_(hidden, 0.0)
    return scores


class QChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, activation, chunk_size, real_keys, groups):
        lq = q.shape[-2]
        # Every chunk multiplies with all of k and v: a strided view (heads split by the
        # layer) would be copied by each matmul, so copy once; the copy is what backward keeps.
        k, v = k.contiguous(), v.contiguous()
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            w = chunk_weights(
                group_rows(q, groups, s, e),
                k,
                s,
                lq,
                causal=causal,
                activation=activation,
                real_keys=real_keys,
                groups=groups,
            )
            put_group_rows(out, groups, s, e, w.to(v.dtype) @ v)
            del w
        ctx.save_for_backward(q, k, v, real_keys)
        ctx.options = (causal, activation, chunk_size, groups)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, real_keys = ctx.saved_tensors
        causal, activation, chunk_size, groups = ctx.options
        lq = q.shape[-2]
        # Fresh contiguous buffers: accumulated in place with baddbmm_.
        dq = q.new_empty(q.shape)
        dk = k.new_zeros(k.shape)
        dv = v.new_zeros(v.shape)
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            qc, doc = group_rows(q, groups, s, e), group_rows(d_out, groups, s, e)
            w = chunk_weights(qc, k, s, lq, causal=causal, activation=activation, real_keys=real_keys, groups=groups)
            w_in = w.to(v.dtype)  # the weights as forward multiplied them (no copy in float32)
            batched_addmm_t_(dv, w_in, doc)
            dw = upcast(doc @ v.transpose(-2, -1))
            if activation == "softmax":
                # d scores = w * (dw - rowsum(dw * w)); rowsum(dw * w) = rowsum(d_out * out) (C x d, cheap).
                delta = (upcast(doc) * upcast(w_in @ v)).sum(dim=-1, keepdim=True)
                ds = dw.sub_(delta).mul_(w)
            else:
                ds = dw.mul_(w > 0)  # relu'(x) = [x > 0]; masked entries have w = 0
            del w, w_in, dw
            ds = ds.to(k.dtype)
            put_group_rows(dq, groups, s, e, ds @ k)
            batched_addmm_t_(dk, ds, qc)
            del ds
        return dq, dk, dv, None, None, None, None, None


def qchunk_attention(q, k, v, *, causal=False, activation="softmax", chunk_size=1024, key_padding_mask=None):
    """Exact attention, ``chunk_size`` queries at a time, caching only the inputs."""
    check_activation(activation)
    groups = check_qkv(q, k, v)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return QChunkFunction.apply(q, k, v, causal, activation, int(chunk_size), from_padding(key_padding_mask), groups)


QCHUNK = register(
    Implementation(
        name="qchunk",
        fn=qchunk_attention,
        description="query chunking + input checkpointing: saves only q, k, v; backward recomputes per chunk",
        options={"chunk_size": 1024, "key_padding_mask": None},
        label="Q-chunking (size={chunk_size})",
        key_padding_mask=True,
        gqa="native",
    )
)
