"""Query chunking with input checkpointing (paper §2.2).

Forward processes ``chunk_size`` queries at a time and caches only ``q, k, v``;
backward recomputes each chunk's weights, so at most one chunk's ``C x Lk``
matrices are alive in either pass. The causal mask is built per chunk from its
offset (never ``Lq x Lk``).
"""

from __future__ import annotations

import torch

from implementations.masking import (
    batched_addmm_t_, check_activation, check_qkv, chunk_mask, safe_softmax_,
)
from implementations.registry import Implementation, register


def chunk_weights(qc, k, start, *, causal, activation, key_padding_mask):
    """``activation(qc kᵀ + mask)`` for the query chunk starting at ``start``, built in place."""
    scores = qc @ k.transpose(-2, -1)
    mask = chunk_mask(start, qc.shape[-2], k.shape[-2], causal=causal,
                      key_padding_mask=key_padding_mask, device=qc.device)
    if activation == "softmax":
        if mask is not None:
            scores.masked_fill_(mask, float("-inf"))
        return safe_softmax_(scores)
    scores.relu_()
    if mask is not None:
        scores.masked_fill_(mask, 0.0)
    return scores


class QChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, activation, chunk_size, key_padding_mask):
        lq = q.shape[-2]
        # Every chunk multiplies with all of k and v: a strided view (heads split by the
        # layer) would be copied by each matmul, so copy once; the copy is what backward keeps.
        k, v = k.contiguous(), v.contiguous()
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            w = chunk_weights(q[..., s:e, :], k, s, causal=causal, activation=activation,
                              key_padding_mask=key_padding_mask)
            out[..., s:e, :] = w @ v
            del w
        ctx.save_for_backward(q, k, v, key_padding_mask)
        ctx.options = (causal, activation, chunk_size)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, key_padding_mask = ctx.saved_tensors
        causal, activation, chunk_size = ctx.options
        lq = q.shape[-2]
        # Fresh contiguous buffers: accumulated in place with baddbmm_.
        dq = q.new_empty(q.shape)
        dk = k.new_zeros(k.shape)
        dv = v.new_zeros(v.shape)
        for s in range(0, lq, chunk_size):
            e = min(s + chunk_size, lq)
            qc, doc = q[..., s:e, :], d_out[..., s:e, :]
            w = chunk_weights(qc, k, s, causal=causal, activation=activation,
                              key_padding_mask=key_padding_mask)
            batched_addmm_t_(dv, w, doc)
            dw = doc @ v.transpose(-2, -1)
            if activation == "softmax":
                # d scores = w * (dw - rowsum(dw * w)); rowsum(dw * w) = rowsum(d_out * out) (C x d, cheap).
                delta = (doc * (w @ v)).sum(dim=-1, keepdim=True)
                ds = dw.sub_(delta).mul_(w)
            else:
                ds = dw.mul_(w > 0)  # relu'(x) = [x > 0]; masked entries have w = 0
            del w, dw
            dq[..., s:e, :] = ds @ k
            batched_addmm_t_(dk, ds, qc)
            del ds
        return dq, dk, dv, None, None, None, None


def qchunk_attention(q, k, v, *, causal=False, activation="softmax", chunk_size=1024, key_padding_mask=None):
    """Exact attention, ``chunk_size`` queries at a time, caching only the inputs."""
    check_activation(activation)
    check_qkv(q, k, v)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return QChunkFunction.apply(q, k, v, causal, activation, int(chunk_size), key_padding_mask)


QCHUNK = register(
    Implementation(
        name="qchunk",
        fn=qchunk_attention,
        description="query chunking + input checkpointing: saves only q, k, v; backward recomputes per chunk",
        options={"chunk_size": 1024, "key_padding_mask": None},
        label="Q-chunking (size={chunk_size})",
        key_padding_mask=True,
    )
)
